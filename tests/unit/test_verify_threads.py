"""Replica verification on the checksum threads (snapshot.verify with a pool; the holder's per-step
verification and the re-verification at a quiesce on a GPU rank): the same verdicts and values as one
thread, the first failing tensor named, the threads' CPU time reported."""

from types import SimpleNamespace

import pytest
import torch

from phoenix_hpc.errors import ReplicationError
from phoenix_hpc.runtime import snapshot as S
from phoenix_hpc.runtime.buffers import PingPong
from phoenix_hpc.runtime.checksum_pool import ChecksumPool
from phoenix_hpc.runtime.cpu_account import CpuAccount
from phoenix_hpc.runtime.h2h import ACK_BAD_CHECKSUM, ACK_OK, HeldSpec
from phoenix_hpc.runtime.protector import Protector

SID = "opt/pp0/tp0/dp0"


def _sealed(step=7):
    g = torch.Generator().manual_seed(1)
    opt = [(f"{SID}/w{i}/{k}", torch.randn(3000 + 11 * i, generator=g)) for i in range(5) for k in ("main", "m")]
    par = [(f"param/pp0/tp0/w{i}", torch.randn(700, generator=g).to(torch.bfloat16)) for i in range(5)]
    lay = S.plan_layout(opt, par, {"envelope": {}})
    buf = torch.zeros(lay.total_bytes, dtype=torch.uint8)
    S.copy_in(buf, lay, opt, par)
    crc = S.seal(buf, lay, shard_id=SID, step=step, generation=0, grid={}, coord={}, envelope={})
    return buf, lay, crc


def _corrupt(buf, lay, k):
    s = [s for s in lay.slots if s.part == S.OPT][k]
    buf[s.offset + 5] ^= 0xFF
    return s.name


@pytest.mark.parametrize("threads", [1, 3])
def test_verify_on_a_pool_gives_the_single_thread_result(threads):
    buf, lay, crc = _sealed()
    pool, t = ChecksumPool(threads), {}
    try:
        h, got = S.verify(buf, (S.OPT, S.PARAM), pool=pool, timings=t)
    finally:
        pool.close()
    assert (h.step, got) == (7, crc) == (7, S.verify(buf, (S.OPT, S.PARAM))[1])
    assert (t["checksum_ns"] > 0) if threads > 1 else (t == {})


def test_verify_on_a_pool_names_the_first_failing_tensor_in_index_order():
    buf, lay, _ = _sealed()
    _corrupt(buf, lay, 6)
    first = _corrupt(buf, lay, 2)
    pool = ChecksumPool(3)
    try:
        with pytest.raises(ReplicationError, match=f"tensor {first} "):
            S.verify(buf, (S.OPT,), pool=pool)
    finally:
        pool.close()


def _holder(threads):
    acks = []
    prot = Protector.__new__(Protector)  # only what the holder's verification touches
    prot.cpu, prot.generation, prot.log, prot.held_steps = CpuAccount(), 0, None, {}
    prot.d2h = SimpleNamespace(checksums=ChecksumPool(threads))
    prot.h2h = SimpleNamespace(send_ack=lambda spec, step, code, crc: acks.append((code, crc)))
    return prot, acks


@pytest.mark.parametrize("threads", [1, 2])
def test_the_holders_verification_acks_the_owners_value_and_counts_the_checksum_time(threads):
    buf, lay, crc = _sealed()
    prot, acks = _holder(threads)
    spec = HeldSpec(SID, 0, lay.total_bytes, PingPong((buf, torch.zeros_like(buf)), "held"))
    try:
        prot._do_verify(spec, 0, 7)
    finally:
        prot.d2h.checksums.close()
    assert acks == [(ACK_OK, crc)] and prot.held_steps == {SID: 7} and spec.pingpong.verified_steps() == [7]
    assert prot.cpu.totals()["checksum"] > 0


def test_the_holders_verification_on_threads_rejects_a_corrupted_replica():
    buf, lay, _ = _sealed()
    _corrupt(buf, lay, 3)
    prot, acks = _holder(2)
    spec = HeldSpec(SID, 0, lay.total_bytes, PingPong((buf, torch.zeros_like(buf)), "held"))
    try:
        prot._do_verify(spec, 0, 7)
    finally:
        prot.d2h.checksums.close()
    assert acks == [(ACK_BAD_CHECKSUM, 0)] and prot.held_steps == {}
