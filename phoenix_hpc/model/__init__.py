"""phoenix_hpc.model"""
