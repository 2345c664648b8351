"""Abort a generation's torch communicators on a fault or a quiesce, from any thread (docs/design.md
section 12).

A survivor must leave a collective that waits on a dead or hung peer as soon as the job knows the peer is
lost, not after ``resilience.collective_timeout_s``, and it must never *destroy* a communicator that
contained a dead peer (on NCCL ``ncclCommDestroy``/``ncclCommFinalize`` wait for the peer and can block
forever; pytorch PR 194775, NCCL issue 1013). :class:`GenerationAbort` does what each backend allows:

- **NCCL** (:func:`abort_nccl_groups`): ``torch.distributed.distributed_c10d._abort_process_group()``
  with no argument aborts every process group of the process inside one ``ncclGroupStart``/``End`` (the
  "group abort" of torch PR 132291, so aborts of several communicators cannot deadlock each other) and
  unregisters them. torch 2.6 to 2.13 have no public function for this: ``_abort_process_group`` is the
  one torch documents for "bailout upon hangs or failures" (``destroy_process_group`` is for a normal
  exit). Fallbacks, in order, for a torch without it: ``ProcessGroup.abort()`` on every registered group
  (newest first), then the NCCL backend's own ``abort()``. ``ncclCommAbort`` makes a spinning NCCL kernel
  exit, so a training thread blocked in the collective or in a CUDA synchronisation returns with an error.
- **gloo**: ``ProcessGroup.abort()``/``shutdown()`` exist on ``ProcessGroupGloo`` in torch 2.13 but do not
  end a pending collective (measured: a blocked ``all_reduce`` still waits out its timeout; gloo has no
  abort, pytorch/gloo PR 388 is unmerged and pytorch issue 130345 open). What does end it is the pair's TCP
  connection failing: gloo's I/O loop then fails every pending operation of that pair ("Connection closed
  by peer"), which is how peers of a dead process fail at once. So the sockets gloo created for the
  generation's groups are recorded when the groups are built (:class:`SocketCapture`: the socket file
  descriptors that appear in ``/proc/self/fd`` while ``init_generation`` runs) and ``shutdown(SHUT_RDWR)``
  is called on each connected one (never on a listening socket: gloo's listener thread aborts the process
  when ``accept`` fails). The blocked collective fails at once, and so do the peers' collectives with this
  rank, as if it had died; nothing is freed under a running operation. This needs gloo's eager connection
  set-up (the default; ``TORCH_GLOO_LAZY_INIT=1`` would open connections later, outside the capture).

Every abort is idempotent and serialised by a lock, so the quiesce watchdog thread and the training thread
(:meth:`phoenix_hpc.launch.execute.Member.release_groups`) may both call it.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

PROC_FD = "/proc/self/fd"


def socket_fds(proc_fd: str = PROC_FD) -> dict[int, str]:
    """This process's socket file descriptors: ``{fd: "socket:[inode]"}`` (Linux ``/proc``)."""
    out = {}
    try:
        names = os.listdir(proc_fd)
    except OSError:
        return out
    for name in names:
        try:
            target = os.readlink(os.path.join(proc_fd, name))
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            out[int(name)] = target
    return out


def new_sockets(before: dict[int, str], after: dict[int, str]) -> dict[int, str]:
    """The sockets in ``after`` that are not in ``before`` (same fd and inode), pure."""
    return {fd: ino for fd, ino in after.items() if before.get(fd) != ino}


class SocketCapture:
    """Context manager: the sockets opened while it is active (``sockets``: ``{fd: "socket:[inode]"}``)."""

    def __init__(self, proc_fd: str = PROC_FD):
        self.proc_fd = proc_fd
        self.sockets: dict[int, str] = {}
        self._before: dict[int, str] = {}

    def __enter__(self) -> "SocketCapture":
        self._before = socket_fds(self.proc_fd)
        return self

    def __exit__(self, *exc) -> None:
        self.sockets = new_sockets(self._before, socket_fds(self.proc_fd))


def shutdown_sockets(sockets: dict[int, str], proc_fd: str = PROC_FD) -> int:
    """``shutdown(SHUT_RDWR)`` every connected socket of ``sockets`` whose fd still names the same inode
    (an fd closed and reused since is left alone); listening sockets are skipped. The descriptors stay
    open (their owner closes them). Returns how many were shut down."""
    n = 0
    for fd, ino in sockets.items():
        try:
            if os.readlink(os.path.join(proc_fd, str(fd))) != ino:
                continue
        except OSError:
            continue
        try:
            s = socket.socket(fileno=fd)
        except OSError:
            continue
        try:
            if s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                continue
            s.shutdown(socket.SHUT_RDWR)
            n += 1
        except OSError:  # not connected (any more)
            pass
        finally:
            s.detach()  # the fd belongs to gloo
    return n


