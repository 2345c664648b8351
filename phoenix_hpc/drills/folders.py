"""The folders of one run of a config that ``phoenix drill`` and ``phoenix demo`` submit more than once (the
fault-free reference, then the drill job or the node-loss run): every run writes only under its own run
directory, so no run continues from another's checkpoint and none writes into the user's folders.

The user's config may name absolute folders that every job of it shares: ``resilience.checkpoint.path`` (a
resubmitted job finds its checkpoints there, :mod:`phoenix_hpc.launch.persist`; ``phoenix config
from-megatron`` writes Megatron-LM's ``--save`` there), ``resilience.checkpoint.save_megatron`` and
``logging.tensorboard_dir``. Submitted unchanged, the second run would start from the reference's final
checkpoint (the job restores the newest complete checkpoint under its root at start-up; a drill would then
refuse every fault planned before that step, a demo would kill a node of a job with nothing left to train);
its checkpoints would also land among the user's. A relative folder is no safer (``../ckpt`` leaves the run
directory). So each run gets:

- ``resilience.checkpoint.path``: ``RUN_DIR/checkpoints``;
- ``resilience.checkpoint.save_megatron`` (when given): ``RUN_DIR/checkpoints`` when the config names the
  same folder as ``checkpoint.path`` (as ``phoenix config from-megatron`` does), else ``RUN_DIR/megatron``;
  a relative one is left as it is, for ``phoenix submit`` to refuse as it would for the config itself;
- ``logging.tensorboard_dir`` (with ``logging.tensorboard: true``): ``RUN_DIR/tensorboard``.

``resilience.checkpoint.load_megatron`` is kept: every run starts from that Megatron-LM checkpoint, which a
job only reads (it writes into ``save_megatron``, redirected above), so the reference and the second run start
from the same state. Datasets are only read and stay shared. W&B runs are told apart by the run directory
(:func:`phoenix_hpc.launch.metrics_log.wandb_run_id`), ``wandb.mode: offline`` writes ``RUN_DIR/wandb``.
All functions here are pure.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

CHECKPOINTS = "checkpoints"
MEGATRON = "megatron"
TENSORBOARD = "tensorboard"


def _same(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and os.path.normpath(a) == os.path.normpath(b)


def isolated_config(cfg, run_dir: str | os.PathLike):
    """``(config, folders)``: ``cfg`` (a :class:`phoenix_hpc.config.schema.JobConfig` as
    :func:`phoenix_hpc.config.load.load_job_config` returns it, relative data paths made absolute) with the
    folders it writes moved under the absolute ``run_dir`` (see the module doc) and ``run_dir`` set, validated
    again; ``folders``: :func:`run_folders` of the result. Fields the user did not give stay not given
    (``phoenix submit`` fills some of them from the site).

    Raises:
        ConfigError: the changed config fails validation (not expected: only folders change).
    """
    from phoenix_hpc.config.schema import JobConfig
    from phoenix_hpc.validation import parse_model

    rd = Path(run_dir)
    data = config_data(cfg)
    ck = data.setdefault("resilience", {}).setdefault("checkpoint", {})
    user = cfg.resilience.checkpoint
    ck["path"] = str(rd / CHECKPOINTS)
    if user.save_megatron is not None and os.path.isabs(user.save_megatron):
        ck["save_megatron"] = str(rd / (CHECKPOINTS if _same(user.save_megatron, user.path) else MEGATRON))
    if cfg.logging.tensorboard:
        data.setdefault("logging", {})["tensorboard_dir"] = str(rd / TENSORBOARD)
    data["run_dir"] = str(rd)
    out = parse_model(JobConfig, data, source=f"the config of the run in {rd}")
    return out, run_folders(out, rd)


def config_data(cfg) -> dict[str, Any]:
    """The fields ``cfg`` was given, as plain data (what :func:`config_yaml` writes)."""
    return cfg.model_dump(mode="json", exclude_unset=True)


def config_yaml(cfg) -> str:
    """``cfg`` as YAML that :func:`phoenix_hpc.config.load.load_job_config` reads back to the same config
    (only the fields given, so defaults that ``phoenix submit`` takes from the site stay open)."""
    return yaml.safe_dump(config_data(cfg), sort_keys=False)


def run_folders(cfg, run_dir: str | os.PathLike) -> dict[str, str | None]:
    """The folders a run of ``cfg`` in ``run_dir`` uses, absolute (None: not used): ``checkpoints``
    (:func:`phoenix_hpc.recovery.ckpt_files.checkpoint_root`), ``save_megatron``, ``load_megatron`` (only read)
    and ``tensorboard`` (:func:`phoenix_hpc.launch.metrics_log.tensorboard_path`)."""
    from phoenix_hpc.launch.metrics_log import tensorboard_path
    from phoenix_hpc.recovery.ckpt_files import checkpoint_root

    ck = cfg.resilience.checkpoint
    return {"checkpoints": str(checkpoint_root(cfg, run_dir)), "save_megatron": ck.save_megatron,
            "load_megatron": ck.load_megatron,
            "tensorboard": str(tensorboard_path(run_dir, cfg.logging.tensorboard_dir)) if cfg.logging.tensorboard
            else None}
