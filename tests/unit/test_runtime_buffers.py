"""Snapshot format, checksums, ping-pong buffers, memory plan and chunking (pure parts of the runtime)."""

from __future__ import annotations

import pytest
import torch

from phoenix_hpc.errors import ReplicationError
from phoenix_hpc.runtime import buffers as B
from phoenix_hpc.runtime import snapshot as S
from phoenix_hpc.runtime.h2h import chunk_ranges, make_tag_plan


def state(seed=0):
    g = torch.Generator().manual_seed(seed)
    opt = [(f"opt/pp0/tp0/dp1/w{i}/{kind}", torch.randn(37 + i, generator=g))
           for i in range(2) for kind in ("main", "exp_avg", "exp_avg_sq")]
    params = [("param/pp0/tp0/w0", torch.randn(5, 7, generator=g).to(torch.bfloat16)),
              ("param/pp0/tp0/steps", torch.arange(3, dtype=torch.int64)),
              ("param/pp0/tp0/empty", torch.zeros(0))]
    return opt, params


def sealed(seed=0, step=3):
    opt, params = state(seed)
    env = {"step": step, "rng": "abc" * 10, "lr": 1e-3}
    ex = {"shard_id": "opt/pp0/tp0/dp1", "envelope": env}
    lay = S.plan_layout(opt, params, ex)
    buf = torch.zeros(lay.total_bytes, dtype=torch.uint8)
    S.copy_in(buf, lay, opt, params)
    crc = S.seal(buf, lay, shard_id="opt/pp0/tp0/dp1", step=step, generation=2, grid={"tp": 1, "pp": 1, "dp": 4},
                 coord={"pp": 0, "dp": 1, "tp": 0}, envelope=env)
    return opt, params, lay, buf, crc


def test_roundtrip_full_snapshot_and_replica_prefix():
    opt, params, lay, buf, crc = sealed()
    assert lay.total_bytes % S.ALIGN == 0 and lay.opt_end <= lay.total_bytes
    assert all(s.offset % S.ALIGN == 0 for s in lay.slots)
    assert lay.opt_data_bytes == sum(t.numel() * 4 for _, t in opt)
    u = S.unpack(buf, (S.OPT, S.PARAM))
    assert (u.step, u.generation, u.shard_id, u.envelope["lr"]) == (3, 2, "opt/pp0/tp0/dp1", 1e-3)
    for name, t in opt + params:
        assert u.tensors[name].dtype == t.dtype and torch.equal(u.tensors[name], t), name
    # the replica H2H sends is the prefix buf[:opt_end]; it verifies alone and gives the same ack CRC
    rep = buf[: lay.opt_end].clone()
    r = S.unpack(rep, (S.OPT,))
    assert set(r.tensors) == {n for n, _ in opt} and r.opt_crc == crc


@pytest.mark.parametrize("where", ["tensor", "index", "magic"])
def test_a_corrupted_byte_fails_its_checksum(where):
    opt, params, lay, buf, _ = sealed()
    if where == "tensor":
        slot = lay.slots[4]
        buf[slot.offset + 3] ^= 1
        match = f"tensor {slot.name} .* fails its checksum"
    elif where == "index":
        buf[S.HEADER_BYTES + 10] ^= 1
        match = "index fails its checksum"
    else:
        buf[0] ^= 1
        match = "not a snapshot"
    with pytest.raises(ReplicationError, match=match):
        S.unpack(buf, (S.OPT, S.PARAM))


def test_param_corruption_does_not_fail_a_replica_read_but_fails_a_full_read():
    opt, params, lay, buf, _ = sealed()
    p = next(s for s in lay.slots if s.part == S.PARAM and s.nbytes)
    buf[p.offset] ^= 0x80
    S.unpack(buf, (S.OPT,))
    with pytest.raises(ReplicationError, match=p.name):
        S.unpack(buf, (S.OPT, S.PARAM))


