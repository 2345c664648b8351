"""Reading a job config file: YAML -> :class:`JobConfig`, with every problem reported at once.

This module and :mod:`phoenix_hpc.profiles` are the only places that read configuration files (both through
:mod:`phoenix_hpc.validation`).
"""

from __future__ import annotations

from pathlib import Path

from phoenix_hpc.config.schema import JobConfig
from phoenix_hpc.validation import format_validation_error, parse_model, read_yaml  # noqa: F401 (re-export)


def load_job_config(path: str | Path) -> JobConfig:
    """Load and validate a job config file.

    A relative ``data.path`` (or ``data.blend`` path) and relative ``python_path`` entries are made absolute against the config
    file's folder, so the resolved config can be used from any working directory.

    Raises:
        ConfigError: unreadable file, bad YAML, unknown or missing fields, wrong types, broken relations.
    """
    p = Path(path)
    data = read_yaml(p, "config")
    cfg = parse_model(JobConfig, data, source=str(p))
    cfg = cfg.model_copy(update={"data": cfg.data.resolved(p.parent)})
    folders = [str((p.parent / f).resolve()) for f in cfg.python_path]
    return cfg.model_copy(update={"python_path": folders})
