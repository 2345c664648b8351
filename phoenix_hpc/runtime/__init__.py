"""phoenix_hpc.runtime"""
