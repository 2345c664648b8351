"""What several GPU checks share: the dataset, job configs, the one-rank NCCL world, host snapshots.

Everything runs in one process on CUDA device 0 with torch.distributed of world size 1 over NCCL (several
ranks cannot share one GPU in one NCCL communicator). Only :func:`init_nccl_world` and the snapshot functions
touch CUDA; :func:`dataset` and :func:`job_config` run on CPU (the dry run calls them).
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any

#: The limit every single-process check shares.
ONE_RANK = ("world size 1: dp=tp=pp=1, so no gradient reduce-scatter, parameter all-gather or pipeline "
            "send/recv crosses a link; only the single-rank code paths run")


def dataset(work: Path) -> str:
    """Prefix of a byte-level dataset of 500 kB from this Python's standard library, made once under
    ``work/data`` (CPU only)."""
    from phoenix_hpc.data.prepare import prepare_dataset, stdlib_dir

    prefix = Path(work) / "data" / "stdlib"
    if not (prefix.with_suffix(".bin").exists() and prefix.with_suffix(".idx").exists()):
        prefix.parent.mkdir(parents=True, exist_ok=True)
        prepare_dataset(stdlib_dir(), prefix, max_bytes=500_000)
    return str(prefix)


def job_config(engine: str, data: str, model: dict, training: dict, python_path: list[str] | None = None):
    """A validated :class:`~phoenix_hpc.config.schema.JobConfig` for one rank (tp=pp=dp=1); ``python_path``:
    absolute folders for user code (default the schema's).

    Raises:
        ConfigError / pydantic.ValidationError: a field the schema rejects.
    """
    from phoenix_hpc.config.schema import JobConfig

    extra = {} if python_path is None else {"python_path": python_path}
    return JobConfig.model_validate({
        "name": f"gpucheck-{engine}", "engine": engine, "data": {"path": data}, "model": model,
        "parallelism": {"tp": 1, "pp": 1, "dp": 1}, "training": training, **extra,
    })


def prepare_cuda():
    """CUDA device 0 as the current device, set up as the launcher sets up a protected job's rank
    (``launch/rank.py``): torch's NCCL error-handling variables (:func:`job_nccl_env`), cuBLAS workspace
    config, ``use_deterministic_algorithms(warn_only=True)``. Returns the device.

    Raises:
        EngineError: the environment holds an NCCL error-handling value a protected job refuses; every
            check that calls this then fails with that message, also those that make no NCCL group (a
            protected job would not start in that environment either).
    """
    import torch

    job_nccl_env()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    return dev


def job_nccl_env() -> dict[str, str]:
    """The NCCL error-handling variables a protected job runs with, set where unset as the launcher sets
    them (:func:`phoenix_hpc.launch.rank.apply_nccl_error_env`), before any NCCL group exists (torch reads
    them when a group is created). Returns their values now.

    Raises:
        EngineError: a value a protected job refuses (the message names the variable and the allowed ones).
    """
    from phoenix_hpc.launch.nccl_env import ASYNC_ERROR_HANDLING, ENABLE_MONITORING
    from phoenix_hpc.launch.rank import apply_nccl_error_env

    apply_nccl_error_env(os.environ, "nccl", True)
    return {k: os.environ[k] for k in (ASYNC_ERROR_HANDLING, ENABLE_MONITORING)}


def init_nccl_world():
    """:func:`prepare_cuda`, then ``init_process_group("nccl")`` of world size 1 (a ``HashStore``, no
    network rendezvous). Returns the default group."""
    import torch.distributed as dist

    dev = prepare_cuda()
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=dev)
    return dist.group.WORLD


def host_snapshot(engine) -> dict[str, Any]:
    """The engine's state S(step) copied to host memory: optimizer shard, param shard, envelope."""
    import copy

    return {
        "opt": {n: t.detach().to("cpu", copy=True) for n, t in engine.optimizer_shard()},
        "param": {n: t.detach().to("cpu", copy=True) for n, t in engine.param_shard()},
        "envelope": copy.deepcopy(engine.envelope()),
    }


def load_snapshot(engine, snap: dict[str, Any]) -> None:
    """Load a :func:`host_snapshot` into a fresh engine (params, optimizer shard, envelope), moving the
    tensors to the engine's device."""
    dev = next(t for _, t in engine.param_shard()).device
    engine.load_param_shard({n: t.to(dev) for n, t in snap["param"].items()})
    engine.load_optimizer_shard({n: t.to(dev) for n, t in snap["opt"].items()})
    engine.load_envelope(snap["envelope"])


def step_numbers(records: list) -> dict[str, Any]:
    """Losses of the first and last step and the median step time (ms) of :class:`StepRecord` s."""
    if not records:
        return {}
    return {"loss_first": records[0].loss, "loss_last": records[-1].loss,
            "step_ms_median": round(statistics.median(r.step_time_ms for r in records), 2)}


def losses(records: list) -> list[float | None]:
    return [r.loss for r in records]
