"""MPI waits that sleep instead of spinning (phoenix_hpc.runtime.polled): a rank that waits long for the
last member burns almost no CPU, gives up after its bound, and a real Ibarrier completes."""

from __future__ import annotations

import time

import pytest
from mpi4py import MPI

from phoenix_hpc.errors import RecoveryError
from phoenix_hpc.runtime import polled


class LateRequest:
    """Completes ``after_s`` seconds after it was made (a member that arrives late)."""

    def __init__(self, after_s: float):
        self.at = time.monotonic() + after_s
        self.tests = 0

    def Test(self):
        self.tests += 1
        return time.monotonic() >= self.at


def test_a_long_wait_sleeps_instead_of_spinning():
    req = LateRequest(0.3)
    cpu0 = time.thread_time()
    waited = polled.wait(req, 5.0, "test")
    cpu = time.thread_time() - cpu0
    assert 0.25 <= waited < 2.0  # the request was made just before the wait began
    assert cpu < 0.1 * waited, f"{cpu:.3f} s of CPU for {waited:.3f} s of waiting"
    assert req.tests < 0.3 / 0.001 + 10  # about one test per poll interval, not a busy loop


def test_a_member_that_never_arrives_is_reported_after_the_bound():
    with pytest.raises(RecoveryError, match="waiting for rank 3: not complete within 0.05 s"):
        polled.wait(LateRequest(60.0), 0.05, "waiting for rank 3")


def test_a_barrier_on_a_real_communicator_completes():
    assert polled.barrier(MPI.COMM_WORLD, 5.0, "test barrier") < 5.0


def test_a_check_between_the_tests_ends_the_wait_with_what_it_raises():
    """The restore phase hands its waits a check that raises when the coordinator re-planned: the wait ends
    at once (not after its bound) with that error, and a request that completes is not checked again."""
    req, calls = LateRequest(60.0), []

    def check():
        calls.append(req.tests)
        if len(calls) == 3:
            raise KeyError("re-planned")

    t0 = time.monotonic()
    with pytest.raises(KeyError, match="re-planned"):
        polled.wait(req, 30.0, "test", poll_s=0.001, check=check)
    assert time.monotonic() - t0 < 1.0 and calls == [1, 2, 3]
    done = LateRequest(0.0)
    assert polled.wait(done, 1.0, "test", check=lambda: pytest.fail("checked a completed wait")) >= 0.0
