"""A recovery's transfers from several peers at once, sent from buffers already in host memory, while the
member does its engine work (phoenix_hpc.launch.transfers, phoenix_hpc.runtime.h2h.drive_transfers,
phoenix_hpc.runtime.snapshot.param_part). Real MPI on COMM_WORLD (one process, a thread per side) where
bytes move; fake requests where only the order of posts is asked."""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np
import pytest
import torch
from mpi4py import MPI

from phoenix_hpc.errors import ReplicationError
from phoenix_hpc.launch.transfers import sources_ready
from phoenix_hpc.recovery.plan import Transfer
from phoenix_hpc.runtime import h2h
from phoenix_hpc.runtime.h2h import BufferTransfer, drive_transfers
from phoenix_hpc.runtime.snapshot import OPT, PARAM, copy_in, param_part, plan_layout, seal, seal_part, unpack


def _snapshot(step: int = 5) -> torch.Tensor:
    """A rank's sealed local snapshot: an optimizer part and a param part of mixed dtypes."""
    opt = [("opt/m", torch.arange(1000, dtype=torch.float32)), ("opt/v", torch.full((33,), 2.0))]
    par = [("param/b", torch.arange(7, dtype=torch.bfloat16)), ("param/w", torch.linspace(0, 1, 2500))]
    meta = {"shard_id": "opt/pp0/tp0/dp1", "step": step, "generation": 3, "grid": {"dp": 2}, "coord": {"dp": 1},
            "envelope": {"step": step}}
    layout = plan_layout(opt, par, meta)
    buf = torch.zeros(layout.total_bytes, dtype=torch.uint8)
    copy_in(buf, layout, opt, par)
    seal(buf, layout, shard_id="opt/pp0/tp0/dp1", step=step, generation=3, grid={"dp": 2}, coord={"dp": 1},
         envelope={"step": step})
    return buf


