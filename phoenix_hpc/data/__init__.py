"""phoenix_hpc.data"""
