"""Persistent checkpoints with ``torch.distributed.checkpoint`` (DCP), on an explicit process group.

The coarse fallback of docs/design.md section 6 (memory replicas cannot cover a loss) and the whole mechanism
of ``resilience.mode: checkpoint-restart`` (the baseline). Every ``resilience.checkpoint.interval_steps`` steps
each rank of the group calls :func:`save_checkpoint`; on a restart every rank calls
:func:`load_checkpoint`.

Layout under the checkpoint root (default ``RUN_DIR/checkpoints``)::

    step_00000100/      one DCP checkpoint (``.metadata`` + one ``__{rank}_0.distcp`` file per writer)
    latest              text: the newest *complete* step, written atomically by group rank 0 after a
                        barrier, so a crash mid-save never makes a partial checkpoint "latest"

State dict keys are the engine's logical names (``param/pp{pp}/tp{tp}/{name}``: identical on the DP ranks
of a (pp, tp), which DCP's default planner deduplicates on save; ``opt/pp/tp/dp/...``: one writer each) plus
``envelope/pp{pp}/tp{tp}/dp{dp}`` (the metadata envelope, JSON text). Because the keys are logical, a
checkpoint written by one rank numbering is loaded correctly after spares took over logical ranks.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from phoenix_hpc.control.journal import write_private_file
from phoenix_hpc.engines.base import Engine
from phoenix_hpc.errors import RecoveryError

LATEST = "latest"


def step_dir(root: str | os.PathLike, step: int) -> Path:
    """``root/step_{step:08d}``."""
    return Path(root) / f"step_{int(step):08d}"


def latest_step(root: str | os.PathLike) -> int | None:
    """The newest complete checkpoint step under ``root`` (None when there is none)."""
    p = Path(root) / LATEST
    try:
        return int(p.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def _envelope_key(engine: Engine) -> str:
    c = engine.coord
    return f"envelope/pp{c.pp}/tp{c.tp}/dp{c.dp}"


def save_checkpoint(engine: Engine, root: str | os.PathLike, process_group) -> Path:
    """Write S(engine.step) of every rank of ``process_group`` (collective: all ranks must call it).

    Returns the checkpoint folder. Raises whatever DCP raises on I/O errors (the caller reports a fault).
    """
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    step = int(engine.step)
    path = step_dir(root, step)
    path.mkdir(parents=True, exist_ok=True)
    sd: dict[str, object] = {n: t.detach() for n, t in engine.param_shard()}
    sd.update({n: t.detach() for n, t in engine.optimizer_shard()})
    sd[_envelope_key(engine)] = json.dumps(engine.envelope(), sort_keys=True)
    dcp.save(sd, checkpoint_id=str(path), process_group=process_group)
    dist.barrier(group=process_group)
    if dist.get_rank(process_group) == 0:
        write_private_file(Path(root) / LATEST, f"{step}\n")
    dist.barrier(group=process_group)
    return path


def load_checkpoint(engine: Engine, root: str | os.PathLike, process_group, step: int | None = None) -> int:
    """Load the checkpoint of ``step`` (default: the latest) into ``engine``. Collective. Returns the step.

    Raises:
        RecoveryError: no checkpoint under ``root`` (or not the requested step).
    """
    import torch.distributed.checkpoint as dcp

    step = latest_step(root) if step is None else int(step)
    if step is None or not (step_dir(root, step) / ".metadata").exists():
        raise RecoveryError(f"no persistent checkpoint{'' if step is None else f' for step {step}'} under {root}")
    params = {n: torch.empty_like(t) for n, t in engine.param_shard()}
    opt = {n: torch.empty_like(t) for n, t in engine.optimizer_shard()}
    key = _envelope_key(engine)
    sd: dict[str, object] = {**params, **opt, key: ""}
    dcp.load(sd, checkpoint_id=str(step_dir(root, step)), process_group=process_group)
    engine.load_param_shard({n: sd[n] for n in params})
    engine.load_optimizer_shard({n: sd[n] for n in opt})
    engine.load_envelope(json.loads(sd[key]))
    return step
