"""The H2H engine thread does not wake up while nothing is in flight and nothing is expected (runtime/h2h.py,
the quiet state), wakes at once for a command, still receives a replica whose announce comes while it is
quiet, and does not spin while stop() waits for its own sends. Real MPI, one process: the engine holds its
own shard (owner = holder = rank 0 of a Dup of COMM_WORLD)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from mpi4py import MPI

from phoenix_hpc.runtime import h2h
from phoenix_hpc.runtime.buffers import PingPong

NBYTES = 4096
QUIET_S = 0.05


def _engine(comm, quiet_sleep_s=QUIET_S, ack=True):
    pp = PingPong((torch.zeros(NBYTES, dtype=torch.uint8), torch.zeros(NBYTES, dtype=torch.uint8)), "held")
    spec = h2h.HeldSpec("opt/pp0/tp0/dp0", 0, NBYTES, pp)
    received: list[tuple] = []
    box: dict = {}

    def on_received(spec_, idx, step):  # what the protector's verify does, without the checksums
        pp.commit(idx, step)
        received.append((spec_, step))
        if ack:
            box["engine"].send_ack(spec_, step, h2h.ACK_OK, 0)

    tags = h2h.make_tag_plan(1, h2h.tag_ub(comm))
    eng = h2h.H2HEngine(comm, [0], [spec], 0, NBYTES, tags, on_received, quiet_sleep_s=quiet_sleep_s)
    box["engine"] = eng
    return eng, received


def _wakeups_per_s(eng, seconds):
    w0, t0 = eng.wakeups, time.monotonic()
    time.sleep(seconds)
    return (eng.wakeups - w0) / (time.monotonic() - t0)


def _payload():
    return np.arange(NBYTES, dtype=np.int64).astype(np.uint8)


def test_a_quiet_engine_sleeps_until_a_command_or_the_quiet_bound():
    comm = MPI.COMM_WORLD.Dup()
    eng, received = _engine(comm)
    eng.start(threaded=True)
    try:
        # nothing expected yet: quiet, about one wake-up per QUIET_S (the 2 ms back-off gave ~470 a second)
        assert _wakeups_per_s(eng, 0.4) <= 1 / QUIET_S + 10
        for step in (1, 2):
            eng.expect(step)
            eng.send_replica(step, _payload())
            assert eng.wait(lambda s=step: 0 in eng.acks.get(s, {}), 10.0), eng.describe()
        assert [s for _, s in received] == [1, 2] and eng.expected_step == 2
        # own replica acknowledged, the held replica of the same step received: quiet again
        assert eng.wait(eng._quiet, 5.0)
        assert _wakeups_per_s(eng, 0.4) <= 1 / QUIET_S + 10
    finally:
        eng.stop()
        comm.Free()


def test_a_command_wakes_a_quiet_engine_at_once():
    comm = MPI.COMM_WORLD.Dup()
    eng, _ = _engine(comm, quiet_sleep_s=5.0)
    eng.start(threaded=True)
    try:
        time.sleep(0.2)
        assert eng._quiet()
        t0 = time.monotonic()
        eng.send_replica(1, _payload())  # announce, chunk, receive, acknowledgement: several rounds
        assert eng.wait(lambda: 0 in eng.acks.get(1, {}), 10.0), eng.describe()
        assert time.monotonic() - t0 < 1.0  # not one quiet sleep of 5 s
    finally:
        eng.stop()
        comm.Free()


def test_until_the_held_replica_of_the_expected_step_arrives_the_engine_is_not_quiet():
    comm = MPI.COMM_WORLD.Dup()
    eng, _ = _engine(comm)
    try:
        inc = eng._incoming[0]
        assert eng._quiet()  # nothing expected, nothing held yet
        eng._expect(5)
        assert not eng._quiet()  # this rank started protecting step 5: its owner's replica of 5 comes
        inc.received = 4
        assert not eng._quiet()
        inc.received = 5
        assert eng._quiet()
        eng._expect(3)  # an older step changes nothing
        assert eng.expected_step == 5 and eng._quiet()
        eng._fences.append((5, None, None, None))
        assert not eng._quiet()  # a fence needs this rank's progress
        eng._fences.clear()
        eng._acks_out.append((None, None))
        assert not eng._quiet()
        eng._acks_out.clear()
        eng._barrier_wanted = True
        assert not eng._quiet()
        eng._barrier_wanted, eng._barrier = False, [None, False]
        assert not eng._quiet()
        eng._barrier = [None, True]
        assert eng._quiet()
    finally:
        comm.Free()


def test_an_announce_that_comes_while_the_engine_is_quiet_is_received_within_the_quiet_bound():
    comm = MPI.COMM_WORLD.Dup()
    eng, received = _engine(comm)
    arrived = threading.Event()
    eng.on_received = lambda spec, idx, step: (received.append((spec, step)), arrived.set())
    eng.start(threaded=True)
    try:
        time.sleep(0.2)
        assert eng._quiet()
        # another owner's replica (here: sent from this thread, as a peer would), before this rank expects it
        payload = np.full(NBYTES, 7, dtype=np.uint8)
        announce = np.array([3, 0, NBYTES], dtype=np.int64)
        t0 = time.monotonic()
        reqs = [comm.Isend([announce, MPI.INT64_T], dest=0, tag=h2h.ANNOUNCE_TAG),
                comm.Isend([payload, MPI.BYTE], dest=0, tag=eng.tags.data_tag(3, 0))]
        assert arrived.wait(5.0)
        took = time.monotonic() - t0
        MPI.Request.Waitall(reqs)
        assert [s for _, s in received] == [3] and eng._incoming[0].received == 3
        assert took < QUIET_S + 0.15, took  # the quiet bound, plus scheduling on a loaded machine
        assert bool((eng._incoming[0].spec.pingpong.bufs[0] == 7).all())  # the write target (nothing committed)
    finally:
        eng.stop()
        comm.Free()


def test_stop_waiting_for_an_acknowledgement_backs_off_instead_of_spinning():
    comm = MPI.COMM_WORLD.Dup()
    eng, received = _engine(comm, ack=False)  # the holder side does not acknowledge until told below
    eng.start(threaded=True)
    stopper = threading.Thread(target=eng.stop, kwargs={"timeout_s": 20.0})
    try:
        eng.send_replica(1, _payload())
        assert eng.wait(lambda: bool(received), 10.0), eng.describe()
        stopper.start()  # wants the barrier, which waits for the acknowledgement of step 1
        time.sleep(0.1)
        # back-off to 2 ms at most: ~500 rounds a second; re-queueing the barrier every round spun thousands
        assert _wakeups_per_s(eng, 0.3) <= 700
        assert eng._barrier is None  # not posted while its own replica is unacknowledged
        spec, step = received[0]
        eng.send_ack(spec, step, h2h.ACK_OK, 0)
        stopper.join(10.0)
        assert not stopper.is_alive() and eng._barrier_done and 0 in eng.acks.get(1, {})
    finally:
        if not stopper.is_alive() and not eng._stop:
            eng.stop()
        comm.Free()


def test_the_fence_proposals_kept_are_the_newest_few_and_older_ones_are_refused():
    comm = MPI.COMM_WORLD.Dup()
    eng, _ = _engine(comm)
    eng.start(threaded=True)
    n = 3 * h2h.FENCES_KEPT  # a job fences once a step: a list of every proposal would grow with the job
    try:
        for i in range(n):
            eng.fence(i, interval=1 + i % 5)
        assert eng.wait(lambda: eng.fences_done == n, 10.0), eng.describe()
        assert eng.fenced_step == n - 1
        assert [eng.fenced_interval(i) for i in range(n - h2h.FENCES_KEPT, n)] == [
            1 + i % 5 for i in range(n - h2h.FENCES_KEPT, n)]
        for i in (n - h2h.FENCES_KEPT - 1, 0, n):  # dropped, dropped, not completed
            with pytest.raises(IndexError, match=f"fence {i}: {n} completed"):
                eng.fenced_interval(i)
    finally:
        eng.stop()
        comm.Free()


def test_an_engine_dropped_with_a_replica_in_flight_is_freed_without_the_cycle_collector():
    """An engine dropped while its own replica still waits for the holder's acknowledgement, its chunk window
    still in its lists (as a wedged engine leaves them: ``stop`` returns before it clears them), is freed by
    reference counting alone: the windows post through the communicator, not through the engine, so nothing
    refers back to it and its host buffers go at once, not at CPython's next full collection (which after
    ``gc.freeze`` may come only at the next recovery, or never for an engine frozen with the heap). With the
    windows' posting functions bound to the engine this fails."""
    import gc
    import weakref

    comm = MPI.COMM_WORLD.Dup()
    gc.collect()
    gc.disable()
    try:
        pp = PingPong((torch.zeros(NBYTES, dtype=torch.uint8), torch.zeros(NBYTES, dtype=torch.uint8)), "held")
        received: list = []

        def on_received(spec_, idx, step, pp=pp, received=received):  # no acknowledgement sent
            pp.commit(idx, step)
            received.append((spec_, step))

        eng = h2h.H2HEngine(comm, [0], [h2h.HeldSpec("opt/pp0/tp0/dp0", 0, NBYTES, pp)], 0, NBYTES,
                            h2h.make_tag_plan(1, h2h.tag_ub(comm)), on_received, quiet_sleep_s=QUIET_S)
        eng.start(threaded=False)
        eng.expect(1)
        eng.send_replica(1, _payload())
        for _ in range(2000):
            eng.poll()
            if [s for _, s in received] == [1] and eng._outgoing and eng._outgoing[0].chunks is not None:
                break
            time.sleep(0.001)
        assert [s for _, s in received] == [1] and eng._outgoing[0].chunks.views, eng.describe()
        ref = weakref.ref(eng)
        del eng
        assert ref() is None, [type(r).__name__ for r in gc.get_referrers(ref())]
    finally:
        gc.enable()
        comm.Free()