def test_the_param_part_of_a_snapshot_reads_as_the_sealed_param_shard_without_a_copy():
    buf = _snapshot()
    head, body = param_part(buf, "param/pp0/tp0")
    assert np.shares_memory(body, buf.numpy())  # the tensor bytes are not copied
    whole = torch.from_numpy(np.concatenate([head, body]))
    u = unpack(whole, (PARAM,))
    ref = unpack(seal_part([("param/w", torch.linspace(0, 1, 2500)), ("param/b", torch.arange(7, dtype=torch.bfloat16))],
                           PARAM, "param/pp0/tp0", 5, 3), (PARAM,))
    assert (u.shard_id, u.step) == ("param/pp0/tp0", 5)
    assert u.tensors.keys() == ref.tensors.keys()
    for n, t in ref.tensors.items():
        assert u.tensors[n].dtype == t.dtype and torch.equal(u.tensors[n], t)
    # the checksums travel: a byte flipped in the body is caught on arrival
    body = body.copy()
    body[len(body) // 2] ^= 0x40
    with pytest.raises(ReplicationError, match="fails its checksum"):
        unpack(torch.from_numpy(np.concatenate([head, body])), (PARAM,))


def test_a_snapshot_sealed_without_its_param_checksums_is_not_offered_as_parameters():
    opt = [("opt/m", torch.ones(10))]
    par = [("param/w", torch.ones(10))]
    meta = {"shard_id": "s", "step": 1, "generation": 0, "grid": {}, "coord": {}, "envelope": {}}
    layout = plan_layout(opt, par, meta)
    buf = torch.zeros(layout.total_bytes, dtype=torch.uint8)
    copy_in(buf, layout, opt, par)
    seal(buf, layout, shard_id="s", step=1, generation=0, grid={}, coord={}, envelope={}, parts=(OPT,))
    with pytest.raises(ReplicationError, match="has no param checksums"):
        param_part(buf, "param/pp0/tp0")


def test_a_head_and_body_arrive_as_one_buffer_in_windowed_chunks():
    buf = _snapshot()
    head, body = param_part(buf, "param/pp0/tp0")
    c = MPI.COMM_WORLD
    box = {}
    send = BufferTransfer(c, 0, 5, 512, "test send", arr=(head, body))
    recv = BufferTransfer(c, 0, 5, 512, "test receive")
    t = threading.Thread(target=lambda: box.setdefault("e", drive_transfers([send], 20.0)))
    t.start()
    drive_transfers([recv], 20.0)
    t.join(30)
    assert bytes(recv.buf.numpy()) == bytes(np.concatenate([head, body]))
    assert unpack(recv.buf, (PARAM,)).shard_id == "param/pp0/tp0"


class FakeReq:
    def __init__(self, log, what):
        self.log, self.what, self.done, self.cancelled, self.freed = log, what, False, False, False

    def Test(self, status=None):
        return self.done

    def Cancel(self):
        self.cancelled = True

    def Free(self):
        self.freed = True


class FakeComm:
    """Records every post as (kind, peer, tag); requests complete only when the test says so."""

    def __init__(self):
        self.posts, self.reqs = [], []

    def Get_attr(self, key):
        return MPI.COMM_WORLD.Get_attr(key)

    def _req(self, kind, peer, tag, buf):
        r = FakeReq(self.posts, (kind, peer, tag))
        if kind == "recv" and tag == h2h.ANNOUNCE_TAG:
            buf[:] = (5, 0, 100)  # the peer announces 100 bytes of step 5
        self.posts.append((kind, peer, tag))
        self.reqs.append(r)
        return r

    def Isend(self, buf, dest, tag):
        return self._req("send", dest, tag, buf)

    def Irecv(self, buf, source, tag):
        return self._req("recv", source, tag, buf)


def test_transfers_with_different_peers_go_at_once_and_with_one_peer_in_order():
    c = FakeComm()
    a1 = BufferTransfer(c, 1, 5, 64, "from 1, first")
    a2 = BufferTransfer(c, 1, 5, 64, "from 1, second")
    b = BufferTransfer(c, 2, 5, 64, "from 2")
    done, box = threading.Event(), {}

    def drive():
        try:
            drive_transfers([a1, a2, b], 10.0, poll_s=0.0005)
        except BaseException as exc:  # noqa: BLE001
            box["e"] = exc

    t = threading.Thread(target=drive)
    t.start()
    try:
        time.sleep(0.1)  # nothing completes yet: the first of peer 1 and the one of peer 2 posted, a2 waits
        assert sorted(c.posts) == [("recv", 1, h2h.ANNOUNCE_TAG), ("recv", 2, h2h.ANNOUNCE_TAG)]
        while t.is_alive():  # now every request completes a little after it is posted, as a network would
            for r in list(c.reqs):
                r.done = True
            time.sleep(0.002)
    finally:
        for r in list(c.reqs):
            r.done = True
        t.join(10)
    assert "e" not in box
    order = [p for p in c.posts if p[1] == 1]
    second_announce = [i for i, p in enumerate(order) if p[2] == h2h.ANNOUNCE_TAG][1]
    assert all(p[2] != h2h.ANNOUNCE_TAG for p in order[1:second_announce])  # a1's chunks all came first
    assert second_announce == 1 + len(h2h.chunk_ranges(100, 64))
    assert all(x.buf is not None and x.buf.numel() == 100 for x in (a1, a2, b))


def test_a_transfer_that_never_completes_times_out_naming_itself_and_leaves_nothing_posted():
    c = FakeComm()
    with pytest.raises(ReplicationError, match="from 7: no completion within the timeout .announce pending."):
        drive_transfers([BufferTransfer(c, 7, 5, 64, "from 7")], 0.05, poll_s=0.005)
    (req,) = c.reqs  # the announce receive: cancelled, and freed since the fake never completes it
    assert req.cancelled and req.freed


def _plan_transfers():
    return [Transfer("params", "param/pp0/tp0", 1, 4, 5),
            Transfer("optimizer", "opt/pp0/tp0/dp3", 2, 4, 5),
            Transfer("params_from_optimizer", "param/pp0/tp0", 3, 3, 5)]


class _Member:
    def __init__(self, world_rank, local):
        from types import SimpleNamespace

        self.env = SimpleNamespace(world_rank=world_rank)
        self.copies = SimpleNamespace(local_buffer=local.get)


def test_a_param_sender_without_its_snapshot_of_the_step_must_finish_its_engine_work_first():
    ts = _plan_transfers()
    assert sources_ready(_Member(1, {5: object()}), ts, 5)  # sends from its snapshot of step 5
    assert not sources_ready(_Member(1, {4: object()}), ts, 5)  # only an older one: sealed from the engine
    assert sources_ready(_Member(2, {}), ts, 5)  # an optimizer sender sends the replica it holds
    assert sources_ready(_Member(4, {}), ts, 5)  # a receiver sends nothing


class _Engine:
    def __init__(self):
        self.loaded = {}

    def load_param_shard(self, tensors):
        self.loaded["params"] = {n: t.clone() for n, t in tensors.items()}

    def load_optimizer_shard(self, tensors):
        self.loaded["optimizer"] = {n: t.clone() for n, t in tensors.items()}

    def load_envelope(self, env):
        self.loaded["envelope"] = env


def _spare(engine_box):
    """A joining spare (world rank 5, logical 1) whose two transfers come from world rank 9, logical 0 --
    communicator rank 0, this process: a thread plays the sender."""
    from types import SimpleNamespace

    from phoenix_hpc.launch import transfers as T
    from phoenix_hpc.topology import GridCoord

    res = SimpleNamespace(chunk_bytes=1024, collective_timeout_s=20.0)
    m = SimpleNamespace(env=SimpleNamespace(world_rank=5, cfg=SimpleNamespace(resilience=res)),
                        rank_map={0: 9, 1: 5}, comm=MPI.COMM_WORLD, coord=GridCoord(pp=0, dp=1, tp=0),
                        generation=4, copies=SimpleNamespace(local_buffer=lambda step: None))
    m.engine = None
    plan = [Transfer("params", "param/pp0/tp0", 9, 5, 5),
            Transfer("optimizer", "opt/pp0/tp0/dp1", 9, 5, 5)]

    def build():  # the spare's engine construction: takes a while, the buffers arrive meanwhile
        time.sleep(0.3)
        m.engine = engine_box["engine"] = _Engine()

    return T, m, plan, build


def _send_both(buf, box):
    from phoenix_hpc.runtime.snapshot import read_header

    head, body = param_part(buf, "param/pp0/tp0")
    replica = buf.numpy()[: read_header(buf).opt_end]
    try:
        drive_transfers([BufferTransfer(MPI.COMM_WORLD, 0, 5, 1024, "params", arr=(head, body)),
                         BufferTransfer(MPI.COMM_WORLD, 0, 5, 1024, "optimizer", arr=replica)], 20.0)
    except BaseException as exc:  # noqa: BLE001
        box["e"] = exc


@pytest.mark.parametrize("threads", [True, False])
def test_a_spare_builds_its_engine_while_its_buffers_arrive_and_loads_them_after(monkeypatch, threads):
    from phoenix_hpc.launch import transfers as T

    if not threads:  # an MPI library without MPI_THREAD_MULTIPLE: the engine first, then the transfers
        monkeypatch.setattr(T, "_threads_ok", lambda: False)
    buf, box, eng = _snapshot(), {}, {}
    T, m, plan, build = _spare(eng)
    sender = threading.Thread(target=_send_both, args=(buf, box))
    sender.start()
    try:
        out = T.run(m, plan, 5, during=build)
    finally:
        sender.join(30)
    assert "e" not in box
    loaded = eng["engine"].loaded
    assert torch.equal(loaded["params"]["param/w"], torch.linspace(0, 1, 2500))
    assert torch.equal(loaded["optimizer"]["opt/m"], torch.arange(1000, dtype=torch.float32))
    assert loaded["envelope"] == {"step": 5}
    assert out.during_s >= 0.3
    if threads:  # both were on the wire while the engine was built: nothing left to wait for after it
        assert max(out.wire.values()) < out.during_s
    else:
        assert min(out.wire.values()) >= out.during_s
    assert out.params_s < 0.25 and out.optimizer_s < 0.25  # loads (and in the fallback the wire) only


def test_a_received_buffer_of_another_shard_is_refused_before_it_is_loaded():
    from phoenix_hpc.errors import RecoveryError

    buf, box, eng = _snapshot(), {}, {}
    T, m, plan, build = _spare(eng)
    plan[1] = dataclasses.replace(plan[1], shard_id="opt/pp0/tp0/dp0")  # the plan asks for another shard than the one that comes
    sender = threading.Thread(target=_send_both, args=(buf, box))
    sender.start()
    try:
        with pytest.raises(RecoveryError, match="received replica is opt/pp0/tp0/dp1 step 5, expected opt/pp0/tp0/dp0"):
            T.run(m, plan, 5, during=build)
    finally:
        sender.join(30)
    assert "optimizer" not in eng["engine"].loaded


def test_an_engine_work_that_fails_ends_the_transfers_at_once_not_after_their_timeout():
    eng = {}
    T, m, plan, _ = _spare(eng)  # nobody sends: the receives would wait for their whole timeout (20 s)

    def build():
        time.sleep(0.1)
        raise RuntimeError("engine construction failed")

    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="engine construction failed"):
        T.run(m, plan, 5, during=build)
    assert time.monotonic() - t0 < 3.0


