"""CPU time of the protection path, split by what it is spent on (docs/design.md section 4, "Cost").

Every runtime thread measures its own CPU time with ``time.thread_time_ns()`` (``CLOCK_THREAD_CPUTIME_ID``,
clock_gettime(2): CPU time of the calling thread only, not wall time, not other threads') around each piece
of work and adds it to one of four categories:

- ``copy``: D2H of the engine state into the staging buffer (the copy thread);
- ``checksum``: checksums of the snapshot (owner) and of every received replica (holder), index parse
  included on the holder;
- ``mpi``: the H2H engine's progress and polling (its thread, or the training thread when MPI's thread
  level makes it drive the engine), including the time MPI spends copying message bytes;
- ``bookkeeping``: everything else the runtime does on any of its threads (the training thread's
  ``start_snapshot``/``wait_commit``, index and header, envelope, queue hand-offs).
"""

from __future__ import annotations

import threading
import time

CATEGORIES = ("copy", "checksum", "mpi", "bookkeeping")


class CpuAccount:
    """Cumulative CPU nanoseconds per category, added to by several threads."""

    def __init__(self) -> None:
        self._ns = dict.fromkeys(CATEGORIES, 0)
        self._lock = threading.Lock()

    def add(self, category: str, ns: int) -> None:
        """Add ``ns`` CPU nanoseconds to ``category`` (one of :data:`CATEGORIES`; KeyError otherwise)."""
        with self._lock:
            self._ns[category] += int(ns)

    def totals(self) -> dict[str, int]:
        """A copy of the cumulative nanoseconds per category."""
        with self._lock:
            return dict(self._ns)


class Span:
    """``with Span(account, "copy"):`` adds the calling thread's CPU time inside the block."""

    __slots__ = ("account", "category", "t0")

    def __init__(self, account: CpuAccount, category: str):
        self.account, self.category = account, category

    def __enter__(self) -> "Span":
        self.t0 = time.thread_time_ns()
        return self

    def __exit__(self, *exc) -> None:
        self.account.add(self.category, time.thread_time_ns() - self.t0)


def delta(now: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    """Per-category difference ``now - before`` (both from :meth:`CpuAccount.totals`)."""
    return {k: now[k] - before.get(k, 0) for k in CATEGORIES}
