"""Allocation without torch's deterministic-mode fill.

The ranks run with ``torch.use_deterministic_algorithms(True)`` (launch/rank.py), under which every new
tensor of ``torch.empty`` (and ``Module.to_empty``) is filled with a known value
(``torch.utils.deterministic.fill_uninitialized_memory``, on by default), i.e. every byte is written once
more. Memory that is written in full before anything reads it (a recovery's host buffers, a module whose
parameters are all loaded next) need not be: :func:`no_fill` turns the fill off for one allocation.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

_LOCK = threading.Lock()


@contextlib.contextmanager
def no_fill() -> Iterator[None]:
    """Inside the block, new tensors are not filled (the pages stay untouched until written). The flag is
    process-wide; the lock keeps two such blocks from restoring it out of order, and it is restored on any
    exit from the block."""
    import torch.utils.deterministic as det

    with _LOCK:
        old = det.fill_uninitialized_memory
        det.fill_uninitialized_memory = False
        try:
            yield
        finally:
            det.fill_uninitialized_memory = old
