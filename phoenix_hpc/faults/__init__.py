"""phoenix_hpc.faults"""