def test_the_timeout_of_a_receive_counts_from_the_end_of_the_own_engine_work():
    """A sender that builds its engine first (the rebuild path) starts late; the spare's own construction
    time must not be taken from the timeout of its receives."""
    buf, box, eng = _snapshot(), {}, {}
    T, m, plan, _ = _spare(eng)
    m.env.cfg.resilience.collective_timeout_s = 0.5

    def build():
        time.sleep(0.8)  # longer than the timeout
        m.engine = eng["engine"] = _Engine()

    def late_sender():
        time.sleep(1.0)  # starts after the spare's construction, within the timeout of its end
        _send_both(buf, box)

    sender = threading.Thread(target=late_sender)
    sender.start()
    try:
        T.run(m, plan, 5, during=build)
    finally:
        sender.join(30)
    assert "e" not in box and set(eng["engine"].loaded) == {"params", "optimizer", "envelope"}


def test_a_param_sender_without_its_snapshot_rolls_back_first_then_seals_from_the_engine():
    """Without a local snapshot of the step, the parameters are sealed from the engine, so the engine work
    (its rollback) must be done before the seal: run() does it first and sends S(step), not the live state."""
    from types import SimpleNamespace

    from phoenix_hpc.launch import transfers as T
    from phoenix_hpc.runtime.h2h import recv_buffer
    from phoenix_hpc.topology import GridCoord

    events = []

    class Engine:
        w = torch.full((4,), 7.0)  # the live state, past the step

        def param_shard(self):
            events.append("seal")
            return [("param/w", self.w)]

    res = SimpleNamespace(chunk_bytes=1024, collective_timeout_s=20.0)
    m = SimpleNamespace(env=SimpleNamespace(world_rank=5, cfg=SimpleNamespace(resilience=res)),
                        rank_map={0: 9, 1: 5}, comm=MPI.COMM_WORLD, coord=GridCoord(pp=0, dp=1, tp=0),
                        generation=4, copies=SimpleNamespace(local_buffer=lambda step: None), engine=Engine())

    def rollback():
        events.append("rollback")
        m.engine.w = torch.full((4,), 3.0)  # S(step)

    plan = [Transfer("params", "param/pp0/tp0", 5, 9, 5)]
    box = {}
    rx = threading.Thread(target=lambda: box.setdefault("buf", recv_buffer(MPI.COMM_WORLD, 0, 5, 1024, 20.0, "rx")))
    rx.start()
    try:
        out = T.run(m, plan, 5, during=rollback)
    finally:
        rx.join(30)
    assert events == ["rollback", "seal"]
    assert torch.equal(unpack(box["buf"], (PARAM,)).tensors["param/w"], torch.full((4,), 3.0))
    assert out.during_s > 0


