"""Process bookkeeping for the local cluster's daemons.

A process is identified by ``(pid, start_ticks)`` (:class:`ProcId`): the PID plus its start time in clock
ticks since boot (field 22 of ``/proc/<pid>/stat``, proc(5)), so a PID that the kernel reused for another
process is never mistaken for one of ours and never signalled.

Parents, children and start environments come from psutil. Two facts are still read from ``/proc`` by
hand, because psutil does not give them: the start time as the kernel's integer ticks since boot (psutil's
``create_time()`` is a float of wall-clock seconds, boot time + ticks / CLK_TCK, and the boot time the
kernel reports in ``/proc/stat`` moves when the wall clock is stepped, so a start time saved in
``cluster.json`` by one process could stop matching in a later one and our own daemon would be taken for
another process), and the state of each *thread* (psutil's ``threads()`` gives ids and CPU times, not
states: :func:`exit_complete` needs to know that every thread is a zombie); and the huge-page part of the
resident memory (``AnonHugePages``, which psutil's ``memory_full_info()`` does not report).
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

from phoenix_hpc.errors import ClusterError

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcId:
    """A process as started: ``pid`` and ``start_ticks`` (field 22 of ``/proc/<pid>/stat``)."""

    pid: int
    start_ticks: int

    def to_json(self) -> dict:
        return {"pid": self.pid, "start_ticks": self.start_ticks}

    @classmethod
    def from_json(cls, data: dict) -> ProcId:
        return cls(int(data["pid"]), int(data["start_ticks"]))


def _stat_fields(pid: int, tid: int | None = None) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` (of thread ``tid``: ``/proc/<pid>/task/<tid>/stat``) after the command
    name, or None when the process (thread) does not exist.

    The command name (field 2) is in parentheses and may contain spaces, so split after the last ')'.
    Returned list index 0 is field 3 (state), index 1 field 4 (ppid), index 19 field 22 (starttime).
    """
    path = PROC / str(pid) / "stat" if tid is None else PROC / str(pid) / "task" / str(tid) / "stat"
    try:
        raw = path.read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return raw[raw.rindex(")") + 2:].split()


def proc_id(pid: int) -> ProcId | None:
    """The :class:`ProcId` of a running process, or None when it does not exist."""
    fields = _stat_fields(pid)
    return None if fields is None else ProcId(pid, int(fields[19]))


def _reap(pid: int) -> None:
    """Collect the exit status of ``pid`` if it is our own child (so it does not linger as a zombie)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def is_alive(proc: ProcId) -> bool:
    """True while ``proc`` (same PID *and* start time) runs and is not a zombie."""
    _reap(proc.pid)
    fields = _stat_fields(proc.pid)
    return fields is not None and int(fields[19]) == proc.start_ticks and fields[0] != "Z"


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists and is neither a zombie nor dead (psutil ``Process.status()``); a PID
    alone, without :func:`is_alive`'s start-time check."""
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.Error:
        return False


def exit_complete(proc: ProcId) -> bool:
    """True once the exit of ``proc`` is complete: none of its threads runs any more (``/proc/<pid>/task``
    empty or gone), or the PID now names another process. A multi-threaded process shows its leader as a
    zombie as soon as the leader thread exits; its files (sockets) and memory are released only with the last
    thread (exit(2) of a thread group), so :func:`is_alive` says too early that it ended."""
    _reap(proc.pid)
    fields = _stat_fields(proc.pid)
    if fields is None or int(fields[19]) != proc.start_ticks:
        return True
    try:
        tids = [int(t) for t in os.listdir(PROC / str(proc.pid) / "task")]
    except (FileNotFoundError, ProcessLookupError):
        return True
    for tid in tids:
        f = _stat_fields(proc.pid, tid)
        if f is not None and f[0] != "Z":
            return False
    return True


def parents() -> dict[int, int]:
    """pid -> parent pid of every process running (psutil; one that exits meanwhile is left out)."""
    return {p.info["pid"]: p.info["ppid"] for p in psutil.process_iter(["pid", "ppid"])
            if p.info["ppid"] is not None}


