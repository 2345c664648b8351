"""Saving and loading one rank's engine state (optimizer shard, param shard, envelope) as a file.

The file is named by the rank's logical coordinate, never by its rank number:
``DIR/pp{pp}-tp{tp}-dp{dp}.pt`` (``torch.save`` of ``{"optimizer": {name: tensor}, "params": {...},
"envelope": {...}}``), written to a temporary name in ``DIR`` and renamed when complete. Used to save a
rank's state at a chosen step and restore it into fresh processes (``phoenix-rank --snapshot-at/
--restore-dir``); the persistent checkpoint of a whole job uses torch.distributed.checkpoint instead.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from phoenix_hpc.engines.base import Engine, GridCoord
from phoenix_hpc.errors import EngineError


def state_path(directory: str | Path, coord: GridCoord) -> Path:
    return Path(directory) / f"pp{coord.pp}-tp{coord.tp}-dp{coord.dp}.pt"


def save_rank_state(engine: Engine, directory: str | Path) -> Path:
    """Write the engine's current state S(step) (copies of its tensors) to :func:`state_path`."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    payload = {
        "optimizer": {n: t.detach().cpu().clone() for n, t in engine.optimizer_shard()},
        "params": {n: t.detach().cpu().clone() for n, t in engine.param_shard()},
        "envelope": engine.envelope(),
    }
    out = state_path(d, engine.coord)
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    try:
        torch.save(payload, tmp)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def load_rank_state(engine: Engine, directory: str | Path) -> int:
    """Load the state saved for ``engine.coord`` under ``directory``; returns the restored step.

    Raises:
        EngineError: no file for this coordinate, or it does not match the engine (names, shapes, grid).
    """
    p = state_path(directory, engine.coord)
    if not p.is_file():
        raise EngineError(f"no saved state for {engine.coord.shard_prefix()} at {p}")
    payload = torch.load(p, map_location="cpu", weights_only=True)
    engine.load_param_shard(payload["params"])
    engine.load_optimizer_shard(payload["optimizer"])
    engine.load_envelope(payload["envelope"])
    return engine.step