class _Cut(Exception):
    pass


@pytest.mark.parametrize("threads", [True, False])
def test_a_check_that_raises_ends_the_transfers_at_once_and_leaves_nothing_posted(monkeypatch, threads):
    """The member's check (the coordinator re-planned: a newer quiesce) ends transfers whose peer never
    comes, long before their timeout, and what it raises propagates; no receive stays posted."""
    from phoenix_hpc.runtime import mpi_faults

    if not threads:
        monkeypatch.setattr(__import__("phoenix_hpc.launch.transfers", fromlist=["x"]), "_threads_ok", lambda: False)
    abandoned = []
    real = mpi_faults.abandon_requests

    def record(pending):
        abandoned.extend(pending)
        return real(pending)

    monkeypatch.setattr(mpi_faults, "abandon_requests", record)
    eng = {}
    T, m, plan, build = _spare(eng)  # nobody sends: the receives would wait for their whole timeout (20 s)
    calls = []
    t0 = time.monotonic()

    def check():
        calls.append(time.monotonic() - t0)
        if calls[-1] > 0.2:
            raise _Cut("newer quiesce")

    with pytest.raises(_Cut):
        T.run(m, plan, 5, during=lambda: None, check=check)
    assert time.monotonic() - t0 < 3.0 and len(calls) > 1
    assert abandoned, "the posted receives were not abandoned"


def test_a_transfer_thread_stuck_in_mpi_makes_the_slot_leave_instead_of_answering(monkeypatch):
    """The thread that drives the transfers does not come back after their end (the MPI library deadlocked
    on a dead peer's connection): the member cannot take part in another generation, so what the check raised
    gives way to TransportWedged (the slot leaves and a spare replaces it)."""
    from phoenix_hpc.errors import TransportWedged
    from phoenix_hpc.runtime import h2h

    monkeypatch.setattr(h2h, "ABANDON_JOIN_S", 0.2)
    release = threading.Event()
    monkeypatch.setattr(h2h.TransferSet, "drive", lambda self, poll_s=0.001: release.wait(10))  # never leaves
    eng = {}
    T, m, plan, _ = _spare(eng)
    m.logical = 1

    def check():
        raise _Cut("newer quiesce")

    try:
        with pytest.raises(TransportWedged, match="did not leave MPI within 0.2 s"):
            T.run(m, plan, 5, during=lambda: None, check=check)
    finally:
        release.set()
