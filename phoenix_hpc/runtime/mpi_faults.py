"""MPI when a peer dies: errors returned, not fatal; requests of an abandoned generation cancelled or freed.

The runtime keeps one MPI world for the life of the job, across generations whose members died
(docs/design.md section 6, step 3, and section 12). Three rules make that safe on an MPI without
fault-tolerance extensions:

1. **Errors are returned, never fatal.** :func:`errors_return` sets ``MPI.ERRORS_RETURN`` on a
   communicator (MPI 4.1 section 9.3: the default handler ``MPI_ERRORS_ARE_FATAL`` aborts every process of
   the job). It is called on ``COMM_WORLD`` at start-up and on every communicator the runtime creates:
   the generation's ``Create_group``, and the runtime's ``Dup`` of it. mpi4py then raises
   ``MPI.Exception`` for an error code. (mpi4py's default ``mpi4py.rc.errors = "exception"`` already sets
   it on ``COMM_WORLD`` and MPI says a new communicator inherits its parent's handler; the runtime sets it
   explicitly so that neither an rc setting nor an implementation's inheritance is relied on.)
2. **Nothing posted to a dead peer is left to fail later.** When a generation is abandoned,
   :func:`abandon_requests` cancels every point-to-point request still active (``MPI_Cancel``; a
   cancelled receive completes locally, MPI 4.1 section 3.8.4), tests it for at most 0.1 s (once only when
   its peer is one the coordinator declared dead: it cannot complete, and a survivor would otherwise wait
   the whole 0.1 s before answering the quiesce whenever a replica to the lost rank was on the wire),
   and frees what did not complete (``MPI_Request_free``, local). Open MPI's ob1 cannot cancel a send
   that has started: such a send is freed, and its buffer is kept referenced for the life of the process
   (:data:`KEPT_BUFFERS`), because MPI may still read it. A non-blocking *collective* (the commit fence
   ``Iallreduce``, ``Ibarrier``) may be neither cancelled nor freed (MPI 4.1 section 6.12): it is kept
   referenced with its buffers and never waited on.
3. **Abandoned communicators are not freed.** ``MPI_Comm_free`` is collective over the communicator
   (MPI 4.1 section 7.4.3); a member that died never calls it, and an implementation may synchronise in
   it. A communicator that contained a dead (or possibly dead) member is therefore dropped, not freed: it
   costs a handle and a context id per generation, never a hang. A communicator whose members all
   agreed to end it together (the normal end of a protector) is freed as before.

Everything here takes the MPI module and requests as arguments (no import-time MPI), so it is unit-tested
with fakes for the decisions and end to end under ``srun --mpi=pmix`` with a killed peer
(``tests/e2e/test_mpi_dead_peer.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterable

#: Buffers (and requests) that MPI may still read or complete after their generation was abandoned:
#: freed sends that had started, and non-blocking collectives. Kept for the life of the process.
KEPT_BUFFERS: list[Any] = []
#: ``(request, buffer)`` of requests to live peers still active when their generation was abandoned
#: (``abandon_requests(linger=True)``): not freed, so that :func:`reap_lingering` can see them complete
#: (a started transfer with a peer that survives finishes once both sides progress MPI) and drop their
#: buffers then, instead of keeping them for the life of the process.
LINGERING: list[tuple[Any, Any]] = []


def errors_return(comm: Any, MPI: Any | None = None) -> Any:
    """Set ``MPI.ERRORS_RETURN`` on ``comm`` (an mpi4py communicator) and return it; mpi4py then raises
    ``MPI.Exception`` where the default handler would abort the job. ``MPI_COMM_NULL`` is returned as is.

    Raises:
        MPI.Exception: the MPI refuses the handler (never seen with Open MPI 4.1 or MPICH 3.4+)."""
    if MPI is None:
        from mpi4py import MPI
    if comm is None or comm == MPI.COMM_NULL:
        return comm
    comm.Set_errhandler(MPI.ERRORS_RETURN)
    return comm


def returns_errors(comm: Any, MPI: Any | None = None) -> bool:
    """Whether ``comm``'s error handler is ``MPI.ERRORS_RETURN`` (frees the handle ``Get_errhandler``
    returns, as MPI requires)."""
    if MPI is None:
        from mpi4py import MPI
    eh = comm.Get_errhandler()
    try:
        return eh == MPI.ERRORS_RETURN
    finally:
        if eh != MPI.ERRORS_RETURN and eh != MPI.ERRORS_ARE_FATAL:
            eh.Free()


@dataclass
class AbandonReport:
    """What :func:`abandon_requests` did, by count: ``completed`` (done, or completed in error, before or
    after the cancel), ``cancelled``, ``freed`` (still active after ``wait_s``: ``MPI_Request_free``,
    buffer kept), ``kept`` (non-blocking collectives: neither cancellable nor freeable), ``errors`` (the
    ``MPI.Exception`` texts seen while testing: a peer's death shows here)."""

    completed: int = 0
    cancelled: int = 0
    freed: int = 0
    kept: int = 0
    errors: list[str] = field(default_factory=list)


def merge_reports(*reports: AbandonReport) -> AbandonReport:
    """One :class:`AbandonReport` with the counts and errors of ``reports`` added up (pure)."""
    out = AbandonReport()
    for r in reports:
        out.completed += r.completed
        out.cancelled += r.cancelled
        out.freed += r.freed
        out.kept += r.kept
        out.errors += r.errors
    return out


def reap_lingering(MPI: Any | None = None) -> int:
    """Test every request of :data:`LINGERING` once and drop those that completed (or completed in error)
    with their buffers; returns how many are left. Local: no call here waits for another process."""
    if MPI is None:
        from mpi4py import MPI
    left = []
    for req, buf in LINGERING:
        try:
            if req.Test():
                continue
        except MPI.Exception:
            continue  # completed in error: nothing of it is posted any more
        left.append((req, buf))
    LINGERING[:] = left
    return len(left)


def abandon_requests(p2p: Iterable[tuple[Any, Any]], collectives: Iterable[tuple[Any, Any]] = (),
                     MPI: Any | None = None, wait_s: float = 0.1, poll_s: float = 0.001,
                     linger: bool = False) -> AbandonReport:
    """Leave nothing of an abandoned generation posted (rule 2 of the module doc). Local: no call here
    waits for another process.

    Args:
        p2p: ``(request, buffer)`` of point-to-point requests (``Isend``/``Irecv``); ``buffer`` is what
            the request reads or writes (kept alive if the request has to be freed while active).
        collectives: ``(request, buffers)`` of non-blocking collectives; kept referenced, never waited on.
        MPI: the ``mpi4py.MPI`` module (default: imported).
        wait_s: how long cancelled requests may take to complete before they are freed, seconds (0: tested
            once more after the cancel, then freed: for requests to a peer known dead, which cannot complete).
        linger: requests to peers that live on (a local recovery): one still active after ``wait_s`` is not
            freed but put in :data:`LINGERING` (counted ``freed``), whose completed requests
            :func:`reap_lingering` drops with their buffers.

    Returns:
        :class:`AbandonReport`.
    """
    if MPI is None:
        from mpi4py import MPI
    rep = AbandonReport()
    active = []
    for req, buf in p2p:
        if req is None or req == MPI.REQUEST_NULL:
            continue
        try:
            if req.Test():
                rep.completed += 1
                continue
        except MPI.Exception as exc:  # completed in error (e.g. the peer is gone): nothing left posted
            rep.completed += 1
            rep.errors.append(str(exc))
            continue
        try:
            req.Cancel()
        except MPI.Exception as exc:
            rep.errors.append(str(exc))
        active.append((req, buf))
    deadline = time.monotonic() + wait_s
    while active:
        still = []
        for req, buf in active:
            try:
                status = MPI.Status()
                if req.Test(status):
                    if status.Is_cancelled():
                        rep.cancelled += 1
                    else:
                        rep.completed += 1
                    continue
            except MPI.Exception as exc:
                rep.completed += 1
                rep.errors.append(str(exc))
                continue
            still.append((req, buf))
        active = still
        if not active or time.monotonic() >= deadline:
            break
        time.sleep(poll_s)
    for req, buf in active:
        rep.freed += 1
        if linger:
            LINGERING.append((req, buf))
            continue
        try:
            req.Free()
        except MPI.Exception as exc:
            rep.errors.append(str(exc))
        KEPT_BUFFERS.append(buf)
    for req, bufs in collectives:
        if req is None or req == MPI.REQUEST_NULL:
            continue
        KEPT_BUFFERS.append((req, bufs))
        rep.kept += 1
    return rep
