"""Benchmarks on the local Slurm cluster: per-step overhead, host memory, hot swap against
checkpoint-restart, and hot-swap scaling (``scripts/bench.sh``, ``phoenix bench``)."""
