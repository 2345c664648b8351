"""ArmedInstructions.take_injection: the fault trigger's rule for what is due, under the shared lock."""

from __future__ import annotations

import threading

from phoenix_hpc.control.armed import ArmedInstructions


class _CountingLock:
    """A lock that counts how often it was entered (which code paths hold it)."""

    def __init__(self):
        self._lock, self.entered = threading.Lock(), 0

    def __enter__(self):
        self._lock.acquire()
        self.entered += 1
        return self

    def __exit__(self, *exc):
        self._lock.release()


def _armed(*injections):
    a = ArmedInstructions(world_rank=1, pid=7, send=lambda msg: None)
    a.injections.extend(injections)
    return a


def test_take_injection_holds_the_lock_the_receiving_thread_arms_under():
    a = _armed({"type": "inject", "kind": "crash", "at_step": 9, "phase": "h2h", "request_id": "r1"})
    a.lock = _CountingLock()
    got = a.take_injection(9, "h2h")
    assert got is not None and got.request_id == "r1" and a.injections == []
    assert a.lock.entered == 1


def test_take_injection_fires_a_recovery_phase_at_the_first_recovery_at_or_after_its_step():
    # the fault trigger's rule (faults.trigger.is_due): a recovery's step is not known in advance
    a = _armed({"type": "inject", "kind": "crash", "at_step": 9, "phase": "restore", "request_id": "r2"})
    assert a.take_injection(8, "restore") is None
    got = a.take_injection(11, "restore")
    assert got is not None and got.request_id == "r2" and a.injections == []
