"""Page-locked host buffers of exactly the size asked (docs/design.md section 4, "Host memory").

``torch.empty(n, pin_memory=True)`` goes through torch's caching host allocator, which rounds every request
up to the next power of two and keeps freed blocks page-locked in its cache for later requests
(``ATen/core/CachingHostAllocator.h``: ``PowerOf2Ceil`` unless ``pinned_max_round_threshold`` says otherwise,
which it does not by default; pytorch issue 150517). A snapshot buffer of 1.43 GB pinned 2 GiB: the GPU
check's ``memory.host`` measured the RSS growth of a protector's pair at 1.508 x its plan, 4,300,423,168
bytes for two buffers of 1,425,710,400. The protector's buffers are allocated once per generation and never
resized, so the cache's reuse buys nothing and its rounding costs up to twice the host memory the
start-up check (:func:`phoenix_hpc.runtime.buffers.check_host_memory`) plans for.

:func:`pinned_empty` maps exactly ``nbytes`` of anonymous memory (``mmap(2)``) and page-locks the range with
``cudaHostRegister`` (CUDA runtime API, flag ``cudaHostRegisterPortable``: page-locked for every CUDA context
of the process, whichever device was current when it was made; the device can DMA into it and a
``non_blocking`` device-to-host copy into it is asynchronous, as into ``cudaHostAlloc`` memory; torch's
``is_pinned()`` is true for it). The tensor's storage holds a ``memoryview`` of the mapping; when the last
tensor using that storage is gone (typed views such as ``view(torch.float32)`` included, which do not keep
the first tensor alive), the memoryview is freed, and its finalizer unregisters the range
(``cudaHostUnregister``) and only then lets the mapping go (``munmap``), so no byte is unmapped while
registered and none is unregistered while a tensor can still reach it.
"""

from __future__ import annotations

import mmap
import weakref
from typing import Callable

import torch

from phoenix_hpc.errors import ReplicationError

#: ``cudaHostRegisterPortable`` (CUDA runtime API, ``cudaHostRegister`` flags): pinned for all CUDA contexts.
HOST_REGISTER_PORTABLE = 1

Register = Callable[[int, int], int]  # (address, bytes) -> CUDA error code, 0 = cudaSuccess
Unregister = Callable[[int], int]  # (address) -> CUDA error code


def cuda_register_calls() -> tuple[Register, Unregister]:
    """``cudaHostRegister`` / ``cudaHostUnregister`` through torch's bindings of the CUDA runtime
    (``torch.cuda.cudart()``), each returning the CUDA error code as an int. Both run with the device that
    is current now made current again: the unregistration may run on any thread (the one that drops the
    last reference, or the garbage collector's), where device 0 would be current and the runtime would
    create a context on it. A failed registration's error is cleared from the calling thread's last error
    (``cudaGetLastError``), so that the next kernel launch does not report it as its own. Raises what
    ``torch.cuda.cudart`` raises without CUDA."""
    rt = torch.cuda.cudart()
    dev = torch.cuda.current_device()

    def code(rc) -> int:
        return int(getattr(rc, "value", rc))

    def register(ptr: int, n: int) -> int:
        with torch.cuda.device(dev):
            rc = code(rt.cudaHostRegister(ptr, n, HOST_REGISTER_PORTABLE))
            if rc != 0:
                clear_last_error()
            return rc

    def unregister(ptr: int) -> int:
        with torch.cuda.device(dev):
            return code(rt.cudaHostUnregister(ptr))

    return register, unregister


def clear_last_error() -> None:
    """Reset the calling thread's CUDA last error (``cudaGetLastError`` of the ``libcudart`` this process
    loaded, found in ``/proc/self/maps``); nothing when none is loaded or it cannot be called."""
    import ctypes

    try:
        # /proc/self/maps by hand, not psutil's Process().memory_maps(): that one parses /proc/self/smaps
        # (per-mapping memory counts), measured 15-17 ms against 0.6-6 ms for maps in a process with torch
        # loaded (about 350 mappings, this 2-core host), and only the paths are needed here
        with open("/proc/self/maps") as f:
            path = min((ln.split()[-1] for ln in f if "libcudart" in ln and ".so" in ln), default=None)
        if path is not None:
            ctypes.CDLL(path).cudaGetLastError()
    except (OSError, AttributeError):
        pass


