"""phoenix_hpc.engines"""
