"""Job configuration: schema and loading (the only place config files are read)."""

from phoenix_hpc.config.load import load_job_config
from phoenix_hpc.config.schema import JobConfig

__all__ = ["JobConfig", "load_job_config"]
