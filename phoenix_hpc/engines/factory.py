"""Choosing and building an engine from the job config (imports the chosen engine only)."""

from __future__ import annotations

import torch

from phoenix_hpc.engines.base import Engine, GridCoord, ProcessGroups
from phoenix_hpc.errors import EngineError


def check_engine_runnable(engine: str, cuda_available: bool | None = None) -> None:
    """Fail early when ``engine`` cannot run on this machine.

    Raises:
        EngineError: ``engine: megatron`` without CUDA (megatron-core allocates on CUDA in DDP, the
            distributed optimizer and the GPT forward pass) or with a megatron-core version outside
            :data:`phoenix_hpc.engines.megatron_version.SUPPORTED`, or an unknown engine name.
    """
    if engine not in ("torch", "megatron"):
        raise EngineError(f"engine {engine!r} is unknown (allowed: torch, megatron)")
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    if engine == "megatron" and not cuda_available:
        raise EngineError(
            "engine 'megatron' needs CUDA, and no CUDA device is available here "
            "(megatron-core allocates on CUDA even in its forward pass); use engine: torch on CPU"
        )
    if engine == "megatron":
        from phoenix_hpc.engines.megatron_version import installed_version, version_problem

        problem = version_problem(installed_version())
        if problem is not None:
            raise EngineError(problem)


def default_device(local_rank: int) -> torch.device:
    """``cuda:{local_rank % device_count}`` when CUDA is available, else CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def create_engine(cfg, coord: GridCoord, groups: ProcessGroups, device: torch.device) -> Engine:
    """Build the engine named by ``cfg.engine`` for this rank (the dataset is opened here).

    Raises:
        EngineError / DataError: see :func:`check_engine_runnable`, the engine's constructor and
            :class:`phoenix_hpc.data.indexed.TokenSamples`.
    """
    check_engine_runnable(cfg.engine, device.type == "cuda")
    if cfg.engine == "megatron":
        from phoenix_hpc.engines.megatron_engine import MegatronEngine

        return MegatronEngine(cfg, coord, groups, device)
    from phoenix_hpc.data.indexed import TokenSamples
    from phoenix_hpc.engines.torch_engine import TorchEngine

    samples = TokenSamples(cfg.data.path, cfg.model.seq_length, cfg.training.seed, cfg.model.vocab_size)
    return TorchEngine(cfg, coord, groups, samples, device)
