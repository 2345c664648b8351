"""phoenix_hpc: resilient large-model training on Slurm with per-step in-memory replication and hot swap.

The package has no import-time side effects: importing it configures no logging, opens no sockets and
reads no machine state.
"""

__version__ = "0.1.0"
