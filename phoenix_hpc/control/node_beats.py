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
what it sends. Clean-up:

- a slot removes its record when it closes (:meth:`NodeBoard.leave`);
- the record of a killed slot (SIGKILL, OOM kill) is removed by the carrier once it is older than the
  heartbeat timeout plus the carrier's freshness window (:func:`stale_records`): by then the coordinator
  has counted that slot silent for longer than its timeout and declared it dead, so no message will name it
  again (a stopped slot that wakes after that was fenced anyway; it writes its record again, and a removed
  board directory is made again by the next write). The carrier also removes a temporary file a killed
  writer left behind (``.{name}.{pid}.tmp``) once it is that old;
- the last slot to leave a node removes the board: records that are stale, or whose process is gone from
  this node (the pid no longer exists: the slots of one node share the srun step's process namespace), do
  not keep it (:meth:`NodeBoard.leave`). A board on a node whose slots were all killed stays until that
  node's memory file system is cleared (a node that was lost usually reboots).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import tempfile
import time
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


def stale_records(records: Mapping[int, Mapping[str, Any]], now: float, stale_s: float) -> list[int]:
    """World ranks whose record was written more than ``stale_s`` seconds before ``now`` (unix seconds): the
    records of slots that stopped writing long enough ago to have been declared dead (module docstring).
    Pure."""
    return sorted(w for w, r in records.items() if now - float(r.get("t", 0.0)) > stale_s)


def pid_exists(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (a process of another user counts as existing)."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


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
        try:
            tmp.write_text(json.dumps(obj, separators=(",", ":")))
        except FileNotFoundError:  # the last slot to leave removed the board meanwhile: make it again
            self.path.mkdir(mode=0o700, parents=False, exist_ok=True)
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

    def prune(self, records: Mapping[int, Mapping[str, Any]], now: float, stale_s: float) -> list[int]:
        """Remove the records of :func:`stale_records` and temporary files older than ``stale_s`` (by their
        modification time); returns the world ranks whose records were removed. Never raises: a file another
        slot removed first is skipped. O(files on the board)."""
        gone = []
        for w in stale_records(records, now, stale_s):
            if w == self.world_rank:
                continue
            try:
                (self.path / str(w)).unlink()
                gone.append(w)
            except OSError:
                pass
        try:
            for p in self.path.iterdir():
                if p.name.endswith(".tmp") and now - p.stat().st_mtime > stale_s:
                    p.unlink(missing_ok=True)
        except OSError:
            pass
        return gone

    def leave(self, stale_s: float | None = None, now: float | None = None) -> None:
        """Remove this slot's record; the last slot to leave removes the board. Records that do not keep the
        board (module docstring): those older than ``stale_s`` seconds (None: no age rule) and those whose
        process no longer exists; they are removed with it."""
        now = time.time() if now is None else now
        try:
            (self.path / str(self.world_rank)).unlink(missing_ok=True)
            left = self.records()
            dead = set(stale_records(left, now, stale_s) if stale_s is not None else ())
            dead |= {w for w, r in left.items() if not pid_exists(r.get("pid", -1))}
            if set(left) - dead:
                return  # another slot of this node still runs
            for p in self.path.iterdir():
                p.unlink(missing_ok=True)
            self.path.rmdir()
        except OSError:  # another slot wrote meanwhile, or removed it first
            pass


def beat_on_board(board: NodeBoard, store: Any, record: dict[str, Any], *, world_rank: int, pid: int,
                  secret: bytes, interval_s: float, timeout_s: float) -> int | None:
    """One heartbeat of slot ``world_rank`` through its node's board: write its ``record`` (pid, g, step, t,
    commit); if this slot carries the node (:func:`carrier_of`), remove the records killed slots left, push
    the node's signed ``heartbeats`` message to ``store`` and read the coordinator's beat counter (returned
    and written to the board), else return the carrier's newest reading (None: none fresh).

    Raises:
        OSError: the board cannot be written; torch.distributed.DistError: the store failed.
    """
    from phoenix_hpc.control import protocol as P

    fresh_s = CARRIER_FRESH_INTERVALS * interval_s
    board.write_record(record)
    records = board.records()
    now = time.time()
    if carrier_of(records, now, fresh_s) == world_rank:
        # the carrier removes the records killed slots left (older than the timeout: declared dead)
        for w in board.prune(records, now, timeout_s + fresh_s):
            records.pop(w, None)
        store.queue_push(P.KEY_IN, P.encode({"type": "heartbeats", "world_rank": world_rank, "pid": pid,
                                             "beats": entries_of(records, now, timeout_s)}, secret))
        b = int(store.add(P.KEY_BEAT, 0))
        board.write_beat(b, time.time())
        return b
    seen = board.beat()
    if seen is None or time.time() - seen[1] > fresh_s:
        return None
    return seen[0]
