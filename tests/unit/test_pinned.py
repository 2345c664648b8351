"""Exactly sized page-locked host buffers (runtime/pinned.py): the mapping, its registration and its release,
with the CUDA calls replaced by recorders (the CUDA calls themselves run in scripts/gpu-check.sh, d2h)."""

import gc
import mmap

import pytest
import torch

from phoenix_hpc.errors import ReplicationError
from phoenix_hpc.runtime import buffers, pinned


def vm_flags(addr: int) -> list[str]:
    """The kernel's VmFlags of the mapping that starts at ``addr`` (proc(5), /proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                inside = int(head.split("-")[0], 16) == addr
            elif inside and line.startswith("VmFlags:"):
                return line.split()[1:]
    raise AssertionError(f"no mapping starts at {addr:#x}")


class Calls:
    def __init__(self, fail: int = 0):
        self.fail, self.registered, self.unregistered = fail, [], []

    def pair(self):
        def register(ptr: int, n: int) -> int:
            self.registered.append((ptr, n))
            return self.fail

        def unregister(ptr: int) -> int:
            self.unregistered.append(ptr)
            return 0

        return register, unregister


def test_a_buffer_is_exactly_the_size_asked_registered_once_and_released_after_its_last_view():
    c = Calls()
    n = (1 << 20) + 4096 + 7  # just above a power of two, and not a whole number of pages
    t = pinned.pinned_empty(n, c.pair())
    assert t.dtype == torch.uint8 and t.numel() == n and t.data_ptr() % mmap.PAGESIZE == 0
    assert c.registered == [(t.data_ptr(), n)] and c.unregistered == []
    ptr = t.data_ptr()
    assert "dc" in vm_flags(ptr)  # MADV_DONTFORK: a process forked later does not get these pages
    t[-1] = 7
    view = t[4096:8192].view(torch.float32)
    arr = t.numpy()  # the runtime keeps numpy and typed views of its buffers
    del t
    gc.collect()
    assert c.unregistered == []  # the views still use the memory
    assert int(arr[-1]) == 7
    del arr
    gc.collect()
    assert c.unregistered == []  # a typed view does not keep the first tensor alive, but the storage lives
    view.fill_(1.0)
    del view
    gc.collect()
    assert c.unregistered == [ptr]


def test_a_failed_registration_names_the_error_and_the_size_and_keeps_nothing(monkeypatch):
    made = []
    real_mmap = mmap.mmap

    def recording_mmap(*a, **k):
        made.append(real_mmap(*a, **k))
        return made[-1]

    monkeypatch.setattr(pinned.mmap, "mmap", recording_mmap)
    c = Calls(fail=2)
    with pytest.raises(ReplicationError, match=r"cudaHostRegister of 65536 bytes returned CUDA error 2"):
        pinned.pinned_empty(65536, c.pair())
    gc.collect()
    assert len(c.registered) == 1 and c.unregistered == []  # nothing registered to undo
    assert len(made) == 1 and made[0].closed  # the mapping is gone at once, not when the collector runs


def test_the_release_is_not_run_at_interpreter_exit(monkeypatch):
    real, made = pinned.weakref.finalize, []
    monkeypatch.setattr(pinned.weakref, "finalize", lambda *a: made.append(real(*a)) or made[-1])
    t = pinned.pinned_empty(4096, Calls().pair())
    assert len(made) == 1 and made[0].alive and made[0].atexit is False
    del t


def test_bad_sizes_are_refused_and_zero_bytes_need_no_registration():
    c = Calls()
    for bad in (-1, 1.5, "8"):
        with pytest.raises(ReplicationError, match="is not allowed"):
            pinned.pinned_empty(bad, c.pair())
    assert pinned.pinned_empty(0, c.pair()).numel() == 0 and c.registered == []


def test_pinned_protector_buffers_take_the_exact_path(monkeypatch):
    c = Calls()
    real = pinned.pinned_empty
    monkeypatch.setattr(pinned, "pinned_empty", lambda n: real(n, c.pair()))
    plan = buffers.MemoryPlan(3 << 20, (("opt/pp0/tp0/dp1", (1 << 20) + 1),))
    got = buffers.allocate_buffers(plan, pin=True)
    assert sorted(n for _, n in c.registered) == [(1 << 20) + 1, (1 << 20) + 1, 3 << 20, 3 << 20]
    assert got.total_bytes == plan.total_bytes
    calls = iter([0, 0, 0, 3])  # the second buffer of the second pair fails: the error names the plan
    monkeypatch.setattr(pinned, "pinned_empty", lambda n: real(n, (lambda p, k: next(calls), c.pair()[1])))
    with pytest.raises(ReplicationError, match=r"allocating the replication buffers failed .*CUDA error 3"):
        buffers.allocate_buffers(plan, pin=True)
    gc.collect()
    assert len(c.unregistered) == 3  # the three registered before the failure were released; `got` lives on


def test_the_gpu_check_s_verdict_on_the_exact_buffer():
    from phoenix_hpc.gpucheck.check_d2h import ITEMS, PINNED_BYTES, PINNED_SLACK, pinned_verdict

    n = PINNED_BYTES
    good = {"exact_pinned": True, "exact_rss_growth_bytes": n + 4096, "exact_rss_kept_bytes": 8192,
            "exact_d2h_gbs": 54.0, "torch_d2h_gbs": 55.0, "torch_rss_growth_bytes": 2 << 30}
    assert "d2h.pinned" in ITEMS and pinned_verdict(n, good) == ""
    assert "not page-locked" in pinned_verdict(n, {**good, "exact_pinned": False})
    assert "grew the RSS by 2147483648 bytes" in pinned_verdict(n, {**good, "exact_rss_growth_bytes": 2 << 30})
    assert "grew the RSS by 0 bytes" in pinned_verdict(n, {**good, "exact_rss_growth_bytes": 0})  # not resident
    assert "all but" in pinned_verdict(n, {**good, "exact_rss_kept_bytes": PINNED_SLACK + 1})
    assert "GB/s" in pinned_verdict(n, {**good, "exact_d2h_gbs": 40.0})


def test_the_cuda_calls_pass_the_portable_flag_and_read_the_error_code(monkeypatch):
    seen = []

    class Err:  # torch binds cudaError_t as a pybind11 enum: its number is .value
        def __init__(self, v):
            self.value = v

    class Rt:
        def cudaHostRegister(self, ptr, n, flags):
            seen.append(("register", ptr, n, flags))
            return Err(0)

        def cudaHostUnregister(self, ptr):
            seen.append(("unregister", ptr))
            return Err(712)

    import contextlib

    monkeypatch.setattr(torch.cuda, "cudart", lambda: Rt())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "device", lambda d: (seen.append(("device", d)), contextlib.nullcontext())[1])
    cleared = []
    monkeypatch.setattr(pinned, "clear_last_error", lambda: cleared.append(1))
    register, unregister = pinned.cuda_register_calls()
    assert register(4096, 10) == 0 and unregister(4096) == 712 and cleared == []
    # both run on the device current at creation, whichever thread calls them
    assert seen == [("device", 3), ("register", 4096, 10, pinned.HOST_REGISTER_PORTABLE), ("device", 3),
                    ("unregister", 4096)]
    Rt.cudaHostRegister = lambda self, ptr, n, flags: Err(2)
    assert register(4096, 10) == 2 and cleared == [1]  # a failed registration's error is not left behind



def test_clearing_the_last_cuda_error_is_a_no_op_without_libcudart():
    pinned.clear_last_error()  # the CPU build loads no libcudart: nothing to call, nothing raised


def test_a_cuda_copy_that_fails_part_way_waits_for_its_queued_copies_before_the_error_leaves():
    """``D2H._drained_on_error`` (runtime/d2h.py): the side stream is synchronised before the buffer the
    failed copy wrote can be released; a failing wait does not replace the copy's own error."""
    from phoenix_hpc.runtime.d2h import D2H

    d = D2H(torch.device("cpu"))
    seen = []

    class Stream:
        def __init__(self, fail: bool):
            self.fail = fail

        def synchronize(self):
            seen.append("synchronize")
            if self.fail:
                raise RuntimeError("device lost")

    for fail in (False, True):
        d._stream = Stream(fail)
        with pytest.raises(ValueError, match="copy failed"):
            with d._drained_on_error():
                raise ValueError("copy failed")
    assert seen == ["synchronize", "synchronize"]
    with d._drained_on_error():  # no error: no wait
        pass
    assert len(seen) == 2


def test_a_failed_registration_falls_back_to_torchs_pinned_allocator_and_says_so():
    c = Calls(fail=1)
    asked = []

    def torch_pinned(n):  # stands for torch.empty(n, dtype=torch.uint8, pin_memory=True) (no CUDA here)
        asked.append(n)
        return torch.zeros(n, dtype=torch.uint8)

    with pytest.warns(pinned.PinnedFallbackWarning, match="torch's pinned allocator .*CUDA error 1"):
        t, how = pinned.pinned_or_torch(4097, c.pair(), torch_pinned)
    assert t.numel() == 4097 and asked == [4097] and how.startswith("torch's pinned allocator (pinned host buffer")
    t2, how2 = pinned.pinned_or_torch(4097, Calls().pair(), torch_pinned)
    assert how2 == "registered" and asked == [4097]

    def broken(n):
        raise RuntimeError("no CUDA")

    with pytest.raises(ReplicationError, match="CUDA error 1; torch's pinned allocator failed too: no CUDA"):
        pinned.pinned_or_torch(4097, c.pair(), broken)
    with pytest.raises(ReplicationError, match="is not allowed"):
        pinned.pinned_or_torch(-1, c.pair(), torch_pinned)
