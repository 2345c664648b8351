"""The process environment Megatron-LM requires of a rank, set by the launcher before CUDA starts.

Megatron-LM's ``validate_args`` (megatron/training/arguments.py) refuses to train with tensor (or context)
parallelism unless ``CUDA_DEVICE_MAX_CONNECTIONS=1`` on GPUs before Blackwell (compute capability below 10):
with one hardware work queue, the kernels and copies of every stream are issued in call order, which its
overlap of tensor-parallel communication with computation relies on. The variable is read when the CUDA
context is created, so :func:`apply_megatron_cuda_env` runs before the rank's first CUDA call
(``launch/rank.py``). Pure except :func:`compute_capability_major` (runs ``nvidia-smi``).
"""

from __future__ import annotations

import shutil
import subprocess
from typing import MutableMapping

from phoenix_hpc.errors import EngineError

MAX_CONNECTIONS = "CUDA_DEVICE_MAX_CONNECTIONS"


def needs_one_connection(engine: str, tp: int, capability_major: int | None) -> bool:
    """Whether Megatron-LM would require ``CUDA_DEVICE_MAX_CONNECTIONS=1``: engine ``megatron`` with
    ``tp > 1`` on a GPU before Blackwell (``capability_major < 10``; an unknown capability counts as before)."""
    return engine == "megatron" and tp > 1 and (capability_major is None or capability_major < 10)


def apply_megatron_cuda_env(env: MutableMapping[str, str], engine: str, tp: int,
                            capability_major: int | None) -> dict[str, str]:
    """Set ``CUDA_DEVICE_MAX_CONNECTIONS=1`` in ``env`` where :func:`needs_one_connection`; returns what was
    set (empty when nothing was needed or it was already 1).

    Raises:
        EngineError: the variable holds another value (Megatron-LM would stop at its argument check).
    """
    if not needs_one_connection(engine, tp, capability_major):
        return {}
    have = env.get(MAX_CONNECTIONS)
    if have is None:
        env[MAX_CONNECTIONS] = "1"
        return {MAX_CONNECTIONS: "1"}
    if have.strip() != "1":
        raise EngineError(f"{MAX_CONNECTIONS}={have!r} in the job's environment: Megatron-LM requires 1 with "
                          f"tensor parallelism (tp={tp}) before Blackwell; unset it or set it to 1")
    return {}


def compute_capability_major(index: int = 0) -> int | None:
    """Major compute capability of GPU ``index`` from ``nvidia-smi --query-gpu=compute_cap`` (no CUDA context
    is created); None when nvidia-smi is missing or does not answer."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        r = subprocess.run([exe, "--query-gpu=compute_cap", "--format=csv,noheader", f"--id={index}"],
                           capture_output=True, text=True, timeout=30)
        return int(r.stdout.strip().split(".")[0]) if r.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None
