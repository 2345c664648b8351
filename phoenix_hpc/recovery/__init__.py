"""phoenix_hpc.recovery"""