def test_layout_mismatch_and_index_overflow():
    opt, params, lay, buf, _ = sealed()
    with pytest.raises(ReplicationError, match="does not match the snapshot layout"):
        S.copy_in(buf, lay, [(opt[0][0], torch.zeros(3))] + opt[1:], params)
    with pytest.raises(ReplicationError, match="exceeds the reserved"):
        S.seal(buf, lay, shard_id="x", step=1, generation=0, grid={}, coord={}, envelope={"big": "x" * lay.index_capacity})


def test_memory_plan_formula_and_check():
    plan = B.MemoryPlan(1000, (("opt/a", 300), ("opt/b", 300)))
    assert plan.total_bytes == 2 * 1000 + 2 * 2 * 300  # 2 x snapshot + 2k x replica, k = 2
    assert "= 3200 bytes" in plan.describe()
    B.check_host_memory(plan, 10_000, ranks_per_node=2)
    with pytest.raises(ReplicationError, match=r"4 rank\(s\) on this node x 3200 bytes = 12800 bytes needed, MemAvailable is 10000"):
        B.check_host_memory(plan, 10_000, ranks_per_node=4)
    assert B.parse_mem_available("MemTotal: 10 kB\nMemAvailable:    2048 kB\n") == 2048 * 1024
    with pytest.raises(ReplicationError, match="MemAvailable"):
        B.parse_mem_available("MemTotal: 10 kB\n")


def test_allocate_buffers_sizes_and_pingpong():
    plan = B.MemoryPlan(4096, (("opt/pp0/tp0/dp0", 1024),))
    bs = B.allocate_buffers(plan, pin=False)
    assert bs.total_bytes == plan.total_bytes
    pp = bs.local
    assert pp.committed() == (None, None) and pp.target_idx() == 0
    pp.begin_write(0)
    pp.commit(0, 5)
    assert pp.target_idx() == 1 and pp.committed()[0] == 5
    with pytest.raises(RuntimeError, match="committed"):
        pp.begin_write(0)
    pp.begin_write(1)
    assert pp.find(5) is pp.bufs[0] and pp.target_content_step() is None
    pp.commit(1, 6)
    assert pp.find(5) is pp.bufs[0] and pp.find(6) is pp.bufs[1] and pp.target_content_step() == 5


def test_allocation_failure_is_all_or_nothing():
    plan = B.MemoryPlan(1024, (("opt/x", 1 << 62),))  # the second pair cannot be allocated
    with pytest.raises(ReplicationError, match="allocating the replication buffers failed"):
        B.allocate_buffers(plan, pin=False)


