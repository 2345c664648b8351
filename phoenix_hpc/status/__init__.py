"""phoenix_hpc.status: a job's status from its journal, run files and Slurm (read-only)."""
