"""Checksums on several threads (runtime/checksum_pool.py): same values as one thread, taken only after
each group's bytes landed, errors handed back, the thread count resolved from the config."""

import threading

import numpy as np
import pytest
import torch

from phoenix_hpc.runtime import snapshot as S
from phoenix_hpc.runtime.checksum import CHECKSUMS, checksum_function
from phoenix_hpc.runtime.checksum_pool import (AUTO_MAX_THREADS, THREADS_MAX, THREADS_MIN, ChecksumPool,
                                               checksum_groups, resolve_threads)
from phoenix_hpc.runtime.d2h import event_ends


def _layout():
    g = torch.Generator().manual_seed(0)
    opt = [(f"opt/pp0/tp0/dp0/w{i}/{k}", torch.randn(1000 + 37 * i, generator=g))
           for i in range(6) for k in ("main", "exp_avg")]
    par = [(f"param/pp0/tp0/w{i}", torch.randn(500 + i, generator=g).to(torch.bfloat16)) for i in range(6)]
    lay = S.plan_layout(opt, par, {"envelope": {}})
    return lay, opt, par


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("name", CHECKSUMS)
def test_group_checksums_equal_the_whole_buffers_and_are_taken_after_each_wait(threads, name):
    lay, opt, par = _layout()
    full = torch.zeros(lay.total_bytes, dtype=torch.uint8)
    S.copy_in(full, lay, opt, par)
    want = S.checksums(full, lay, (S.OPT, S.PARAM), name)
    buf = torch.zeros_like(full)  # filled group by group, only inside wait(i), as a CUDA event would
    ends = event_ends(lay.slots, 20000)
    assert len(ends) > 2
    waited = []

    def wait(i):
        lo = lay.slots[ends[i - 1] if i else 0].offset
        last = lay.slots[ends[i] - 1]
        buf[lo : last.offset + last.nbytes] = full[lo : last.offset + last.nbytes]
        waited.append(i)

    pool = ChecksumPool(threads)
    try:
        sums, ns = checksum_groups(memoryview(buf.numpy()), lay.slots, ends, wait, checksum_function(name), pool)
    finally:
        pool.close()
    assert sums == want and waited == list(range(len(ends))) and ns > 0


def test_the_pool_runs_on_its_own_threads_and_one_thread_runs_in_the_caller():
    seen = set()

    def fn(view):
        seen.add(threading.current_thread().name)
        return len(view)

    data = memoryview(np.zeros(64, dtype=np.uint8))
    one = ChecksumPool(1)
    assert one.submit(fn, data).result()[0] == 64 and seen == {threading.current_thread().name}
    seen.clear()
    many = ChecksumPool(2)
    try:
        assert [many.submit(fn, data[:n]).result()[0] for n in (3, 5)] == [3, 5]
    finally:
        many.close()
    assert seen and all(n.startswith("phoenix-checksum") for n in seen)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_failing_checksum_is_raised_after_every_submitted_one_ended(threads):
    import time

    lay, opt, par = _layout()
    buf = torch.zeros(lay.total_bytes, dtype=torch.uint8)
    S.copy_in(buf, lay, opt, par)
    bad = lay.slots[3].offset
    ended, lock = [], threading.Lock()

    def fn(view):
        time.sleep(0.01)  # slow enough that the others are still running when the bad one fails
        with lock:
            ended.append(len(view))
        if view.obj is not None and np.frombuffer(view, dtype=np.uint8).ctypes.data == buf.numpy()[bad:].ctypes.data:
            raise ValueError("torn view")
        return 0

    pool = ChecksumPool(threads)
    try:
        with pytest.raises(ValueError, match="torn view"):
            checksum_groups(memoryview(buf.numpy()), lay.slots, [len(lay.slots)], lambda i: None, fn, pool)
        n_at_raise = len(ended)  # read before close(), which would wait for any still running
    finally:
        pool.close()
    assert n_at_raise == len(lay.slots)


def test_a_failing_wait_stops_before_the_next_group():
    lay, opt, par = _layout()
    buf = torch.zeros(lay.total_bytes, dtype=torch.uint8)
    ends = event_ends(lay.slots, 20000)

    def wait(i):
        if i == 1:
            raise RuntimeError("CUDA error")

    calls = []
    with pytest.raises(RuntimeError, match="CUDA error"):
        checksum_groups(memoryview(buf.numpy()), lay.slots, ends, wait, lambda v: calls.append(1) or 0,
                        ChecksumPool(1))
    assert len(calls) == ends[0]


def test_resolve_threads():
    assert resolve_threads("auto", cuda=False, cpus=64) == 1
    assert resolve_threads("auto", cuda=True, cpus=1) == 1
    assert resolve_threads("auto", cuda=True, cpus=10) == 5
    assert resolve_threads("auto", cuda=True, cpus=128) == AUTO_MAX_THREADS
    assert resolve_threads(3, cuda=False, cpus=1) == 3
    for bad in (0, THREADS_MAX + 1, True, "4", 2.0):
        with pytest.raises(ValueError, match="resilience.checksum_threads"):
            resolve_threads(bad, cuda=True, cpus=8)


def test_the_job_configs_bounds_are_the_pools():
    from phoenix_hpc.config.schema import CHECKSUM_THREADS_RANGE, ResilienceConfig

    assert CHECKSUM_THREADS_RANGE == (THREADS_MIN, THREADS_MAX)
    assert ResilienceConfig().checksum_threads == "auto"
    assert ResilienceConfig(checksum_threads=THREADS_MIN).checksum_threads == THREADS_MIN
    assert ResilienceConfig(checksum_threads=THREADS_MAX).checksum_threads == THREADS_MAX
    for bad in (THREADS_MIN - 1, THREADS_MAX + 1):
        with pytest.raises(Exception, match="checksum_threads"):
            ResilienceConfig(checksum_threads=bad)


def test_pool_threads_run_at_the_process_nice_plus_the_increment_even_from_a_niced_thread():
    import os

    from phoenix_hpc.runtime.thread_priority import lower_thread_priority

    base = os.getpriority(os.PRIO_PROCESS, os.getpid())
    seen = []

    def creator():  # the copy thread: already niced by the increment when it starts the pool
        lower_thread_priority(3)
        pool = ChecksumPool(2, nice=3)
        try:
            pool.submit(lambda v: seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id())) or 0,
                        b"x").result()
        finally:
            pool.close()

    th = threading.Thread(target=creator)
    th.start()
    th.join()
    assert seen == [min(19, base + 3)]


def test_a_cpu_d2h_keeps_one_thread_and_a_closed_pool_stops_its_threads_and_starts_again_on_use():
    from phoenix_hpc.runtime.d2h import D2H

    d = D2H(torch.device("cpu"), checksum_threads=4)
    assert d.checksums.threads == 1  # a CPU rank checksums in its copy thread
    pool = ChecksumPool(2)
    pool.submit(len, b"abc").result()
    names = {t.name for t in threading.enumerate()}
    assert any(n.startswith("phoenix-checksum") for n in names)
    pool.close()
    assert not any(t.name.startswith("phoenix-checksum") and t.is_alive() for t in threading.enumerate())
    assert pool.submit(len, b"ab").result()[0] == 2
    pool.close()
