"""Persistent checkpoints with ``torch.distributed.checkpoint`` (DCP), on an explicit process group.

The coarse fallback of docs/design.md section 6 (memory replicas cannot cover a loss) and the whole mechanism
of ``resilience.mode: checkpoint-restart`` (the baseline). Every ``resilience.checkpoint.interval_steps`` steps
each rank of the group calls :func:`save_checkpoint`; on a restart every rank calls
:func:`load_checkpoint`.

Two kinds of checkpoint, both under the checkpoint root (default ``RUN_DIR/checkpoints``)::

    step_00000100/      a periodic DCP checkpoint (``.metadata`` + one ``__{rank}_0.distcp`` file per writer)
        complete.json   {"step", "kind": "dcp", "grid": [tp, pp, dp], "engine", "model"}: written
                        atomically by group rank 0 after a barrier (older ones have step and kind only)
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
checkpoint written by one rank numbering is loaded correctly after spares took over logical ranks; one
written at another dp (a run that shrank) is re-partitioned on load (:func:`load_checkpoint`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from phoenix_hpc.engines.base import Engine
from phoenix_hpc.errors import RecoveryError
from phoenix_hpc.topology import Grid, GridCoord

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


def _grid(engine: Engine) -> list[int]:
    """The engine's grid ``[tp, pp, dp]`` (from its envelope: the sizes of its process groups); ``[]`` when its
    envelope does not say (the grid is then not checked)."""
    envelope = getattr(engine, "envelope", None)
    g = (envelope() if callable(envelope) else {}).get("grid") or {}
    return list(Grid.of(g)) if g else []


def save_checkpoint(engine: Engine, root: str | os.PathLike, process_group, keep: int | None = None,
                    record: dict | None = None) -> Path:
    """Write S(engine.step) of every rank of ``process_group`` (collective: all ranks must call it). With
    ``keep``, group rank 0 then deletes the complete checkpoints older than the newest ``keep``
    (:func:`phoenix_hpc.recovery.ckpt_files.prune`). ``complete.json`` records the grid ``[tp, pp, dp]`` it
    was written at and ``record`` (:func:`phoenix_hpc.recovery.ckpt_compat.model_record`: the engine and
    model that decide the tensors' shapes and dtypes), which ``phoenix submit --resume`` checks.

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
    grid = _grid(engine)
    dcp.save(sd, checkpoint_id=str(path), process_group=process_group)
    dist.barrier(group=process_group)
    if dist.get_rank(process_group) == 0:
        mark_complete(root, step, "dcp", **({"grid": grid} if grid else {}), **(record or {}))
        if keep is not None:
            prune(root, keep)
    dist.barrier(group=process_group)
    return path


def dcp_layout(d: str | os.PathLike) -> tuple[tuple[int, int, int] | None, list[str]]:
    """What the DCP checkpoint in folder ``d`` says of itself: ``(grid, problems)``. ``grid``: ``(tp, pp, dp)``
    from its envelope keys (None when it has none); ``problems``: ``.metadata`` unreadable, or a data file it
    names missing or shorter than the bytes it indexes (a damaged or partial copy). Reads the metadata only."""
    from torch.distributed.checkpoint import FileSystemReader

    d = Path(d)
    try:
        meta = FileSystemReader(str(d)).read_metadata()
    except Exception as exc:  # pickle, I/O and format errors alike: the file cannot be used
        return None, [f"{d / '.metadata'} cannot be read ({type(exc).__name__}: {exc})"]
    problems, need = [], {}
    for info in (meta.storage_data or {}).values():
        rel = str(info.relative_path)
        need[rel] = max(need.get(rel, 0), int(info.offset) + int(info.length))
    for rel, size in sorted(need.items()):
        p = d / rel
        if not p.is_file():
            problems.append(f"{p} is missing (named by {d / '.metadata'})")
        elif p.stat().st_size < size:
            problems.append(f"{p} has {p.stat().st_size} bytes, its index needs {size}")
    coords = []
    for key in meta.state_dict_metadata:
        parts = key.split("/")
        if len(parts) == 4 and parts[0] == "envelope":
            coords.append(tuple(int(x[2:]) for x in (parts[2], parts[1], parts[3])))  # (tp, pp, dp)
    grid = tuple(max(c[i] for c in coords) + 1 for i in range(3)) if coords else None
    return grid, problems


def checkpoint_grid(root: str | os.PathLike, step: int, marker: dict) -> tuple[int, int, int] | None:
    """The grid ``(tp, pp, dp)`` the complete checkpoint of ``step`` was written at: its ``complete.json``'s,
    else (a DCP checkpoint written before the marker recorded it) its envelope keys' (:func:`dcp_layout`)."""
    if marker.get("grid"):
        return tuple(int(x) for x in marker["grid"])
    if marker.get("kind") == "dcp":
        return dcp_layout(step_dir(root, step))[0]
    return None


def load_checkpoint(engine: Engine, root: str | os.PathLike, process_group, step: int | None = None) -> int:
    """Load the complete checkpoint of ``step`` (default: the newest) into ``engine``. Collective over
    ``process_group`` for a DCP checkpoint; a snapshot checkpoint is read by each rank alone (its shard
    file, SHA-256 checked). Returns the step.

    A checkpoint written at another dp (the same tp and pp: e.g. after a shrink) is re-partitioned as a
    shrink does: the rank reads the old slices that intersect its new one
    (:func:`phoenix_hpc.recovery.shrink.overlapping`) and the engine fills its slice from them
    (``load_resharded_optimizer``); the parameters are the stage's (the same on every DP rank) and the
    envelope (step, data position, LR, RNG) is that of the first old slice read, at the rank's own coordinate
    and grid. The global batch and the sample order do not depend on dp (``data.position`` is
    ``step * global_batch_size``).

    Raises:
        RecoveryError: no complete checkpoint under ``root`` (or not the requested step), its shard file
        for this rank's coordinate is missing or fails its check, or it was written at a grid this engine
        cannot load (another tp or pp; another dp for an engine that cannot re-partition).
    """
    import torch.distributed.checkpoint as dcp

    step = latest_step(root) if step is None else int(step)
    marker = None if step is None else read_marker(root, step)
    if step is None or marker is None:
        raise RecoveryError(f"no complete persistent checkpoint{'' if step is None else f' for step {step}'} under {root}")
    old = checkpoint_grid(root, step, marker)
    new = tuple(_grid(engine)) or None
    old_dp = None
    if old is not None and new is not None and old != new:
        if old[:2] != new[:2] or not engine.supports_shrink:
            raise RecoveryError(f"checkpoint of step {step} under {root} was written for grid (tp, pp, dp) = {old}; "
                                f"this job's grid {new} cannot load it")
        old_dp = old[2]
    if marker.get("kind") == "snapshot":
        return _load_snapshot(engine, root, step, marker, old_dp)
    if not (step_dir(root, step) / ".metadata").exists():
        raise RecoveryError(f"checkpoint of step {step} under {root} has no .metadata")
    params = {n: torch.empty_like(t) for n, t in engine.param_shard()}
    if old_dp is None:
        opt = {n: torch.empty_like(t) for n, t in engine.optimizer_shard()}
        key = _envelope_key(engine)
    else:
        needed = _needed(engine, old_dp)
        opt = {n: torch.empty(k, dtype=torch.float32) for d in needed
               for n, k in engine.optimizer_shard_layout(d, old_dp).items()}
        c = engine.coord
        key = f"envelope/pp{c.pp}/tp{c.tp}/dp{needed[0]}"
    sd: dict[str, object] = {**params, **opt, key: ""}
    dcp.load(sd, checkpoint_id=str(step_dir(root, step)), process_group=process_group)
    engine.load_param_shard({n: sd[n] for n in params})
    envelope = json.loads(sd[key])
    if old_dp is None:
        engine.load_optimizer_shard({n: sd[n] for n in opt})
    else:
        _load_resharded(engine, {n: sd[n] for n in opt}, old_dp)
        envelope = _at_own_coordinate(engine, envelope)
    engine.load_envelope(envelope)
    return step


def _needed(engine: Engine, old_dp: int) -> list[int]:
    """The old DP indices whose slices this rank's new slice needs (:func:`overlapping`; at least one, so that
    a rank with an empty slice still reads an envelope)."""
    from phoenix_hpc.recovery.shrink import overlapping

    return overlapping(int(engine.optimizer_numel()), int(old_dp), _grid(engine)[2], int(engine.coord.dp)) or [0]


def _load_resharded(engine: Engine, old: dict, old_dp: int) -> None:
    from phoenix_hpc.errors import EngineError

    try:
        engine.load_resharded_optimizer(old, int(old_dp))
    except EngineError as exc:
        raise RecoveryError(f"re-partitioning the checkpoint's optimizer from dp = {old_dp}: {exc}") from None


def _at_own_coordinate(engine: Engine, envelope: dict) -> dict:
    """``envelope`` (of another coordinate of the stage) at this rank's coordinate and grid, as a shrink sets
    it (:func:`phoenix_hpc.launch.shrink.apply_shrink`); nothing else changes."""
    c, g = engine.coord, _grid(engine)
    return {**envelope, "coord": c.to_json(), "grid": Grid(*g).to_json()}


def _read_shard(root, step: int, marker: dict, name: str) -> dict:
    info = dict(marker.get("files", {})).get(name)
    p = step_dir(root, step) / name
    if info is None or not p.is_file():
        raise RecoveryError(f"checkpoint of step {step} under {root} has no shard {name}")
    if file_sha256(p) != info["sha256"]:
        raise RecoveryError(f"checkpoint of step {step}: {p} fails its SHA-256 check")
    return torch.load(p, map_location="cpu", weights_only=True)


def _load_snapshot(engine: Engine, root, step: int, marker: dict, old_dp: int | None = None) -> int:
    c = engine.coord
    if old_dp is None:
        payload = _read_shard(root, step, marker, shard_file(c))
        engine.load_param_shard(payload["params"])
        engine.load_optimizer_shard(payload["optimizer"])
        engine.load_envelope(payload["envelope"])
    else:
        old: dict = {}
        first = None
        for d in _needed(engine, old_dp):
            payload = _read_shard(root, step, marker, shard_file(GridCoord(pp=c.pp, dp=d, tp=c.tp)))
            old.update(payload["optimizer"])
            first = first or payload
        engine.load_param_shard(first["params"])
        _load_resharded(engine, old, old_dp)
        engine.load_envelope(_at_own_coordinate(engine, first["envelope"]))
    if int(engine.step) != int(step):
        raise RecoveryError(f"checkpoint of step {step} under {root} holds step {engine.step}")
    return int(step)
