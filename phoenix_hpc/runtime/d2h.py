"""D2H: copy the live engine state into a host snapshot buffer (docs/design.md section 3, "D2H").

Split in two halves so that only a negligible part runs on the training thread:

- :meth:`D2H.mark` (training thread, in ``start_snapshot``): on CUDA records an event on the current
  (compute) stream, so the copy is ordered after the ``optimizer_step`` that produced the state; on CPU it
  does nothing.
- :meth:`D2H.copy_checksummed` (the runtime's copy thread): on CUDA, a dedicated stream waits for that
  event, the tensors are copied with ``non_blocking=True`` into the pinned buffer with a blocking-sync event
  after every :attr:`D2H.event_bytes` of them, and each group's tensors are checksummed once its event passed, on
  ``checksum_threads`` threads (:mod:`.checksum_pool`) while the next groups are still on the link;
  on CPU, a plain copy in that background thread (torch releases the GIL while copying, so it overlaps the
  training thread's forward/backward), each tensor checksummed right after its copy. :meth:`D2H.copy` is
  the same copy without the checksums (one event at the end on CUDA).

Three choices of the job config change the CUDA path only (the CPU path is the same whatever they say):
``resilience.checksum: wsum64`` computes each tensor's checksum on the device from the live tensor
(:mod:`.wsum`), on the side stream before its copy, instead of on host threads after it landed;
``resilience.d2h_copy_coalesce`` copies consecutive tensors that view one device storage (an engine's flat
buffers) with one command per run (:func:`~phoenix_hpc.runtime.d2h_chunks.copy_runs`); and
``resilience.d2h_copy_chunk_bytes`` splits each copy into commands of at most that many bytes, so that no
single long command holds the copy engine (and, under ``CUDA_DEVICE_MAX_CONNECTIONS=1``, the one hardware
queue every stream's work then goes through).

The engine contract (``engines/base.py``) keeps the state stable from the end of ``optimizer_step`` of
step k-1 until ``optimizer_step`` of step k; the runtime's ``wait_commit`` (before ``optimizer_step``)
waits for this copy, so it never reads a half-updated state.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch

from phoenix_hpc.errors import ReplicationError
from phoenix_hpc.runtime.checksum import DEVICE_CHECKSUMS, checksum_function
from phoenix_hpc.runtime.checksum_pool import ChecksumPool, checksum_groups
from phoenix_hpc.runtime.d2h_chunks import copy_chunk_problem, copy_pieces, copy_runs
from phoenix_hpc.runtime.snapshot import SnapshotLayout, check_state, copy_in, slot_views


class D2H:
    """Device-to-host copier for one rank. ``device`` is the engine's device (``cpu`` or ``cuda:N``)."""

    #: on CUDA, bytes of tensors copied between two events of :meth:`copy_checksummed` (:func:`event_ends`):
    #: few enough events that the thread wakes a few times per step, each group small enough that its
    #: checksum overlaps the next groups' transfer
    event_bytes = 64 << 20

    def __init__(self, device: torch.device, checksum_threads: int = 1, thread_nice: int = 0,
                 copy_chunk_bytes: int = 0, copy_coalesce: bool = False):
        """``copy_chunk_bytes``: on CUDA, split every tensor's copy into commands of at most this many bytes
        (``resilience.d2h_copy_chunk_bytes``; :func:`copy_pieces`); 0: one command per tensor.
        ``copy_coalesce``: on CUDA, copy consecutive tensors that view one device storage as their slots lie
        in the buffer with one command (``resilience.d2h_copy_coalesce``; :func:`copy_runs`), then split by
        ``copy_chunk_bytes``.

        Raises:
            ReplicationError: ``copy_chunk_bytes`` negative, or positive and not a multiple of 16.
        """
        problem = copy_chunk_problem(copy_chunk_bytes)
        if problem:
            raise ReplicationError(problem)
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.copy_chunk_bytes = int(copy_chunk_bytes)
        self.copy_coalesce = bool(copy_coalesce)
        # CUDA: the threads that checksum each group of tensors once it landed (checksum_pool.py); the CPU
        # path checksums in the copy thread, right after each copy, while the bytes are in its cache
        self.checksums = ChecksumPool(checksum_threads if self.cuda else 1, thread_nice)
        self._stream = torch.cuda.Stream(device=self.device) if self.cuda else None
        # the typed views of the buffers copied into (the ping-pong pair), built once per buffer and layout
        self._views: dict[int, tuple[torch.Tensor, SnapshotLayout, tuple[torch.Tensor, ...]]] = {}

    @property
    def pin(self) -> bool:
        """Whether host buffers should be page-locked (CUDA only: pinned memory makes the copy async)."""
        return self.cuda

    def mark(self) -> Any:
        """Training thread: a token that orders the copy after all work queued so far (CUDA event)."""
        if not self.cuda:
            return None
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(self.device))
        return ev

    def copy(self, token: Any, buf: torch.Tensor, layout: SnapshotLayout, opt: list, params: list) -> None:
        """Copy thread: copy ``opt`` + ``params`` into ``buf``; returns when the bytes are in host memory.
        Raises ReplicationError when the tensors do not match ``layout`` (:func:`copy_in`)."""
        views = self._views_of(buf, layout)
        if not self.cuda:
            copy_in(buf, layout, opt, params, views=views)
            return
        with self._drained_on_error(), torch.cuda.device(self.device), torch.cuda.stream(self._stream):
            self._stream.wait_event(token)
            if self.copy_chunk_bytes or self.copy_coalesce:
                pairs = check_state(layout, opt, params, views)
                self._issue_group(buf, layout, pairs, views, 0, len(pairs))
            else:
                copy_in(buf, layout, opt, params, non_blocking=True, views=views)
            done = torch.cuda.Event()
            done.record(self._stream)
        done.synchronize()

    def copy_checksummed(self, token: Any, buf: torch.Tensor, layout: SnapshotLayout, opt: list, params: list,
                         checksum: str) -> tuple[list[int], int, int]:
        """Copy thread: copy ``opt`` + ``params`` into ``buf`` as :meth:`copy` does and checksum every tensor
        (``checksum``, :data:`~phoenix_hpc.runtime.checksum.CHECKSUMS`) right after its bytes landed: on CPU
        while they are still in the core's cache (separate passes read the whole snapshot from memory
        again), on CUDA while the next tensors are still on the link (an event after every
        :attr:`event_bytes` of tensors, :func:`event_ends`, created with blocking synchronisation, so that
        the thread sleeps instead of spinning until the bytes are there), each group's tensors on the
        checksum threads (:func:`~phoenix_hpc.runtime.checksum_pool.checksum_groups`).

        Returns ``(sums, copy_ns, checksum_ns)``: the checksum of every slot in slot order, as
        :func:`~phoenix_hpc.runtime.snapshot.checksums` of the whole ``buf`` would give, and this thread's
        CPU time (``time.thread_time_ns``, ns) split between copying and checksumming. On CUDA the copy
        part is this thread's own (issuing the copies; the waits for the events sleep and cost next to
        nothing) and the checksum part the checksum threads' time over each tensor, summed; on CPU, where copy and checksum alternate per tensor, the
        loop's CPU time is split by the wall-time shares of the two halves (a thread clock read per tensor
        is a system call, 0.6 us here). Raises ReplicationError when the tensors do not match ``layout`` or
        the algorithm is unknown."""
        fn = checksum_function(checksum)
        views = self._views_of(buf, layout)
        pairs = check_state(layout, opt, params, views)
        mv = memoryview(buf.numpy())
        sums: list[int] = []
        c0 = time.thread_time_ns()
        if self.cuda and checksum in DEVICE_CHECKSUMS:
            return self._copy_device_checksummed(token, buf, layout, pairs, views, c0)
        if self.cuda:
            ends = event_ends(layout.slots, self.event_bytes)
            events = []
            with self._drained_on_error():
                with torch.cuda.device(self.device), torch.cuda.stream(self._stream), torch.no_grad():
                    self._stream.wait_event(token)
                    start = 0
                    for end in ends:
                        self._issue_group(buf, layout, pairs, views, start, end)
                        ev = torch.cuda.Event(blocking=True)
                        ev.record(self._stream)
                        events.append(ev)
                        start = end
                sums, sum_ns = checksum_groups(mv, layout.slots, ends, lambda i: events[i].synchronize(), fn,
                                               self.checksums)
            own = time.thread_time_ns() - c0  # with one checksum thread, the checksums ran in this one
            return sums, own - (sum_ns if self.checksums.threads == 1 else 0), sum_ns
        wall_copy = wall_sum = 0
        with torch.no_grad():
            for (_, t), slot, view in zip(pairs, layout.slots, views):
                t0 = time.perf_counter_ns()
                view.copy_(t)
                t1 = time.perf_counter_ns()
                sums.append(fn(mv[slot.offset : slot.offset + slot.nbytes]))
                wall_copy, wall_sum = wall_copy + t1 - t0, wall_sum + time.perf_counter_ns() - t1
        cpu = time.thread_time_ns() - c0
        copy_ns = cpu * wall_copy // max(1, wall_copy + wall_sum)
        return sums, copy_ns, cpu - copy_ns

    def _issue_group(self, buf: torch.Tensor, layout: SnapshotLayout, pairs: list, views: tuple, lo: int,
                     hi: int) -> None:
        """Queue the copies of tensors ``lo .. hi-1`` into their slots: one :meth:`_issue` each, or with
        :attr:`copy_coalesce` one per run of :func:`copy_runs` (a run's source span is a uint8 view of the
        storage its tensors share)."""
        if not self.copy_coalesce:
            for (_, t), view in zip(pairs[lo:hi], views[lo:hi]):
                self._issue(view, t)
            return
        items = []
        for k in range(lo, hi):
            t, slot = pairs[k][1], layout.slots[k]
            st = t.untyped_storage()
            key = st.data_ptr() if t.is_contiguous() else -1 - k  # a strided tensor is a run of its own
            items.append((key, t.storage_offset() * t.element_size(), t.numel() * t.element_size(), slot.offset,
                          st.nbytes()))
        for a, b in copy_runs(items):
            if b - a == 1:
                self._issue(views[lo + a], pairs[lo + a][1])
                continue
            src0, n = items[a][1], items[b - 1][1] + items[b - 1][2] - items[a][1]
            src = torch.empty(0, dtype=torch.uint8, device=pairs[lo + a][1].device)
            src.set_(pairs[lo + a][1].untyped_storage(), src0, (n,), (1,))
            d0 = items[a][3]
            self._issue(buf[d0 : d0 + n], src)

    def _issue(self, view: torch.Tensor, t: torch.Tensor) -> None:
        """Queue the copy of ``t`` into its slot view on the current (side) stream: one command, or commands
        of at most :attr:`copy_chunk_bytes` (:func:`copy_pieces`)."""
        nbytes = t.numel() * t.element_size()
        if not self.copy_chunk_bytes or nbytes <= self.copy_chunk_bytes:
            view.copy_(t, non_blocking=True)
            return
        src, dst = t.reshape(-1), view.reshape(-1)
        for a, b in copy_pieces(t.numel(), t.element_size(), self.copy_chunk_bytes):
            dst[a:b].copy_(src[a:b], non_blocking=True)

    def _copy_device_checksummed(self, token: Any, buf: torch.Tensor, layout: SnapshotLayout, pairs: list,
                                 views: tuple, c0: int) -> tuple[list[int], int, int]:
        """CUDA with a device checksum (:data:`~phoenix_hpc.runtime.checksum.DEVICE_CHECKSUMS`): on the side
        stream, after ``token``, each tensor's partial sums (:func:`phoenix_hpc.runtime.wsum.partials`) are
        computed from the device tensor and its copy queued; the partials (16 bytes per 16 KiB) come to the
        host with the last copy, and are folded there. The checksum is of the state the copy read, taken
        before its bytes crossed the link: a copy that lands wrong fails the restore's or the holder's
        verification of the host bytes. Returns as :meth:`copy_checksummed`; the checksum part is this
        thread's folding time."""
        from phoenix_hpc.runtime.wsum import fold, partials

        parts = []
        with self._drained_on_error():
            with torch.cuda.device(self.device), torch.cuda.stream(self._stream), torch.no_grad():
                self._stream.wait_event(token)
                for (_, t) in pairs:
                    parts.append(partials(t))
                self._issue_group(buf, layout, pairs, views, 0, len(pairs))
                counts = [p.shape[0] for p in parts]
                host = torch.cat(parts).to("cpu", non_blocking=True) if parts else torch.zeros(0, 2, dtype=torch.int64)
                done = torch.cuda.Event(blocking=True)
                done.record(self._stream)
            done.synchronize()
        own = time.thread_time_ns() - c0
        f0 = time.thread_time_ns()
        rows, sums, start = host.numpy(), [], 0
        for (_, t), k in zip(pairs, counts):
            sums.append(fold(rows[start : start + k], t.numel() * t.element_size()))
            start += k
        fold_ns = time.thread_time_ns() - f0
        return sums, own, fold_ns

    @contextlib.contextmanager
    def _drained_on_error(self):
        """Around a CUDA copy: if it fails part-way, wait until every copy queued on the side stream has
        landed before the error leaves, so that no buffer is released (:mod:`phoenix_hpc.runtime.pinned`
        unregisters and unmaps it) while the device still writes into it. An error of that wait is left to
        the one being raised."""
        try:
            yield
        except BaseException:
            try:
                self._stream.synchronize()
            except Exception:  # noqa: BLE001 - the copy's own error is the one to report
                pass
            raise

    def _views_of(self, buf: torch.Tensor, layout: SnapshotLayout) -> tuple[torch.Tensor, ...]:
        """The slot views of ``buf`` for ``layout``, built on first use (a snapshot of small tensors spends
        more CPU time building 200 views than copying their bytes). At most the two buffers of the
        ping-pong pair are kept; the views hold the buffers, so :meth:`forget` drops them."""
        got = self._views.get(id(buf))
        if got is not None and got[0] is buf and got[1] is layout:
            return got[2]
        if len(self._views) >= 2:
            self._views.clear()
        views = slot_views(buf, layout)
        self._views[id(buf)] = (buf, layout, views)
        return views

    def forget(self) -> None:
        """Drop the cached views (and with them this object's references to the buffers) and stop the
        checksum threads (they end once their checksums did; a later copy starts them again)."""
        self.checksums.close()
        self._views.clear()


def event_ends(slots, event_bytes: int) -> list[int]:
    """Where :meth:`D2H.copy_checksummed` records its events on CUDA (pure): the end index (exclusive) of
    each group of consecutive ``slots`` (:class:`~phoenix_hpc.runtime.snapshot.TensorSlot`, in buffer
    order) that spans at least ``event_bytes`` of the buffer, the last group ending with the last slot. A
    tensor is never split. Empty for no slots."""
    ends: list[int] = []
    start = slots[0].offset if slots else 0
    for i in range(1, len(slots) + 1):
        if i == len(slots) or slots[i].offset - start >= event_bytes:
            ends.append(i)
            if i < len(slots):
                start = slots[i].offset
    return ends
