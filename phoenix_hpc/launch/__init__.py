"""phoenix_hpc.launch"""
