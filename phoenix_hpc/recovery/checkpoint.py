"""Persistent checkpoints with ``torch.distributed.checkpoint`` (DCP), on an explicit process group.

The coarse fallback of docs/design.md section 6 (memory replicas cannot cover a loss) and the whole mechanism
of ``resilience.mode: checkpoint-restart`` (the baseline). Every ``resilience.checkpoint.interval_steps`` steps
each rank of the group calls :func:`save_checkpoint`; on a restart every rank calls
:func:`load_checkpoint`.

Two kinds of checkpoint, both under the checkpoint root (default ``RUN_DIR/checkpoints``)::

    step_00000100/      a periodic DCP checkpoint (``.metadata`` + one ``__{rank}_0.distcp`` file per writer)
        complete.json   {"step", "kind": "dcp"}: written atomically by group rank 0 after a barrier
    step_00000288/      a final checkpoint, written at a planned end from the ranks' host snapshots
        pp0-tp0-dp0.pt  one file per logical coordinate (:func:`write_snapshot_shard`)
        complete.json   {"step", "kind": "snapshot", "grid", "files": {name: {"sha256", "bytes"}}}: written
                        by the coordinator once every shard was reported written
    latest              text: the newest complete step (kept for people and older readers)

A checkpoint is *complete* when its ``complete.json`` exists; only complete checkpoints are ever loaded
(:func:`complete_steps`, :func:`latest_step`), so a crash mid-save never makes a partial checkpoint the
newest.

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

from phoenix_hpc.engines.base import Engine
from phoenix_hpc.errors import RecoveryError

from phoenix_hpc.recovery.ckpt_files import (  # noqa: F401 -- the layout, re-exported
    COMPLETE,
    LATEST,
    file_sha256,
    check_checkpoint,
    complete_steps,
    latest_step,
    mark_complete,
    prune,
    read_marker,
    shard_file,
    step_dir,
)


def write_snapshot_shard(root: str | os.PathLike, step: int, coord, tensors: dict[str, torch.Tensor],
                         envelope: dict) -> dict:
    """Write one rank's state of ``step`` (``tensors``: its optimizer shard ``opt/...`` and parameter shard,
    by logical name, as read from its verified host snapshot; ``envelope``: step, data position, LR, RNG)
    to ``step_dir/shard_file(coord)`` (temporary name, fsync, rename). File I/O only, no collective.

    Returns ``{"file", "sha256", "bytes"}`` for the completion marker. Raises OSError on I/O errors.
    """
    d = step_dir(root, step)
    d.mkdir(parents=True, exist_ok=True)
    out = d / shard_file(coord)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    payload = {"optimizer": {n: t for n, t in tensors.items() if n.startswith("opt/")},
               "params": {n: t for n, t in tensors.items() if not n.startswith("opt/")},
               "envelope": envelope}
    try:
        with open(tmp, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return {"file": out.name, "sha256": file_sha256(out), "bytes": out.stat().st_size}


def _envelope_key(engine: Engine) -> str:
    c = engine.coord
    return f"envelope/pp{c.pp}/tp{c.tp}/dp{c.dp}"


def save_checkpoint(engine: Engine, root: str | os.PathLike, process_group, keep: int | None = None) -> Path:
    """Write S(engine.step) of every rank of ``process_group`` (collective: all ranks must call it). With
    ``keep``, group rank 0 then deletes the complete checkpoints older than the newest ``keep``
    (:func:`phoenix_hpc.recovery.ckpt_files.prune`).

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
        mark_complete(root, step, "dcp")
        if keep is not None:
            prune(root, keep)
    dist.barrier(group=process_group)
    return path


def load_checkpoint(engine: Engine, root: str | os.PathLike, process_group, step: int | None = None) -> int:
    """Load the complete checkpoint of ``step`` (default: the newest) into ``engine``. Collective over
    ``process_group`` for a DCP checkpoint; a snapshot checkpoint is read by each rank alone (its shard
    file, SHA-256 checked). Returns the step.

    Raises:
        RecoveryError: no complete checkpoint under ``root`` (or not the requested step), or its shard
        file for this rank's coordinate is missing or fails its check.
    """
    import torch.distributed.checkpoint as dcp

    step = latest_step(root) if step is None else int(step)
    marker = None if step is None else read_marker(root, step)
    if step is None or marker is None:
        raise RecoveryError(f"no complete persistent checkpoint{'' if step is None else f' for step {step}'} under {root}")
    if marker.get("kind") == "snapshot":
        return _load_snapshot(engine, root, step, marker)
    if not (step_dir(root, step) / ".metadata").exists():
        raise RecoveryError(f"checkpoint of step {step} under {root} has no .metadata")
    params = {n: torch.empty_like(t) for n, t in engine.param_shard()}
    opt = {n: torch.empty_like(t) for n, t in engine.optimizer_shard()}
    key = _envelope_key(engine)
    sd: dict[str, object] = {**params, **opt, key: ""}
    dcp.load(sd, checkpoint_id=str(step_dir(root, step)), process_group=process_group)
    engine.load_param_shard({n: sd[n] for n in params})
    engine.load_optimizer_shard({n: sd[n] for n in opt})
    engine.load_envelope(json.loads(sd[key]))
    return step


def _load_snapshot(engine: Engine, root, step: int, marker: dict) -> int:
    name = shard_file(engine.coord)
    info = dict(marker.get("files", {})).get(name)
    p = step_dir(root, step) / name
    if info is None or not p.is_file():
        raise RecoveryError(f"checkpoint of step {step} under {root} has no shard {name}")
    if file_sha256(p) != info["sha256"]:
        raise RecoveryError(f"checkpoint of step {step}: {p} fails its SHA-256 check")
    payload = torch.load(p, map_location="cpu", weights_only=True)
    engine.load_param_shard(payload["params"])
    engine.load_optimizer_shard(payload["optimizer"])
    engine.load_envelope(payload["envelope"])
    if int(engine.step) != int(step):
        raise RecoveryError(f"checkpoint of step {step}: {p} holds step {engine.step}")
    return int(step)
