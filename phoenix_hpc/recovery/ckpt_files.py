"""The on-disk layout of persistent checkpoints and their completeness: pure file reading and writing, no
torch (``phoenix submit --resume`` runs on a login node). The layout is described in
:mod:`phoenix_hpc.recovery.checkpoint`, which writes and loads the checkpoints themselves.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from phoenix_hpc.files import write_private_file

LATEST = "latest"
COMPLETE = "complete.json"
_STEP_DIR = re.compile(r"^step_(\d{8,})$")


def checkpoint_root(cfg, run_dir: str | os.PathLike) -> Path:
    """``resilience.checkpoint.path`` (relative paths are relative to ``run_dir``), else
    ``RUN_DIR/checkpoints``."""
    p = cfg.resilience.checkpoint.path
    if not p:
        return Path(run_dir) / "checkpoints"
    return Path(run_dir) / p if not os.path.isabs(p) else Path(p)


def step_dir(root: str | os.PathLike, step: int) -> Path:
    """``root/step_{step:08d}``."""
    return Path(root) / f"step_{int(step):08d}"


def read_marker(root: str | os.PathLike, step: int) -> dict | None:
    """The ``complete.json`` of the checkpoint of ``step`` (None when it is absent or unreadable: the
    checkpoint is not complete)."""
    try:
        m = json.loads((step_dir(root, step) / COMPLETE).read_text())
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) and m.get("step") == int(step) else None


def complete_steps(root: str | os.PathLike) -> list[int]:
    """Steps of the complete checkpoints under ``root``, ascending (empty when there is none or no root)."""
    try:
        names = os.listdir(root)
    except OSError:
        return []
    steps = []
    for n in names:
        m = _STEP_DIR.match(n)
        if m and read_marker(root, int(m.group(1))) is not None:
            steps.append(int(m.group(1)))
    return sorted(steps)


def latest_step(root: str | os.PathLike) -> int | None:
    """The newest complete checkpoint step under ``root`` (None when there is none)."""
    steps = complete_steps(root)
    return steps[-1] if steps else None


def mark_complete(root: str | os.PathLike, step: int, kind: str, **fields) -> Path:
    """Declare the checkpoint of ``step`` complete: write its ``complete.json`` (atomically), then ``latest``
    when ``step`` is the newest complete one. Call only once every shard is on disk. Returns the folder."""
    d = step_dir(root, step)
    write_private_file(d / COMPLETE, json.dumps({"step": int(step), "kind": kind, **fields}, sort_keys=True) + "\n")
    if latest_step(root) == int(step):
        write_private_file(Path(root) / LATEST, f"{int(step)}\n")
    return d


def shard_file(coord) -> str:
    """File name of one logical coordinate's shard in a snapshot checkpoint: ``pp{pp}-tp{tp}-dp{dp}.pt``."""
    return f"pp{coord.pp}-tp{coord.tp}-dp{coord.dp}.pt"


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_checkpoint(root: str | os.PathLike, step: int, grid: tuple[int, int, int] | None = None,
                     verify: bool = True, engine: str | None = None) -> list[str]:
    """Problems that keep the checkpoint of ``step`` from being loaded (empty: it can be): not complete,
    written for another grid ``(tp, pp, dp)`` (with ``engine``: one it cannot load,
    :func:`phoenix_hpc.recovery.ckpt_compat.grid_problem`; without: any other grid), a shard file missing, of
    another size or failing its SHA-256 (``verify``). Pure reading."""
    from phoenix_hpc.recovery.ckpt_compat import grid_problem

    m = read_marker(root, step)
    d = step_dir(root, step)
    if m is None:
        return [f"checkpoint of step {step} in {d} is not complete (no {COMPLETE})"]
    problems = []
    if grid is not None and m.get("grid") is not None:
        if engine is not None:
            why = grid_problem(step, m["grid"], grid, engine)
            if why:
                problems.append(why)
        elif tuple(m["grid"]) != tuple(grid):
            problems.append(f"checkpoint of step {step} was written for grid (tp, pp, dp) = {tuple(m['grid'])}, "
                            f"the job's grid is {tuple(grid)}")
    if m.get("kind") == "dcp":
        if not (d / ".metadata").exists():
            problems.append(f"checkpoint of step {step}: {d / '.metadata'} is missing")
        return problems
    for name, info in sorted(dict(m.get("files", {})).items()):
        p = d / name
        if not p.is_file():
            problems.append(f"checkpoint of step {step}: shard file {p} is missing")
        elif p.stat().st_size != int(info["bytes"]):
            problems.append(f"checkpoint of step {step}: {p} has {p.stat().st_size} bytes, {info['bytes']} written")
        elif verify and file_sha256(p) != info["sha256"]:
            problems.append(f"checkpoint of step {step}: {p} fails its SHA-256 check")
    return problems


def prune_plan(steps: list[int], keep: int) -> list[int]:
    """Which of the complete checkpoint ``steps`` to delete so that the newest ``keep`` (at least one) stay.
    Pure; never names the newest step."""
    kept = sorted(steps)[-max(1, int(keep)):]
    return [s for s in sorted(steps) if s not in kept]


def prune(root: str | os.PathLike, keep: int) -> list[int]:
    """Delete the complete checkpoints under ``root`` older than the newest ``keep``; incomplete ones (a
    save in progress) are left alone. Its ``complete.json`` goes first, so a folder half deleted is never
    taken for a complete checkpoint. Returns the steps deleted."""
    import shutil

    gone = []
    for s in prune_plan(complete_steps(root), keep):
        d = step_dir(root, s)
        try:
            (d / COMPLETE).unlink()
        except OSError:
            continue
        shutil.rmtree(d, ignore_errors=True)
        gone.append(s)
    return gone