def _release(unregister: Unregister, ptr: int, mapping: mmap.mmap) -> None:  # noqa: ARG001 - ``mapping``
    """Finalizer of the memoryview behind a :func:`pinned_empty` storage: unregister the range. The finalizer
    holds ``mapping`` until this returns, so it is unmapped only after, when that last reference goes. An
    error code is ignored: nothing else can be done with it."""
    unregister(ptr)


def _check_nbytes(nbytes: object) -> None:
    """Raises ReplicationError unless ``nbytes`` is an allowed buffer size (an integer >= 0)."""
    if not isinstance(nbytes, int) or nbytes < 0:
        raise ReplicationError(f"pinned host buffer: {nbytes!r} bytes is not allowed (allowed: an integer >= 0)")


def pinned_empty(nbytes: int, calls: tuple[Register, Unregister] | None = None) -> torch.Tensor:
    """A uint8 host tensor of exactly ``nbytes``, page-locked for the CUDA device (see the module doc). Its
    pages are written by the registration (the kernel maps and locks each one, zero-filled), so it is
    resident at once, as ``cudaHostAlloc`` memory is. ``calls``: the register / unregister functions
    (default :func:`cuda_register_calls`; the CPU tests pass their own).

    Raises:
        ReplicationError: ``nbytes`` is negative, the mapping fails, or ``cudaHostRegister`` returns an error
            (its code and the size named; the mapping is released again)."""
    _check_nbytes(nbytes)
    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    register, unregister = calls if calls is not None else cuda_register_calls()
    try:
        mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError as e:
        raise ReplicationError(f"pinned host buffer: mapping {nbytes} bytes failed: {e}") from None
    if hasattr(mmap, "MADV_DONTFORK"):  # a process forked later (data-loader workers) does not share the pages
        mapping.madvise(mmap.MADV_DONTFORK)  # copy-on-write, which page-locked pages must never become
    view = memoryview(mapping)  # what the storage holds: its lifetime is the storage's
    t = torch.frombuffer(view, dtype=torch.uint8)
    ptr = t.data_ptr()
    rc = register(ptr, nbytes)
    if rc != 0:
        del t  # the storage's hold on the memoryview, and with it the export of the mapping, goes
        view.release()
        mapping.close()
        raise ReplicationError(f"pinned host buffer: cudaHostRegister of {nbytes} bytes returned CUDA error {rc}")
    # not at interpreter exit (atexit=False): the buffers are still reachable then and a daemon copy thread may
    # be using them; the process's end releases the mapping and its registration
    weakref.finalize(view, _release, unregister, ptr, mapping).atexit = False
    return t


class PinnedFallbackWarning(RuntimeWarning):
    """A buffer that :func:`pinned_empty` could not page-lock came from torch's pinned allocator instead."""


def pinned_or_torch(nbytes: int, calls: tuple[Register, Unregister] | None = None,
                    torch_pinned: Callable[[int], torch.Tensor] | None = None) -> tuple[torch.Tensor, str]:
    """A page-locked uint8 host tensor of ``nbytes``: :func:`pinned_empty`, or where its mapping or its
    ``cudaHostRegister`` fails (some drivers and containers refuse to register anonymous mappings, or cap
    the locked memory), torch's pinned allocator (``torch.empty(..., pin_memory=True)``, ``cudaHostAlloc``:
    rounded up to a power of two and cached by torch). Returns ``(tensor, how)``: ``how`` is ``"registered"``,
    or says that torch's allocator was used and why; the fallback also warns
    (:class:`PinnedFallbackWarning`). ``torch_pinned``: the fallback allocator (tests pass their own).

    Raises:
        ReplicationError: ``nbytes`` is not allowed, or both ways failed (both errors named)."""
    import warnings

    _check_nbytes(nbytes)  # bad input is refused, not retried with torch's allocator
    try:
        return (pinned_empty(nbytes) if calls is None else pinned_empty(nbytes, calls)), "registered"
    except ReplicationError as e:
        first = str(e)
    alloc = torch_pinned or (lambda n: torch.empty(n, dtype=torch.uint8, pin_memory=True))
    try:
        t = alloc(nbytes)
    except Exception as e:  # noqa: BLE001 -- torch raises RuntimeError or AssertionError (no CUDA build)
        raise ReplicationError(f"{first}; torch's pinned allocator failed too: {e}") from None
    how = f"torch's pinned allocator ({first})"
    warnings.warn(f"{how}: the buffer is page-locked, rounded up to a power of two by torch", PinnedFallbackWarning,
                  stacklevel=2)
    return t, how