def choose_nccl_abort(c10d: Any) -> str:
    """Which NCCL abort the installed torch offers, public-most first among those that abort every
    communicator (pure over the module's attributes): ``"abort_process_group"``
    (``distributed_c10d._abort_process_group``), ``"group_abort"`` (``ProcessGroup.abort``), or
    ``"backend_abort"`` (the NCCL backend's ``abort``)."""
    if callable(getattr(c10d, "_abort_process_group", None)):
        return "abort_process_group"
    pg = getattr(c10d, "ProcessGroup", None)
    if pg is not None and callable(getattr(pg, "abort", None)):
        return "group_abort"
    return "backend_abort"


def registered_groups(c10d: Any) -> list[Any]:
    """Every process group torch has registered (the launcher's and an engine's own, e.g. Megatron's),
    newest first; empty when torch.distributed is not initialised."""
    world = getattr(c10d, "_world", None)
    names = getattr(world, "pg_names", None) or {}
    return list(names)[::-1]  # a dict in creation order


def abort_group(pg: Any, how: str, c10d: Any) -> None:
    """Abort the NCCL communicators of the one process group ``pg`` with method ``how``
    (:func:`choose_nccl_abort`); raises what torch raises (e.g. ``RuntimeError`` for a destroyed group)."""
    import torch

    if how == "abort_process_group":
        c10d._abort_process_group(pg)
    elif how == "group_abort":
        pg.abort()
    else:
        pg._get_backend(torch.device("cuda")).abort()


def abort_nccl_groups(extra: Iterable[Any] = (), c10d: Any = None) -> str:
    """Abort every NCCL communicator of the process (see the module doc); never destroys one. ``extra``:
    groups to abort besides the registered ones (with the per-group fallbacks). Returns the method used."""
    if c10d is None:
        import torch.distributed.distributed_c10d as c10d
    how = choose_nccl_abort(c10d)
    registered = registered_groups(c10d)
    groups = list(dict.fromkeys([*registered, *extra]))
    if how == "abort_process_group":
        if c10d.is_initialized():
            c10d._abort_process_group()
        for pg in extra:  # groups torch does not list (already unregistered) are aborted directly
            if pg not in registered:
                _try(lambda: pg.abort())
        return how
    for pg in groups:
        _try(lambda: abort_group(pg, how, c10d))
    return how


def _try(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception:  # noqa: BLE001 -- an already aborted or destroyed group: nothing left to abort
        pass


@dataclass
class AbortRecord:
    """One abort of a generation: ``reason``, ``method`` (``nccl:<api>`` or ``gloo:shutdown``),
    ``sockets`` shut down (gloo), ``at`` (``time.monotonic()``), ``duration_s``."""

    reason: str
    method: str
    sockets: int = 0
    at: float = 0.0
    duration_s: float = 0.0


@dataclass
class GenerationAbort:
    """The abort of one generation's communicators. ``backend``: ``gloo`` or ``nccl``; ``sockets``: the
    gloo sockets of the generation's groups (:class:`SocketCapture`); ``groups``: the generation's groups
    (``ProcessGroups`` fields), aborted explicitly besides those torch has registered."""

    backend: str
    generation: int
    sockets: dict[int, str] = field(default_factory=dict)
    groups: tuple[Any, ...] = ()
    record: AbortRecord | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def abort(self, reason: str) -> AbortRecord:
        """Abort now (first call); later calls return the first record. Thread-safe."""
        with self._lock:
            if self.record is not None:
                return self.record
            t0 = time.monotonic()
            if self.backend == "nccl":
                rec = AbortRecord(reason, "nccl:" + abort_nccl_groups(self.groups))
            else:
                rec = AbortRecord(reason, "gloo:shutdown", sockets=shutdown_sockets(self.sockets))
            rec.at, rec.duration_s = t0, time.monotonic() - t0
            self.record = rec
            self.groups = ()  # no references kept to aborted groups
            return rec

    @property
    def aborted(self) -> bool:
        return self.record is not None
