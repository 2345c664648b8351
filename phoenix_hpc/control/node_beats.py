"""Per-node heartbeats: the slots of one node send one ``heartbeats`` message per interval between them.

Without aggregation every slot pushes a heartbeat every ``heartbeat_interval_s`` and a commit report every
step, so the coordinator's single message loop handles ``slots / interval + active / step_time`` messages
per second. With it, the slots of a node meet on a *board*: a directory on the node's own memory file
system (``/dev/shm``, else the temporary directory), mode 0700, named after the job (a digest of its
secret) and the node. Every interval each slot's heartbeat thread

1. writes its *record* (file ``{world_rank}``, replaced atomically): pid, generation, step, the time it was
   written and its newest commit report (generation, live step, shards, replicas);
2. reads every record of the board; the *carrier* is the lowest world rank whose record is fresh (written
   within :data:`CARRIER_FRESH_INTERVALS` intervals, :func:`carrier_of`): a carrier that died or hangs
   stops writing, and the next slot takes over within that many intervals;
3. the carrier pushes one signed ``heartbeats`` message naming every record not older than the heartbeat
   timeout, each with its age (:func:`entries_of`), reads the coordinator's beat counter and writes it to
   the board (file ``beat``); the other slots take the coordinator's proof of life from that file.

The coordinator handles one message per node per interval and, per entry, O(1) work: the slot's last-seen
time becomes ``now - age`` (so a slot that stopped writing its record is as silent as one that stopped
sending), and the commit part updates the shard's copies as a ``commit`` report would. Detection of one
dead slot is unchanged: its process exit closes its own liveness connection (:mod:`~phoenix_hpc.control.
liveness`), and a hung slot's record ages until the heartbeat timeout passes.

Records are not signed (only the node's slots of this user can write the 0700 directory); the carrier signs
what it sends. A slot removes its record when it closes; records of killed processes stay until the node's
memory file system is cleared (a few hundred bytes per slot).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Mapping

CARRIER_FRESH_INTERVALS = 3.0
BEAT_FILE = "beat"


def board_root() -> Path:
    """The node-local directory boards live in: ``/dev/shm`` when writable, else the temporary directory."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return Path(tempfile.gettempdir())


def board_dir(secret: bytes, node: str, root: Path | None = None) -> Path:
    """The board of the job keyed by ``secret`` on ``node`` (node names are sanitised to ``[A-Za-z0-9._-]``)."""
    key = hmac.new(secret, b"phoenix node board", hashlib.sha256).hexdigest()[:16]
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", node) or "node"
    return (root or board_root()) / f"phoenix-beats-{key}-{safe}"


def carrier_of(records: Mapping[int, Mapping[str, Any]], now: float, fresh_s: float) -> int | None:
    """The world rank that carries the node's heartbeats: the lowest one whose record was written at most
    ``fresh_s`` seconds before ``now`` (unix seconds); None when no record is fresh. Pure."""
    fresh = [w for w, r in records.items() if now - float(r.get("t", 0.0)) <= fresh_s]
    return min(fresh) if fresh else None


def entries_of(records: Mapping[int, Mapping[str, Any]], now: float, max_age_s: float) -> list[list[Any]]:
    """The ``beats`` of a ``heartbeats`` message: ``[world_rank, pid, generation, step, age_s, commit]`` for
    every record at most ``max_age_s`` old (``age_s`` rounded to ms, never negative), by world rank. Pure."""
    out = []
    for w in sorted(records):
        r = records[w]
        age = max(0.0, now - float(r.get("t", 0.0)))
        if age <= max_age_s:
            out.append([int(w), int(r["pid"]), r.get("g"), r.get("step"), round(age, 3), r.get("commit")])
    return out


class NodeBoard:
    """One slot's view of its node's board (see the module docstring).

    Args:
        path: the board directory (:func:`board_dir`); created (mode 0700) if missing.
        world_rank: this slot's world rank.

    Raises:
        OSError: the directory cannot be created.
    """

    def __init__(self, path: Path, world_rank: int):
        self.path = Path(path)
        self.world_rank = int(world_rank)
        self.path.mkdir(mode=0o700, parents=False, exist_ok=True)

    def _write(self, name: str, obj: Any) -> None:
        tmp = self.path / f".{name}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(obj, separators=(",", ":")))
        os.replace(tmp, self.path / name)  # readers see the old or the new record, never half of one

    def write_record(self, record: dict[str, Any]) -> None:
        """Replace this slot's record (``pid``, ``g``, ``step``, ``t`` unix seconds, ``commit``)."""
        self._write(str(self.world_rank), record)

    def records(self) -> dict[int, dict[str, Any]]:
        """Every slot's record on the board (unreadable or half-removed ones are skipped)."""
        out = {}
        for p in self.path.iterdir():
            if not p.name.isdigit():
                continue
            try:
                out[int(p.name)] = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
        return out

    def write_beat(self, beat: int, t: float) -> None:
        """The carrier's newest reading of the coordinator's beat counter, read at ``t`` (unix seconds)."""
        self._write(BEAT_FILE, {"b": int(beat), "t": t})

    def beat(self) -> tuple[int, float] | None:
        """``(beat counter, unix time read)`` as the carrier last wrote it, or None."""
        try:
            d = json.loads((self.path / BEAT_FILE).read_text())
            return int(d["b"]), float(d["t"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def leave(self) -> None:
        """Remove this slot's record; the last slot to leave removes the board."""
        try:
            (self.path / str(self.world_rank)).unlink(missing_ok=True)
            if not any(p.name.isdigit() for p in self.path.iterdir()):
                (self.path / BEAT_FILE).unlink(missing_ok=True)
                self.path.rmdir()
        except OSError:  # another slot wrote meanwhile, or removed it first
            pass
