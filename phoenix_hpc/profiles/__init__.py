"""phoenix_hpc.profiles"""
