"""phoenix_hpc.cli"""
