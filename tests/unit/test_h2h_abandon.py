"""H2HEngine.stop(abandon=True) when the engine thread never leaves an MPI call (runtime/h2h.ABANDON_JOIN_S).
The engine is assembled without MPI: only the stop logic is under test."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from phoenix_hpc.runtime import h2h


class _Req:
    def __init__(self, calls: list):
        self.calls = calls

    def Cancel(self):
        self.calls.append("Cancel")

    def Wait(self):
        self.calls.append("Wait")

    def Test(self):
        self.calls.append("Test")
        return True

    def Free(self):
        self.calls.append("Free")


def _engine(target) -> tuple[h2h.H2HEngine, list]:
    calls: list = []
    eng = object.__new__(h2h.H2HEngine)
    eng._cv = threading.Condition()
    eng._stop, eng.error, eng.wedged, eng.abandon_report = False, None, False, None
    eng._MPI = SimpleNamespace(REQUEST_NULL=None, Exception=RuntimeError)
    eng._incoming = [SimpleNamespace(spec=SimpleNamespace(owner=1), announce_req=_Req(calls), announce=None,
                                     chunks=None)]
    eng._outgoing, eng._acks_out, eng._fences, eng._barrier = [], [], [], None
    eng._thread = threading.Thread(target=target, args=(eng,), daemon=True)
    eng._thread.start()
    return eng, calls


def test_a_thread_stuck_in_mpi_is_left_behind_within_the_bound_and_mpi_is_not_touched_again():
    release = threading.Event()
    eng, calls = _engine(lambda e: release.wait())  # stands for a call that never returns
    t0 = time.monotonic()
    eng.stop(abandon=True, abandon_join_s=0.2)
    took = time.monotonic() - t0
    try:
        assert eng.wedged and 0.15 < took < 2.0, took
        assert calls == [] and eng.abandon_report is None  # no Cancel/Wait: it could block this thread too
    finally:
        release.set()


def test_a_thread_that_leaves_its_poll_is_not_wedged_and_its_requests_are_abandoned():
    def poll(e):
        while True:
            with e._cv:
                if e._stop:
                    return
            time.sleep(0.001)

    eng, calls = _engine(poll)
    eng.stop(abandon=True, abandon_join_s=2.0)
    assert not eng.wedged and not eng._thread.is_alive()
    assert eng.abandon_report is not None and eng.abandon_report.completed == 1 and calls == ["Test"]


class _Stuck:
    """A request that never completes and cannot be cancelled (Open MPI's started send to a lost peer)."""

    def __init__(self):
        self.tests, self.freed = 0, False

    def Test(self, status=None):
        self.tests += 1
        return False

    def Cancel(self):
        pass

    def Free(self):
        self.freed = True


def test_requests_to_a_dead_peer_are_freed_after_one_test_the_others_get_the_wait(monkeypatch):
    from phoenix_hpc.runtime import mpi_faults

    monkeypatch.setattr(mpi_faults, "KEPT_BUFFERS", [])
    monkeypatch.setattr(mpi_faults, "LINGERING", [])
    eng = object.__new__(h2h.H2HEngine)
    eng._MPI = SimpleNamespace(REQUEST_NULL=None, Exception=RuntimeError,
                               Status=lambda: SimpleNamespace(Is_cancelled=lambda: False))
    from_dead, from_live, to_dead, ack_to_live = _Stuck(), _Stuck(), _Stuck(), _Stuck()
    eng._incoming = [SimpleNamespace(spec=SimpleNamespace(owner=1), announce_req=from_dead, announce="a1", chunks=None),
                     SimpleNamespace(spec=SimpleNamespace(owner=2), announce_req=from_live, announce="a2", chunks=None)]
    eng._outgoing = [SimpleNamespace(holder=1, announce_req=to_dead, announce="o", ack_req=None, ack="k",
                                     view="v", chunks=SimpleNamespace(reqs=[]))]
    eng._acks_out = [(ack_to_live, "ack", 2)]
    eng._fences, eng._barrier = [], None
    rep = eng._abandon_posted(frozenset({1}))
    assert (rep.freed, rep.completed, rep.cancelled) == (4, 0, 0)
    assert from_dead.tests == to_dead.tests == 2  # the first test, one round, freed: no wait for a lost peer
    assert from_live.tests > 10 and ack_to_live.tests > 10  # tested through the wait (0.1 s, 1 ms apart)
    assert from_dead.freed and to_dead.freed  # a lost peer's: freed, their buffers kept for good
    # a live peer's: left posted until a later abandon sees them complete (mpi_faults.reap_lingering)
    assert not from_live.freed and not ack_to_live.freed
    assert [r for r, _ in mpi_faults.LINGERING] == [from_live, ack_to_live]
    assert eng._incoming == [] and eng._outgoing == [] and eng._acks_out == []


def test_merge_reports_adds_the_counts_and_errors():
    from phoenix_hpc.runtime.mpi_faults import AbandonReport, merge_reports

    a = AbandonReport(completed=1, cancelled=2, freed=3, kept=0, errors=["x"])
    b = AbandonReport(completed=4, cancelled=0, freed=1, kept=2, errors=["y"])
    m = merge_reports(a, b)
    assert (m.completed, m.cancelled, m.freed, m.kept, m.errors) == (5, 2, 4, 2, ["x", "y"])
    assert merge_reports() == AbandonReport()
