"""Ping-pong host buffers and their memory plan (docs/design.md section 4).

Every rank keeps two local snapshot buffers (committed / staging) and, for every shard it holds for another
rank, two replica buffers (committed / receiving). A copy only ever writes the non-committed buffer of a
pair, so a fault during a copy can damage only that buffer; the committed one is never written while it is
committed and always verifies.

Host memory per rank (docs/design.md section 4)::

    2 x snapshot_bytes + 2 x sum(replica_bytes of each held shard)   ( = 2 x snapshot + 2k x replica when the
                                                                      rank holds k replicas of equal size)

where ``replica_bytes`` = 64-byte header + index capacity + optimizer shard (see ``snapshot``). The check
against ``MemAvailable`` (proc(5), ``/proc/meminfo``) happens before anything is allocated.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from phoenix_hpc.errors import ReplicationError


@dataclass(frozen=True)
class MemoryPlan:
    """Host bytes this rank will pin/allocate. ``held`` maps each held shard id to its replica bytes."""

    snapshot_bytes: int
    held: tuple[tuple[str, int], ...]

    @property
    def local_bytes(self) -> int:
        return 2 * self.snapshot_bytes

    @property
    def replica_bytes(self) -> int:
        return 2 * sum(b for _, b in self.held)

    @property
    def total_bytes(self) -> int:
        return self.local_bytes + self.replica_bytes

    def describe(self) -> str:
        reps = " + ".join(f"2 x {b} ({s})" for s, b in self.held) or "0"
        return (
            f"host buffers: 2 x {self.snapshot_bytes} (local snapshot, committed/staging) + {reps} "
            f"(held replicas, committed/receiving) = {self.total_bytes} bytes ({self.total_bytes / 2**20:.1f} MiB)"
        )


def parse_mem_available(meminfo_text: str) -> int:
    """``MemAvailable`` in bytes from the text of ``/proc/meminfo`` (proc(5): "MemAvailable: N kB").

    Raises ReplicationError when the field is missing (kernels before 3.14).
    """
    for line in meminfo_text.splitlines():
        if line.startswith("MemAvailable:"):
            parts = line.split()
            return int(parts[1]) * (1024 if len(parts) > 2 and parts[2] == "kB" else 1)
    raise ReplicationError("/proc/meminfo has no MemAvailable field; cannot check host memory for the buffers")


def read_mem_available(path: str = "/proc/meminfo") -> int:
    """``MemAvailable`` of this host in bytes (reads ``path``)."""
    with open(path) as f:
        return parse_mem_available(f.read())


def check_host_memory(plan: MemoryPlan, available_bytes: int, ranks_per_node: int = 1, reserve_fraction: float = 0.1) -> None:
    """Raise ReplicationError unless ``ranks_per_node`` ranks with this plan fit in ``available_bytes``
    while leaving ``reserve_fraction`` of it free (for the training process itself, the page cache, ...).

    All ranks of a node share one host's memory, so the need is ``ranks_per_node x plan.total_bytes``.
    """
    need = ranks_per_node * plan.total_bytes
    budget = int(available_bytes * (1.0 - reserve_fraction))
    if need > budget:
        raise ReplicationError(
            f"not enough host memory for the replication buffers: {ranks_per_node} rank(s) on this node x "
            f"{plan.total_bytes} bytes = {need} bytes needed, MemAvailable is {available_bytes} bytes "
            f"({budget} usable after keeping {reserve_fraction:.0%} free); {plan.describe()}. Lower "
            "resilience.k, use more DP ranks (smaller optimizer shards), or more nodes"
        )


class PingPong:
    """Two equally sized uint8 host buffers; one is *committed* (holds a complete, verified copy of
    ``committed_step``), the other is the write target (*staging* locally, *receiving* for a held shard).

    Thread safety: state changes take an internal lock. The committed buffer is written by nobody; the
    target buffer by exactly one writer at a time (the runtime's copy or receive path).
    """

    def __init__(self, bufs: tuple[torch.Tensor, torch.Tensor], name: str):
        self.bufs = bufs
        self.name = name
        self.steps: list[int | None] = [None, None]  # step of the verified content of each buffer
        self.committed_idx: int | None = None
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return self.bufs[0].numel()

    def target_idx(self) -> int:
        """Index of the buffer a new copy must write (never the committed one)."""
        with self._lock:
            return 0 if self.committed_idx is None else 1 - self.committed_idx

    def target_content_step(self) -> int | None:
        """Step whose copy the next write will destroy (None if the target holds nothing valid)."""
        with self._lock:
            return self.steps[0 if self.committed_idx is None else 1 - self.committed_idx]

    def begin_write(self, idx: int) -> torch.Tensor:
        """Mark buffer ``idx`` invalid (about to be written) and return it. Raises if it is committed."""
        with self._lock:
            if idx == self.committed_idx:
                raise RuntimeError(f"{self.name}: refusing to write the committed buffer")
            self.steps[idx] = None
            return self.bufs[idx]

    def commit(self, idx: int, step: int) -> None:
        """Flip: buffer ``idx`` (just written and verified, holding ``step``) becomes committed; the other
        keeps its older verified content until it is next written."""
        with self._lock:
            self.steps[idx] = step
            self.committed_idx = idx

    def committed(self) -> tuple[int | None, torch.Tensor | None]:
        """``(step, buffer)`` of the committed copy, ``(None, None)`` before the first commit."""
        with self._lock:
            if self.committed_idx is None:
                return None, None
            return self.steps[self.committed_idx], self.bufs[self.committed_idx]

    def verified_steps(self) -> list[int]:
        """Steps of the verified copies this pair holds, the committed one first (at most two; a buffer
        being written counts for nothing)."""
        with self._lock:
            order = [] if self.committed_idx is None else [self.committed_idx, 1 - self.committed_idx]
            return [self.steps[i] for i in order if self.steps[i] is not None]

    def invalidate(self, step: int) -> None:
        """Forget the copy of ``step`` (it failed a re-verification): it no longer counts as verified and
        :meth:`find` no longer returns it. The buffer's bytes stay as they are."""
        with self._lock:
            for i in (0, 1):
                if self.steps[i] == step:
                    self.steps[i] = None

    def find(self, step: int) -> torch.Tensor | None:
        """The buffer holding a verified copy of ``step`` (committed or the previous one), else None."""
        with self._lock:
            for i in (0, 1):
                if self.steps[i] == step:
                    return self.bufs[i]
            return None


def host_empty(nbytes: int, pin: bool = False) -> torch.Tensor:
    """A uint8 host tensor of ``nbytes`` whose pages are left untouched
    (:func:`phoenix_hpc.engines.alloc.no_fill`): without it, the ranks' deterministic mode writes every byte
    of a new tensor (about 0.1 s of CPU for the 218 MB of a 10.8 M-parameter rank, measured), only to be
    overwritten. Every buffer made here is written before it is read (a copy fills the target of a pair before
    its commit; a receive fills its buffer before it is unpacked; checksums cover written bytes only).
    ``pin``: page-locked for the CUDA device, exactly ``nbytes`` (:func:`phoenix_hpc.runtime.pinned.pinned_empty`,
    not torch's caching host allocator, which rounds up to a power of two); resident at once. Where that
    registration fails, torch's pinned allocator instead, with a warning
    (:func:`~phoenix_hpc.runtime.pinned.pinned_or_torch`).

    Raises:
        ReplicationError: ``pin`` and both ways of page-locking fail.
        MemoryError: the mapping of an unpinned buffer fails (ENOMEM)."""
    if pin:
        from phoenix_hpc.runtime.pinned import pinned_or_torch

        return pinned_or_torch(nbytes)[0]
    if nbytes <= 0:
        return torch.empty(0, dtype=torch.uint8)
    import mmap

    # its own anonymous mapping (mmap(2)), not the C heap: freed, its pages go back to the kernel at once. A
    # heap block of this size (glibc raises its mmap threshold to the size of a freed mapping, mallopt(3),
    # so after the first recovery freed the first generation's buffers, the next ones came from the heap)
    # left the heap grown and fragmented after every recovery. The pages are untouched until written.
    try:
        region = mmap.mmap(-1, nbytes)
    except OSError as exc:  # ENOMEM: as an allocation failure of torch's own allocator
        raise MemoryError(f"mmap of {nbytes} bytes: {exc}") from None
    return torch.frombuffer(region, dtype=torch.uint8)


def allocate_pair(nbytes: int, pin: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Two uint8 host tensors of ``nbytes`` each (:func:`host_empty`: page-locked and exactly sized when
    ``pin``, else with their pages untouched)."""
    return host_empty(nbytes, pin), host_empty(nbytes, pin)


@dataclass
class BufferSet:
    """All host buffers of one rank: ``local`` (committed/staging) and ``held[shard_id]``
    (committed/receiving)."""

    local: PingPong
    held: dict[str, PingPong]

    @property
    def total_bytes(self) -> int:
        return 2 * self.local.nbytes + sum(2 * p.nbytes for p in self.held.values())


def allocate_buffers(plan: MemoryPlan, pin: bool) -> BufferSet:
    """Allocate every buffer of ``plan`` or nothing: on any allocation failure the buffers already made are
    released and ReplicationError is raised. Call :func:`check_host_memory` first."""
    made: list[torch.Tensor] = []
    try:
        local = allocate_pair(plan.snapshot_bytes, pin)
        made.extend(local)
        held = {}
        for shard, nbytes in plan.held:
            pair = allocate_pair(nbytes, pin)
            made.extend(pair)
            held[shard] = PingPong(pair, f"replica {shard}")
    except (RuntimeError, MemoryError, ReplicationError) as e:  # ReplicationError: page-locking failed
        made.clear()
        raise ReplicationError(f"allocating the replication buffers failed ({plan.describe()}): {e}") from e
    return BufferSet(PingPong(local, "local snapshot"), held)
