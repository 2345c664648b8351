"""Checksums of a snapshot's tensors on several host threads (``resilience.checksum_threads``, docs/design.md
section 4, Checksums).

On a GPU node the D2H copy runs on the copy engine at the host link's rate (54.7 GB/s measured on an H200
over PCIe gen 5 x16), while one core checksummed pinned host memory at 8.1-11.3 GB/s (xxh3_64, three runs):
for a 1B-parameter model's 14.1 GB snapshot the checksum, not the copy, set the protection time (D2H +
checksums 1483-1817 ms per step, the copy alone 258 ms). The three checksum libraries release the GIL over a large buffer (measured on this
project's 2-core machine: two threads hash two 256 MiB buffers 1.57x (xxh3_64), 1.39x (crc32c) and 1.95x
(zlib crc32) faster than one), so a tensor's checksum can run on another thread while the copy thread
waits for the next tensors. Each tensor's checksum is the same value whichever thread takes it: holders
and owners keep comparing the same numbers.

A tensor is never split (its checksum is one call over its bytes), so the parallelism is over tensors: a
snapshot dominated by one huge tensor gains little.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

#: ``"auto"`` takes half of this process's CPUs, at most this many (a GPU rank's cores also feed the data
#: loader and the launcher). 8 threads hashed 28.2 GB/s against 8.1 for one on the H200 host (16 CPUs);
#: more threads were not measured
AUTO_MAX_THREADS = 8
#: the bounds of ``resilience.checksum_threads`` (the config field declares the same; a unit test ties them)
THREADS_MIN, THREADS_MAX = 1, 64


def available_cpus() -> int:
    """CPUs this process may run on (``sched_getaffinity``: what Slurm's ``--cpus-per-task`` binding left)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def threads_problem(value: object) -> str | None:
    """Why ``value`` is not an allowed ``resilience.checksum_threads`` (``"auto"`` or an ``int`` from
    :data:`THREADS_MIN` to :data:`THREADS_MAX`; a ``bool`` is not one), naming the field, the value and what
    is allowed; None when it is allowed. Pure."""
    if value == "auto" and isinstance(value, str):
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not THREADS_MIN <= value <= THREADS_MAX:
        return (f"resilience.checksum_threads: value {value!r} is not allowed (allowed: 'auto' or an integer "
                f"from {THREADS_MIN} to {THREADS_MAX})")
    return None


def resolve_threads(setting: int | str, cuda: bool, cpus: int) -> int:
    """The number of checksum threads for ``resilience.checksum_threads = setting`` (pure): an integer is
    taken as given (the D2H uses them on a CUDA rank only: :class:`~phoenix_hpc.runtime.d2h.D2H`);
    ``"auto"`` is 1 for a CPU rank (whose copy thread checksums each tensor right after
    copying it, while the bytes are in its cache, and whose cores are the compute's) and
    ``min(AUTO_MAX_THREADS, cpus // 2)``, at least 1, for a CUDA rank with ``cpus`` CPUs.

    Raises ValueError for a setting that is neither ``"auto"`` nor an integer from :data:`THREADS_MIN` to
    :data:`THREADS_MAX` (the config refuses those first)."""
    problem = threads_problem(setting)
    if problem is not None:
        raise ValueError(problem)
    if setting == "auto":
        return max(1, min(AUTO_MAX_THREADS, cpus // 2)) if cuda else 1
    return int(setting)


def timed(fn: Callable[[object], int], view) -> tuple[int, int]:
    """``(fn(view), CPU ns of the calling thread spent in it)``."""
    c0 = time.thread_time_ns()
    value = fn(view)
    return value, time.thread_time_ns() - c0


def _nice_at_least(target: int) -> None:
    """Pool initializer: raise the calling thread's nice value to ``target`` (never lower it: that needs
    ``CAP_SYS_NICE``)."""
    tid = threading.get_native_id()
    if os.getpriority(os.PRIO_PROCESS, tid) < target:
        os.setpriority(os.PRIO_PROCESS, tid, target)


class ChecksumPool:
    """``threads`` worker threads (``phoenix-checksum-N``), started on first use, each at the process's
    nice value + ``nice`` (``resilience.thread_nice``, capped at 19): a thread inherits its creator's nice
    value, and the creator is usually the copy thread, already made nicer, so the value is set absolutely,
    not added again. With one thread nothing is started: :meth:`submit` computes in the caller's thread."""

    def __init__(self, threads: int, nice: int = 0):
        self.threads = max(1, int(threads))
        self.nice = int(nice)
        self._pool: ThreadPoolExecutor | None = None

    def _start(self) -> None:
        from phoenix_hpc.runtime.thread_priority import NICE_MAX

        target = min(NICE_MAX, os.getpriority(os.PRIO_PROCESS, os.getpid()) + self.nice)  # the main thread's + nice
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="phoenix-checksum",
                                        initializer=_nice_at_least, initargs=(target,))

    def submit(self, fn: Callable[[object], int], view) -> Future:
        """A future of :func:`timed` ``(fn, view)``; it raises what ``fn`` raised. ``view`` must stay valid
        until the future is done."""
        if self.threads == 1:
            f: Future = Future()
            try:
                f.set_result(timed(fn, view))
            except BaseException as e:  # noqa: BLE001 -- handed to the caller through the future
                f.set_exception(e)
            return f
        if self._pool is None:
            self._start()
        return self._pool.submit(timed, fn, view)

    def close(self) -> None:
        """Let running checksums finish and stop the threads (a later :meth:`submit` starts new ones)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def checksum_groups(mv, slots, ends: list[int], wait: Callable[[int], None], fn: Callable[[object], int],
                    pool: ChecksumPool) -> tuple[list[int], int]:
    """Checksum ``slots`` (:class:`~phoenix_hpc.runtime.snapshot.TensorSlot`, buffer order) of the byte view
    ``mv`` group by group: for each group ``i`` (slots ``ends[i-1]:ends[i]``) ``wait(i)`` returns once its
    bytes are in ``mv`` (a CUDA event, :meth:`phoenix_hpc.runtime.d2h.D2H.copy_checksummed`), then its
    tensors go to ``pool`` while the next group is awaited. Returns ``(sums in slot order, CPU ns the
    checksums took, summed over the threads that ran them)``. Raises what a checksum or ``wait`` raised,
    after every submitted checksum ended (none reads the buffer afterwards)."""
    futures: list[Future] = []
    try:
        start = 0
        for i, end in enumerate(ends):
            wait(i)
            futures.extend(pool.submit(fn, mv[s.offset : s.offset + s.nbytes]) for s in slots[start:end])
            start = end
    finally:
        done = [f.exception() is None and f.result() for f in futures]  # waits for every one
    sums, ns = [], 0
    for f, ok in zip(futures, done):
        if not ok:
            raise f.exception()
        sums.append(ok[0])
        ns += ok[1]
    return sums, ns
