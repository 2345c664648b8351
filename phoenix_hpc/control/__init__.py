"""phoenix_hpc.control"""
