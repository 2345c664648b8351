"""phoenix_hpc.config"""
