"""Recovery evidence on real snapshot buffers (docs/design.md section 6): the hash a member reports for its
restored optimizer shard equals what a snapshot of that state seals and what a holder's verification of the
replica recomputes; a held replica corrupted in memory is forgotten when its holder quiesces."""

import torch

from phoenix_hpc.runtime.snapshot import OPT, copy_in, hash_hex, part_hash, plan_layout, seal, unpack, verify


def _state():
    g = torch.Generator().manual_seed(3)
    opt = [("opt/pp0/tp0/dp0/w/main", torch.randn(5, 7, generator=g)),
           ("opt/pp0/tp0/dp0/w/exp_avg", torch.randn(5, 7, generator=g).to(torch.bfloat16)),
           ("opt/pp0/tp0/dp0/step", torch.tensor(12.0, dtype=torch.float64)),  # 0-dim
           ("opt/pp0/tp0/dp0/flag", torch.tensor([True, False, True]))]
    params = [("param/pp0/tp0/w", torch.randn(7, 5, generator=g).t())]  # not contiguous
    return opt, params


def _snapshot(opt, params):
    index = {"shard_id": "opt/pp0/tp0/dp0", "step": 4, "generation": 1, "grid": {}, "coord": {}, "envelope": {}}
    layout = plan_layout(opt, params, index)
    buf = torch.zeros(layout.total_bytes, dtype=torch.uint8)
    copy_in(buf, layout, opt, params)
    crc = seal(buf, layout, shard_id="opt/pp0/tp0/dp0", step=4, generation=1, grid={}, coord={}, envelope={})
    return buf, layout, crc


def test_the_optimizer_hash_equals_the_sealed_and_the_verified_replica_hash():
    opt, params = _state()
    buf, layout, crc = _snapshot(opt, params)
    replica = buf[: layout.opt_end].clone()  # what H2H sends
    _, verified = verify(replica, (OPT,))
    assert part_hash(opt) == hash_hex(crc) == hash_hex(verified)
    assert len(part_hash(opt)) == 8
    # a state restored from the replica hashes the same
    u = unpack(replica, (OPT,))
    assert part_hash([(n, u.tensors[n]) for n, _ in opt]) == part_hash(opt)


def test_one_changed_byte_or_a_different_order_changes_the_hash():
    opt, params = _state()
    h = part_hash(opt)
    changed = [(n, t.clone()) for n, t in opt]
    changed[0][1][2, 3] = torch.nextafter(changed[0][1][2, 3], torch.tensor(1e9))
    assert part_hash(changed) != h
    assert part_hash(list(reversed(opt))) != h
    assert part_hash(params) == part_hash([(n, t.contiguous()) for n, t in params])


def test_a_held_replica_corrupted_in_memory_is_forgotten_at_quiesce_and_the_other_buffer_kept():
    """Protector.reverify_held over real ping-pong buffers: one byte flipped in the committed replica."""
    from types import SimpleNamespace

    from phoenix_hpc.runtime.buffers import PingPong
    from phoenix_hpc.runtime.checksum_pool import ChecksumPool
    from phoenix_hpc.runtime.protector import Protector

    opt, params = _state()
    buf4, layout, _ = _snapshot(opt, params)
    prev = buf4[: layout.opt_end].clone()
    # the previous buffer: a copy of step 3 (same bytes, header says 3)
    idx = {"shard_id": "opt/pp0/tp0/dp0"}
    seal(prev, _replica_layout(layout), shard_id=idx["shard_id"], step=3, generation=1, grid={},
         coord={}, envelope={}, parts=(OPT,))
    pp = PingPong((buf4[: layout.opt_end].clone(), prev), "held")
    pp.commit(1, 3)
    pp.commit(0, 4)
    assert pp.verified_steps() == [4, 3]
    pp.bufs[0][layout.slots[0].offset + 5] ^= 0x10  # silent corruption of the committed copy
    fake = SimpleNamespace(buffers=SimpleNamespace(held={"opt/pp0/tp0/dp0": pp}),
                           d2h=SimpleNamespace(checksums=ChecksumPool(2)))  # verified on two threads
    good, bad = Protector.reverify_held(fake)
    assert [(s, k) for s, k, _ in bad] == [("opt/pp0/tp0/dp0", 4)] and "fails its checksum" in bad[0][2]
    assert [g[:3] for g in good] == [("opt/pp0/tp0/dp0", 3, 1)]
    assert pp.verified_steps() == [3] and pp.find(4) is None and pp.find(3) is not None
    assert Protector.reverify_held(fake) == (good, [])  # what is left verifies, with the same CRC


def _replica_layout(layout):
    """The layout of a replica buffer (optimizer part only: what H2H sends)."""
    import dataclasses

    return dataclasses.replace(layout, slots=tuple(s for s in layout.slots if s.part == OPT),
                               total_bytes=layout.opt_end)
