"""A recovery's transfers travel as H2H replicas do (phoenix_hpc.runtime.h2h.send_buffer / recv_buffer): a
sealed snapshot buffer in windowed chunks, data tags within MPI_TAG_UB, verified on arrival. Real MPI, one
process sending to itself (a thread each side) on COMM_WORLD."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from mpi4py import MPI

from phoenix_hpc.errors import ReplicationError
from phoenix_hpc.runtime import h2h
from phoenix_hpc.runtime.h2h import recv_buffer, send_buffer
from phoenix_hpc.runtime.snapshot import PARAM, copy_in, plan_layout, seal, unpack


class Recording:
    """COMM_WORLD, recording each posted tag and the most requests in flight; ``tag_ub`` and ``flip`` (flip
    one byte of the chunk sent with that index) stand in for a small tag bound and a wire fault."""

    def __init__(self, tag_ub: int | None = None, flip: int | None = None):
        self.c, self.tags, self.ub, self.flip, self.live, self.most = MPI.COMM_WORLD, [], tag_ub, flip, [], 0
        self.sent = 0

    def Get_attr(self, key):
        return self.ub if self.ub is not None else self.c.Get_attr(key)

    def _track(self, req):
        self.live = [r for r in self.live if not r.Test()] + [req]
        self.most = max(self.most, len(self.live))
        return req

    def Isend(self, buf, dest, tag):
        self.tags.append(tag)
        if tag >= h2h.DATA_TAG_BASE:
            if self.sent == self.flip:
                buf = np.array(buf, copy=True)
                buf[len(buf) // 2] ^= 0xFF
            self.sent += 1
            return self._track(self.c.Isend(buf, dest=dest, tag=tag))
        return self.c.Isend(buf, dest=dest, tag=tag)

    def Irecv(self, buf, source, tag):
        self.tags.append(tag)
        return self.c.Irecv(buf, source=source, tag=tag)


def _sealed_params(n: int = 3000) -> torch.Tensor:
    pairs = [("param/w", torch.arange(n, dtype=torch.float32)), ("param/b", torch.ones(7, dtype=torch.bfloat16))]
    meta = {"shard_id": "param/pp0/tp0", "step": 9, "generation": 2, "grid": {}, "coord": {}, "envelope": {}}
    layout = plan_layout([], pairs, meta)
    buf = torch.zeros(layout.total_bytes, dtype=torch.uint8)
    copy_in(buf, layout, [], pairs)
    seal(buf, layout, shard_id="param/pp0/tp0", step=9, generation=2, grid={}, coord={}, envelope={}, parts=(PARAM,))
    return buf


def _roundtrip(send_comm, recv_comm, buf, chunk_bytes=256, step=9):
    box = {}

    def sender():
        try:
            send_buffer(send_comm, buf.numpy(), 0, step, chunk_bytes, 20.0, "test send")
        except Exception as exc:  # noqa: BLE001
            box["send_error"] = exc

    t = threading.Thread(target=sender)
    t.start()
    try:
        return recv_buffer(recv_comm, 0, step, chunk_bytes, 20.0, "test receive")
    finally:
        t.join(30)
        if "send_error" in box:
            raise box["send_error"]


def test_a_param_shard_arrives_whole_in_windowed_chunks_with_tags_under_the_bound():
    buf = _sealed_params()
    sc, rc = Recording(), Recording()
    got = _roundtrip(sc, rc, buf)
    u = unpack(got, (PARAM,))
    assert (u.shard_id, u.step) == ("param/pp0/tp0", 9)
    assert torch.equal(u.tensors["param/w"], torch.arange(3000, dtype=torch.float32))
    data = [t for t in sc.tags if t >= h2h.DATA_TAG_BASE]
    assert len(data) == len(h2h.chunk_ranges(buf.numel(), 256)) > 40 and len(set(data)) == len(data)
    assert max(data) <= MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
    assert 1 <= sc.most <= h2h.DEFAULT_WINDOW  # never more chunks in flight than the window


def test_a_chunk_damaged_on_the_way_is_caught_on_arrival():
    buf = _sealed_params()
    from phoenix_hpc.runtime.snapshot import read_header

    w = [e for e in read_header(buf).index["tensors"] if e["name"] == "param/w"][0]
    got = _roundtrip(Recording(flip=(w["offset"] + w["nbytes"] // 2) // 256), Recording(), buf)
    with pytest.raises(ReplicationError, match="fails its checksum"):
        unpack(got, (PARAM,))


def test_more_chunks_than_the_tag_bound_allows_is_refused_before_anything_is_sent():
    sc = Recording(tag_ub=h2h.DATA_TAG_BASE + 64)  # room for 64 tags: fewer than 4 steps of this message's chunks
    with pytest.raises(ReplicationError, match="MPI_TAG_UB=80"):
        send_buffer(sc, _sealed_params().numpy(), 0, 9, 256, 5.0, "test send")
    assert sc.tags == []


def test_the_receiver_refuses_a_buffer_of_another_step():
    box = {}

    def sender():  # its announce is matched and refused; its chunks are never received: it gives up
        try:
            send_buffer(Recording(), _sealed_params().numpy()[:1024], 0, 8, 1024, 1.0, "test send")
        except ReplicationError as exc:
            box["e"] = exc

    t = threading.Thread(target=sender)
    t.start()
    try:
        with pytest.raises(ReplicationError, match="the sender announced step 8 .1024 bytes, head 0., expected step 9"):
            recv_buffer(Recording(), 0, 9, 1024, 5.0, "test receive")
    finally:
        t.join(30)
    assert "no completion within the timeout" in str(box["e"])


def test_never_more_chunks_in_flight_than_the_window_and_every_one_completes():
    class Req:
        def __init__(self):
            self.tests = 0

        def Test(self):
            self.tests += 1
            return self.tests >= 3  # completes on its third test

    posted, live = [], []

    def post(i, v):
        r = Req()
        posted.append(i)
        live.append(r)
        assert sum(1 for x in live if x.tests < 3) <= 4, "more than the window in flight"
        return r

    w = h2h.ChunkWindow(list(range(23)), post, window=4)
    while not w.progress():
        pass
    assert posted == list(range(23)) and all(r.tests >= 3 for r in live)


def test_the_engine_and_the_recovery_transfer_share_one_windowed_chunk_transfer():
    """H2HEngine's replica sends and receives and a recovery's BufferTransfer all drive ChunkWindow: one
    implementation of the windowed chunk transfer, not two."""
    import inspect

    for fn in (h2h.H2HEngine._start_send, h2h.H2HEngine._progress_incoming, h2h.BufferTransfer.progress):
        assert "ChunkWindow(" in inspect.getsource(fn), fn.__qualname__
    src = inspect.getsource(h2h)
    assert src.count(".window and") == 1, "a second windowed posting loop besides ChunkWindow.progress"


def test_a_finished_transfer_and_its_received_buffer_are_freed_without_the_cycle_collector():
    """A recovery's received buffers (the lost rank's parameters and optimizer shard: GBs on a GPU node) go
    as soon as the member drops its transfers: no reference cycle keeps them until CPython's next full
    collection, which after ``gc.freeze`` may come only at the next recovery."""
    import gc
    import weakref

    from phoenix_hpc.runtime.h2h import BufferTransfer, drive_transfers

    buf = _sealed_params()
    box = {}

    def sender():
        send_buffer(Recording(), buf.numpy(), 0, 9, 256, 20.0, "test send")

    gc.collect()
    gc.disable()
    try:
        t = threading.Thread(target=sender)
        t.start()
        x = BufferTransfer(Recording(), 0, 9, 256, "test receive")
        drive_transfers([x], 20.0)
        t.join(30)
        box["transfer"], box["buffer"] = weakref.ref(x), weakref.ref(x.buf)
        assert torch.equal(x.buf, buf)
        del x
        assert box["transfer"]() is None and box["buffer"]() is None
    finally:
        gc.enable()
