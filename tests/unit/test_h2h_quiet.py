"""The H2H engine thread does not wake up while nothing is in flight and nothing is expected (runtime/h2h.py,
the quiet state), and still receives a replica whose announce comes while it is quiet. Real MPI, one
process: the engine holds its own shard (owner = holder = rank 0 of a Dup of COMM_WORLD)."""

from __future__ import annotations

import threading
import time

import numpy as np
import torch
from mpi4py import MPI

from phoenix_hpc.runtime import h2h
from phoenix_hpc.runtime.buffers import PingPong

NBYTES = 4096
QUIET_S = 0.05


def _engine(comm, quiet_sleep_s=QUIET_S, idle_sleep_s=2e-3):
    pp = PingPong((torch.zeros(NBYTES, dtype=torch.uint8), torch.zeros(NBYTES, dtype=torch.uint8)), "held")
    spec = h2h.HeldSpec("opt/pp0/tp0/dp0", 0, NBYTES, pp)
    received: list[int] = []
    box: dict = {}

    def on_received(spec_, idx, step):  # what the protector's verify does, without the checksums
        pp.commit(idx, step)
        received.append(step)
        box["engine"].send_ack(spec_, step, h2h.ACK_OK, 0)

    tags = h2h.make_tag_plan(1, h2h.tag_ub(comm))
    eng = h2h.H2HEngine(comm, [0], [spec], 0, NBYTES, tags, on_received, idle_sleep_s=idle_sleep_s,
                        quiet_sleep_s=quiet_sleep_s)
    box["engine"] = eng
    return eng, received


def _wakeups_over(eng, seconds):
    w0 = eng.wakeups
    time.sleep(seconds)
    return eng.wakeups - w0


def test_a_quiet_engine_sleeps_until_a_command_or_the_quiet_bound():
    comm = MPI.COMM_WORLD.Dup()
    eng, received = _engine(comm)
    eng.start(threaded=True)
    try:
        # nothing sent yet: quiet; at most one wake-up per QUIET_S (the 2 ms back-off would give ~200)
        assert _wakeups_over(eng, 0.4) <= 0.4 / QUIET_S + 3
        src = np.arange(NBYTES, dtype=np.int64).astype(np.uint8)
        for step in (1, 2):
            eng.send_replica(step, src)
            assert eng.wait(lambda s=step: 0 in eng.acks.get(s, {}), 10.0), eng.describe()
        assert received == [1, 2] and eng.sent_step == 2
        # own replica acknowledged, the held replica of the same step received: quiet again
        assert eng.wait(eng._quiet, 5.0)
        assert _wakeups_over(eng, 0.4) <= 0.4 / QUIET_S + 3
    finally:
        eng.stop()
        comm.Free()


def test_while_a_held_replica_of_the_own_step_is_missing_the_engine_keeps_polling():
    comm = MPI.COMM_WORLD.Dup()
    eng, _ = _engine(comm)
    try:
        inc = eng._incoming[0]
        assert eng._quiet()  # nothing sent, nothing held yet
        eng.sent_step = 5
        assert not eng._quiet()  # its owner's replica of step 5 is expected
        inc.received = 4
        assert not eng._quiet()
        inc.received = 5
        assert eng._quiet()
        eng._fences.append((5, None, None, None))
        assert not eng._quiet()  # a fence needs this rank's progress
        eng._fences.clear()
        eng._acks_out.append((None, None))
        assert not eng._quiet()
        eng._acks_out.clear()
        eng._barrier = [None, False]
        assert not eng._quiet()
        eng._barrier = [None, True]
        assert eng._quiet()
    finally:
        comm.Free()


def test_an_announce_that_comes_while_the_engine_is_quiet_is_received_within_the_quiet_bound():
    comm = MPI.COMM_WORLD.Dup()
    eng, received = _engine(comm)
    arrived = threading.Event()
    eng.on_received = lambda spec, idx, step: (received.append(step), arrived.set())
    eng.start(threaded=True)
    try:
        time.sleep(0.2)
        assert eng._quiet()
        # another owner's replica (here: sent from this thread, as a peer would), announced unexpectedly
        payload = np.full(NBYTES, 7, dtype=np.uint8)
        announce = np.array([3, 0, NBYTES], dtype=np.int64)
        t0 = time.monotonic()
        reqs = [comm.Isend([announce, MPI.INT64_T], dest=0, tag=h2h.ANNOUNCE_TAG),
                comm.Isend([payload, MPI.BYTE], dest=0, tag=eng.tags.data_tag(3, 0))]
        assert arrived.wait(5.0)
        took = time.monotonic() - t0
        MPI.Request.Waitall(reqs)
        assert received == [3] and eng._incoming[0].received == 3 and took < QUIET_S + 0.5, took
        assert bool((eng._incoming[0].spec.pingpong.bufs[0] == 7).all())  # the write target (nothing committed)
    finally:
        eng.stop()
        comm.Free()