def descendants(roots: Iterable[int], parent_of: dict[int, int] | None = None) -> set[int]:
    """PIDs of all descendants of ``roots`` (children, grandchildren ...), roots excluded."""
    parent_of = parents() if parent_of is None else parent_of
    children: dict[int, list[int]] = {}
    for pid, ppid in parent_of.items():
        children.setdefault(ppid, []).append(pid)
    out: set[int] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def environ_of(pid: int) -> dict[str, str]:
    """The environment ``pid`` was started with (``/proc/<pid>/environ``); empty when unreadable (the process is
    gone, a zombie, or another user's).

    Read by hand, not with psutil's ``Process.environ()``: slurmstepd and slurmscriptd overwrite the start of
    their argument and environment area with NUL bytes (their process titles), so their block begins with
    empty entries; psutil 7.2's parser stops at the first empty entry and returns an empty mapping where the
    file still holds the marker variables further on. :func:`processes_with_env` then found no slurmstepd, and
    a node kill left the job's tasks running (seen: every slurmstepd on this machine)."""
    try:
        raw = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def processes_with_env(marker: dict[str, str]) -> list[ProcId]:
    """Running processes whose start environment contains every ``key=value`` of ``marker``."""
    out = []
    for pid in psutil.pids():
        env = environ_of(pid)
        if env and all(env.get(k) == v for k, v in marker.items()):
            proc = proc_id(pid)
            if proc is not None:
                out.append(proc)
    return out


def signal_procs(procs: Iterable[ProcId], sig: int) -> list[ProcId]:
    """Send ``sig`` to each process of ``procs`` that is still the same process; returns those signalled.

    Raises :class:`ClusterError` when a process belongs to another user (no permission to signal it).
    """
    sent = []
    for proc in procs:
        if is_alive(proc):
            try:
                os.kill(proc.pid, sig)
                sent.append(proc)
            except ProcessLookupError:
                pass
            except PermissionError:
                raise ClusterError(f"not allowed to signal pid {proc.pid} (another user's process; the local "
                                   "cluster's daemons run as root, so stop them as root)") from None
    return sent


def wait_gone(procs: Iterable[ProcId], timeout_s: float, poll_s: float = 0.05) -> list[ProcId]:
    """Wait up to ``timeout_s`` seconds for ``procs`` to exit; returns the ones still alive."""
    left = list(procs)
    deadline = time.monotonic() + timeout_s
    while True:
        left = [p for p in left if is_alive(p)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(poll_s)


def stop_procs(procs: Iterable[ProcId], term_timeout_s: float = 10.0, kill_timeout_s: float = 5.0,
               first_signal: int = signal.SIGTERM) -> list[ProcId]:
    """Stop ``procs``: ``first_signal``, wait, then SIGKILL the rest. Returns those still alive (none if ok)."""
    procs = list(procs)
    signal_procs(procs, first_signal)
    left = wait_gone(procs, term_timeout_s)
    if left and first_signal != signal.SIGKILL:
        signal_procs(left, signal.SIGKILL)
        left = wait_gone(left, kill_timeout_s)
    return left


#: The kernel's transparent-huge-page mode (Documentation/admin-guide/mm/transhuge.rst): the word in brackets.
THP_MODE_PATH = "/sys/kernel/mm/transparent_hugepage/enabled"


def thp_mode(path: str = THP_MODE_PATH) -> str | None:
    """The kernel's transparent-huge-page mode, ``always``, ``madvise`` or ``never`` (the bracketed word of
    ``path``); None when the file cannot be read or names none (a kernel without THP)."""
    try:
        m = re.search(r"\[(\w+)\]", Path(path).read_text())
    except OSError:
        return None
    return m.group(1) if m else None


def resident_mib(pid: int, proc_root: str = "/proc") -> tuple[float | None, float | None]:
    """``(resident, of it in transparent huge pages)`` of process ``pid`` in MiB: the ``Rss`` and
    ``AnonHugePages`` lines of ``/proc/PID/smaps_rollup`` (proc(5), Linux 4.14+; kB; ``AnonHugePages`` counts
    transparent huge pages of anonymous memory). ``(None, None)`` when the file cannot be read (the process is
    gone, or an older kernel). Read by hand: psutil's ``memory_full_info()`` has no huge-page figure."""
    try:
        text = Path(f"{proc_root}/{pid}/smaps_rollup").read_text()
    except OSError:
        return None, None
    kib = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in ("Rss:", "AnonHugePages:") and parts[1].isdigit():
            kib[parts[0][:-1]] = int(parts[1])
    if "Rss" not in kib:
        return None, None
    return round(kib["Rss"] / 1024, 1), round(kib.get("AnonHugePages", 0) / 1024, 1)
