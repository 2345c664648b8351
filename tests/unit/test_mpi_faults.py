"""Leaving nothing of an abandoned generation posted (phoenix_hpc.runtime.mpi_faults), with a fake MPI:
the decisions only. The real MPI behaviour with a killed peer is tests/e2e/test_mpi_dead_peer.py."""

from types import SimpleNamespace

import pytest

from phoenix_hpc.runtime import mpi_faults
from phoenix_hpc.runtime.mpi_faults import abandon_requests, errors_return


class MPIException(Exception):
    pass


class Status:
    def __init__(self):
        self.cancelled = False

    def Is_cancelled(self):
        return self.cancelled


NULL = object()


class Req:
    """``mode``: done | error | cancellable | stuck (Open MPI's started send: Cancel does nothing)."""

    def __init__(self, mode):
        self.mode, self.cancel_called, self.freed = mode, False, False

    def __eq__(self, other):
        return other is self

    __hash__ = object.__hash__

    def Test(self, status=None):
        if self.mode == "done":
            return True
        if self.mode == "error":
            raise MPIException("MPI_ERR_PROC_FAILED: peer gone")
        if self.mode == "cancellable" and self.cancel_called:
            if status is not None:
                status.cancelled = True
            return True
        return False

    def Cancel(self):
        self.cancel_called = True

    def Free(self):
        self.freed = True


MPI = SimpleNamespace(Exception=MPIException, Status=Status, REQUEST_NULL=NULL, COMM_NULL=NULL,
                      ERRORS_RETURN="ERRORS_RETURN")


@pytest.fixture(autouse=True)
def _empty_kept():
    mpi_faults.KEPT_BUFFERS.clear()
    mpi_faults.LINGERING.clear()
    yield
    mpi_faults.KEPT_BUFFERS.clear()
    mpi_faults.LINGERING.clear()


def test_each_request_is_completed_cancelled_or_freed_and_freed_buffers_are_kept():
    done, err, canc, stuck = Req("done"), Req("error"), Req("cancellable"), Req("stuck")
    coll = Req("stuck")
    bufs = {r: object() for r in (done, err, canc, stuck)}
    rep = abandon_requests([(r, bufs[r]) for r in (done, err, canc, stuck)] + [(NULL, None), (None, None)],
                           [(coll, ("send", "recv"))], MPI=MPI, wait_s=0.05)
    assert (rep.completed, rep.cancelled, rep.freed, rep.kept) == (2, 1, 1, 1)
    assert rep.errors == ["MPI_ERR_PROC_FAILED: peer gone"]
    assert canc.cancel_called and not canc.freed
    assert stuck.cancel_called and stuck.freed
    assert not done.cancel_called and not err.cancel_called
    assert not coll.cancel_called and not coll.freed  # a non-blocking collective is neither cancelled nor freed
    assert mpi_faults.KEPT_BUFFERS == [bufs[stuck], (coll, ("send", "recv"))]


def test_errors_return_sets_the_handler_and_leaves_comm_null_alone():
    calls = []
    comm = SimpleNamespace(Set_errhandler=calls.append)
    assert errors_return(comm, MPI) is comm and calls == ["ERRORS_RETURN"]
    assert errors_return(NULL, MPI) is NULL


def test_requests_with_live_peers_linger_unfreed_and_go_with_their_buffers_once_they_complete():
    """A local recovery: every peer lives on, so a started transfer that could not be cancelled finishes once
    both sides progress MPI. It is not freed (a freed request's buffer had to be kept for the life of the
    process, one generation's host buffers per recovery) but lingers until :func:`reap_lingering` sees it
    complete; one that never completes stays, as it would have been kept."""
    from phoenix_hpc.runtime.mpi_faults import reap_lingering

    later, never, failing = Req("stuck"), Req("stuck"), Req("stuck")
    bufs = {r: object() for r in (later, never, failing)}
    rep = abandon_requests([(r, bufs[r]) for r in (later, never, failing)], MPI=MPI, wait_s=0.0, linger=True)
    assert rep.freed == 3 and not any(r.freed for r in (later, never, failing))
    assert mpi_faults.KEPT_BUFFERS == [] and len(mpi_faults.LINGERING) == 3
    later.mode, failing.mode = "done", "error"  # the peer progressed: it completed (in error, for one)
    assert reap_lingering(MPI) == 1
    assert mpi_faults.LINGERING == [(never, bufs[never])]
