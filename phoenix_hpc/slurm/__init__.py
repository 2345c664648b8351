"""phoenix_hpc.slurm"""