def test_chunks_and_tags():
    assert chunk_ranges(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert chunk_ranges(0, 4) == [(0, 0)]
    for bad in (0, -1):
        with pytest.raises(ReplicationError, match="chunk_bytes must be a positive"):
            chunk_ranges(10, bad)
    tp = make_tag_plan(3, 2**31 - 1)
    tags = {tp.data_tag(s, i) for s in range(4) for i in range(3)}
    assert len(tags) == 12 and max(tags) <= 2**31 - 1
    with pytest.raises(ReplicationError, match="Raise resilience.chunk_bytes"):
        make_tag_plan(10_000, 32767)


def test_pingpong_keeps_the_previous_step_until_it_is_written_again():
    """Recovery may use either buffer (the plan's recoverable step can be one behind the newest commit)."""
    pp = B.PingPong(B.allocate_pair(8, pin=False), "t")
    assert pp.verified_steps() == []
    pp.commit(pp.target_idx(), 4)
    pp.commit(pp.target_idx(), 5)
    assert pp.verified_steps() == [5, 4] and pp.find(4) is not None and pp.find(5) is not None
    pp.begin_write(pp.target_idx())  # the write of step 6 destroys step 4 only
    assert pp.verified_steps() == [5] and pp.find(4) is None


def test_host_buffers_skip_the_deterministic_fill_and_leave_the_flag_as_it_was():
    """Under ``use_deterministic_algorithms`` torch.empty writes every byte (uint8: 255); the host buffers
    are allocated without that write, and the process-wide flag is back to what it was afterwards."""
    import torch.utils.deterministic as det

    from phoenix_hpc.runtime.buffers import allocate_pair, host_empty

    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert det.fill_uninitialized_memory is True
        assert int(torch.empty(1 << 20, dtype=torch.uint8).min()) == 255  # what the fill does
        # sizes above 32 MiB: glibc serves them with a fresh mmap whatever its dynamic threshold has grown to
        # (mallopt(3), M_MMAP_THRESHOLD: at most DEFAULT_MMAP_THRESHOLD_MAX, 32 MiB on 64-bit systems), and
        # torch's CPU allocator caches nothing, so unwritten memory reads as the kernel's zero pages, not 255
        a = host_empty(64 << 20)
        assert a.numel() == 64 << 20 and int(a[: 1 << 20].max()) != 255
        assert all(int(b[: 1 << 20].max()) != 255 for b in allocate_pair(48 << 20, pin=False))
        assert det.fill_uninitialized_memory is True
    finally:
        torch.use_deterministic_algorithms(was)


def test_unpack_without_copy_gives_verified_views_of_the_buffer():
    opt, _ = state(3)
    buf = S.seal_part(opt, S.OPT, "opt/pp0/tp0/dp1", 7, 2)
    lo, hi = buf.data_ptr(), buf.data_ptr() + buf.numel()
    views = S.unpack(buf, (S.OPT,), copy=False).tensors
    copies = S.unpack(buf, (S.OPT,)).tensors
    for name, t in opt:
        assert torch.equal(views[name], t) and torch.equal(copies[name], t)
        assert lo <= views[name].data_ptr() < hi  # inside the buffer: no copy made
        assert not lo <= copies[name].data_ptr() < hi
    buf[views[opt[0][0]].data_ptr() - lo] ^= 0xFF  # a byte of the first tensor: verification still comes first
    with pytest.raises(ReplicationError):
        S.unpack(buf, (S.OPT,), copy=False)


def test_d2h_builds_the_views_of_a_buffer_once_and_copies_exactly_what_copy_in_does():
    from phoenix_hpc.runtime.d2h import D2H

    opt, params = state(5)
    params = [(n, torch.nn.Parameter(t) if t.is_floating_point() else t) for n, t in params]
    lay = S.plan_layout(opt, params, {"shard_id": "x", "envelope": {}})
    ref = torch.zeros(lay.total_bytes, dtype=torch.uint8)
    S.copy_in(ref, lay, opt, params)
    d = D2H(torch.device("cpu"))
    bufs = [torch.zeros(lay.total_bytes, dtype=torch.uint8) for _ in range(3)]
    d.copy(None, bufs[0], lay, opt, params)
    first = d._views_of(bufs[0], lay)
    assert d._views_of(bufs[0], lay) is first  # built once per buffer
    assert torch.equal(bufs[0], ref) and not bufs[0].requires_grad
    assert not any(v.requires_grad for v in first)  # a Parameter's copy joins no autograd graph
    d.copy(None, bufs[1], lay, opt, params)
    assert torch.equal(bufs[1], ref) and len(d._views) == 2
    d.copy(None, bufs[2], lay, opt, params)  # a third buffer: the older entries go
    assert torch.equal(bufs[2], ref) and len(d._views) == 1
    other = S.plan_layout(opt, params, {"shard_id": "x", "envelope": {}})
    assert d._views_of(bufs[2], other) is not d._views_of(bufs[2], lay)  # another layout, other views
    bad = [(n, t[:-1] if i == 0 else t) for i, (n, t) in enumerate(opt)]
    with pytest.raises(ReplicationError, match="does not match the snapshot layout"):
        d.copy(None, bufs[2], lay, bad, params)
    d.forget()
    assert d._views == {}


@pytest.mark.parametrize("algo", ["xxh3_64", "crc32c", "crc32"])
def test_copy_checksummed_gives_the_buffers_checksums_and_splits_its_cpu_time(algo):
    from phoenix_hpc.runtime.d2h import D2H

    opt, params = state(7)
    opt = [(n, torch.nn.Parameter(t)) for n, t in opt]  # tensors that require grad, as live state can
    lay = S.plan_layout(opt, params, {"shard_id": "x", "envelope": {}})
    buf = torch.zeros(lay.total_bytes, dtype=torch.uint8)
    d = D2H(torch.device("cpu"))
    sums, copy_ns, sum_ns = d.copy_checksummed(None, buf, lay, opt, params, algo)
    assert sums == S.checksums(buf, lay, (S.OPT, S.PARAM), algo)  # every tensor, in slot order
    ref = torch.zeros(lay.total_bytes, dtype=torch.uint8)
    S.copy_in(ref, lay, opt, params)
    assert torch.equal(buf, ref) and not buf.requires_grad
    assert not any(v.requires_grad for v in d._views_of(buf, lay))
    assert copy_ns >= 0 and sum_ns >= 0 and copy_ns + sum_ns > 0  # its loop's CPU time, split
    with pytest.raises(ReplicationError, match="unknown checksum 'md5'"):
        d.copy_checksummed(None, buf, lay, opt, params, "md5")
    with pytest.raises(ReplicationError, match="engine state has"):
        d.copy_checksummed(None, buf, lay, opt[1:], params, algo)


def test_cuda_event_groups_span_at_least_the_event_bytes_and_never_split_a_tensor():
    from phoenix_hpc.runtime.d2h import event_ends

    def slots(sizes):
        out, off = [], 4096
        for n in sizes:
            out.append(S.TensorSlot(f"t{len(out)}", S.OPT, "torch.float32", (n // 4,), off, n))
            off = S._align(off + n)
        return out

    assert event_ends([], 64) == []
    assert event_ends(slots([10]), 1 << 20) == [1]  # one group, ending with the last slot
    sl = slots([1 << 20] * 10)  # 1 MiB tensors, aligned: each starts 1 MiB (+ alignment) after the last
    ends = event_ends(sl, 3 << 20)
    assert ends[-1] == 10 and ends == sorted(set(ends))
    starts = [0] + ends[:-1]
    for a, b in zip(starts, ends[:-1]):  # every group but the last spans at least the event bytes
        assert sl[b].offset - sl[a].offset >= 3 << 20
    assert len(ends) == 4  # 3 + 3 + 3 + 1 tensors
    assert event_ends(sl, 1) == list(range(1, 11))  # tiny groups: an event per tensor
    assert event_ends(slots([5 << 20, 10, 10]), 4 << 20) == [1, 3]  # a big tensor is a group of its own


def test_the_sealed_index_is_the_compact_json_of_what_it_says_with_the_tensors_last():
    """seal writes the index from the layout's fixed entry texts plus this step's values: the bytes must
    be exactly json.dumps of the parsed index (keys in the written order), names with quotes and
    non-ASCII included, negative sums (the -1 of an unchecked part) and an empty tensor."""
    opt, params = state(3)
    params.append(('param/pp0/tp0/na"me\\ü', torch.ones(2)))
    env = {"step": 7, "note": "ü\n"}
    lay = S.plan_layout(opt, params, {"shard_id": "s", "envelope": env})
    buf = torch.zeros(lay.total_bytes, dtype=torch.uint8)
    S.copy_in(buf, lay, opt, params)
    S.seal(buf, lay, shard_id="s", step=7, generation=1, grid={"tp": 1}, coord={"tp": 0}, envelope=env,
           parts=(S.OPT,))
    h = S.read_header(buf)
    ilen = S._HEADER.unpack(buf[: S.HEADER_BYTES].numpy().tobytes())[3]  # the index length the header names
    raw = buf[S.HEADER_BYTES: S.HEADER_BYTES + ilen].numpy().tobytes()
    assert raw == S._compact(h.index).encode()
    assert list(h.index) == ["format", "shard_id", "step", "generation", "checksum", "grid", "coord", "envelope",
                             "tensors"]
    assert [e["name"] for e in h.index["tensors"]] == [s.name for s in lay.slots]
    assert {e["sum"] for e in h.index["tensors"] if e["part"] == S.PARAM} == {-1}
    assert h.index["envelope"] == env and h.index["tensors"][-1]["shape"] == [2]
    assert S.unpack(buf, (S.OPT,)).tensors.keys() == {n for n, _ in opt}
