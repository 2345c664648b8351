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
    eng._incoming = [SimpleNamespace(announce_req=_Req(calls), announce=None, chunks=None)]
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
