"""The rank process's Python heap and CPython's cyclic garbage collector (docs/design.md section 7).

A full (generation 2) collection traverses every container object the interpreter tracks: after torch,
mpi4py, numpy and this package are imported a rank holds about 170,000 of them, about 400,000 once
megatron-core's dataset reader is imported too (:func:`phoenix_hpc.launch.execute.import_runtime`),
and a full collection takes 0.03 s on an idle core and 0.2-0.5 s on the shared cores of a busy node
(measured on the local cluster with a ``gc.callbacks`` probe). Such collections come automatically (CPython
starts one when the objects created since the last one exceed a quarter of the long-lived ones) and
explicitly in :meth:`phoenix_hpc.launch.execute.Member.release_groups`, which collects at the start of every
recovery so that a destroyed gloo group's connections close at once; each one stalls every peer waiting on
this rank in a collective, the recovery's quiesce included.

:func:`freeze_long_lived` moves the objects that live as long as the process (modules, classes,
functions, the configuration) into the collector's permanent generation (``gc.freeze``, CPython >= 3.7),
which no later collection traverses; objects made afterwards (process groups, engines, protectors, the
things a recovery replaces) are collected as before.
"""

from __future__ import annotations

import gc
import time

_frozen = False


def freeze_long_lived() -> int:
    """Collect once, then freeze every object the collector tracks now (``gc.freeze``); only the first call
    in a process does anything. Returns the number of objects frozen by this call (0 after the first).

    Call it once the process has imported what it runs and before it builds anything that a recovery
    replaces: a frozen object is never collected, so one that later became cyclic garbage would stay until
    the process ends (the ``gc.freeze`` documentation). A slot that a shrink sent back to standby, which
    still holds its old generation's objects, therefore freezes nothing more."""
    global _frozen
    if _frozen:
        return 0
    _frozen = True
    before = gc.get_freeze_count()
    gc.collect()  # garbage of the imports is freed, not frozen
    gc.freeze()
    PAUSES.mark_frozen()
    return gc.get_freeze_count() - before


class GcPauses:
    """The collections of this process and how long each took (a ``gc.callbacks`` hook, wall seconds): what
    the rank summary reports under ``gc`` and a recovery's ``detail["gc"]`` (the collections between a
    member's first sign of the fault and its resume). Install once, early (:meth:`install`)."""

    def __init__(self) -> None:
        self.collections = 0
        self.full = 0  # generation-2 collections
        self.total_s = 0.0
        self.max_s = 0.0
        self._t0: float | None = None
        self._at_freeze: tuple[int, int, float] | None = None  # (collections, full, total_s) at the freeze
        self.max_since_freeze_s = 0.0

    def mark_frozen(self) -> None:
        """The process froze its long-lived objects now (:func:`freeze_long_lived`): :meth:`summary` reports
        the collections after this point apart."""
        self._at_freeze = (self.collections, self.full, self.total_s)
        self.max_since_freeze_s = 0.0

    def install(self) -> None:
        """Start recording (idempotent)."""
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict, _clock=time.perf_counter) -> None:
        # the clock is bound at definition: collections also run while the interpreter shuts down, when no
        # import may happen any more
        if phase == "start":
            self._t0 = _clock()
            return
        if self._t0 is None:
            return
        d = _clock() - self._t0
        self._t0 = None
        self.collections += 1
        self.full += int(info.get("generation") == 2)
        self.total_s += d
        self.max_s = max(self.max_s, d)
        if self._at_freeze is not None:
            self.max_since_freeze_s = max(self.max_since_freeze_s, d)

    def summary(self) -> dict:
        """``{"collections", "full", "total_s", "max_s", "frozen", "after_freeze"}``: every collection of the
        process (seconds rounded to 0.1 ms), the objects in the permanent generation, and the same counts for
        the collections after :func:`freeze_long_lived` (``after_freeze`` is None when it was not called)."""
        out = {"collections": self.collections, "full": self.full, "total_s": round(self.total_s, 4),
               "max_s": round(self.max_s, 4), "frozen": gc.get_freeze_count(), "after_freeze": None}
        if self._at_freeze is not None:
            c, f, t = self._at_freeze
            out["after_freeze"] = {"collections": self.collections - c, "full": self.full - f,
                                   "total_s": round(self.total_s - t, 4), "max_s": round(self.max_since_freeze_s, 4)}
        return out


#: This process's record (the collector is per process; installed by the rank's entry point).
PAUSES = GcPauses()


def return_free_heap() -> bool:
    """Give the C heap's free memory back to the kernel (glibc ``malloc_trim(0)``, malloc_trim(3)): what a
    generation that a recovery replaced freed (its groups' and communicators' C++ state, its Python objects)
    otherwise stays resident in the process's heap, which grows after each recovery. Returns False where
    ``malloc_trim`` is unavailable (not glibc)."""
    import ctypes

    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        return False
    return True


#: glibc malloc arenas a rank process may have (``M_ARENA_MAX``): every generation brings new threads (gloo's
#: workers, the copy and H2H threads), and each thread that allocates may get an arena of its own (up to
#: 8 x cores by default), whose pages glibc seldom gives back. Measured over 9 local recoveries on the local
#: cluster (tests/e2e/test_memory_recoveries.py, RSS trend per recovery and rank, noise about +-0.6 MiB):
#: 0.9-1.4 MiB with 2 arenas, 2.5 MiB with the default.
MALLOC_ARENAS = 2
_M_ARENA_MAX = -8  # mallopt(3) parameter number in glibc's malloc.h


def cap_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Limit the C heap to ``arenas`` arenas (glibc ``mallopt(M_ARENA_MAX, arenas)``, mallopt(3)); the
    environment's ``MALLOC_ARENA_MAX``, when set, is left to decide. Call once, early, before threads
    allocate. Returns False where ``mallopt`` is unavailable (not glibc) or refuses."""
    import ctypes
    import os

    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    try:
        return bool(ctypes.CDLL(None).mallopt(_M_ARENA_MAX, int(arenas)))
    except (OSError, AttributeError):
        return False

