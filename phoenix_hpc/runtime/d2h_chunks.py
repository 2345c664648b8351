"""How a CUDA D2H splits a tensor's copy into commands (``resilience.d2h_copy_chunk_bytes``; pure, no torch).

One long copy command holds the GPU's device-to-host copy engine until it ends; under
``CUDA_DEVICE_MAX_CONNECTIONS=1`` (Megatron-LM's requirement with tensor or sequence parallelism before
Blackwell) every stream's work goes through one hardware queue in call order, so work queued behind it waits
too. Commands of a bounded size let other work in between (:meth:`phoenix_hpc.runtime.d2h.D2H._issue`).
"""

from __future__ import annotations

#: ``copy_chunk_bytes`` must be a multiple of this (every dtype's element size divides it)
COPY_CHUNK_ALIGN = 16


def copy_chunk_problem(chunk: object) -> str:
    """Why ``chunk`` is not an allowed ``copy_chunk_bytes`` (0, or a positive multiple of
    :data:`COPY_CHUNK_ALIGN`), or empty (pure)."""
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 0 or chunk % COPY_CHUNK_ALIGN:
        return (f"d2h_copy_chunk_bytes {chunk!r} is not allowed (allowed: 0 for one copy per tensor, or a positive "
                f"multiple of {COPY_CHUNK_ALIGN} bytes)")
    return ""


def copy_pieces(numel: int, element_size: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """``[start, end)`` element ranges covering ``numel`` elements of ``element_size`` bytes in pieces of at
    most ``chunk_bytes`` bytes (whole elements; the last piece may be shorter; pure). Empty for 0 elements.

    Raises:
        ValueError: ``chunk_bytes`` smaller than one element.
    """
    per = chunk_bytes // element_size
    if per < 1:
        raise ValueError(f"chunk of {chunk_bytes} bytes holds no element of {element_size} bytes")
    return [(a, min(numel, a + per)) for a in range(0, numel, per)]


def copy_runs(items: list[tuple[int, int, int, int, int]]) -> list[tuple[int, int]]:
    """Fewer, larger copies (``resilience.d2h_copy_coalesce``; pure): ``[start, end)`` index ranges of
    consecutive ``items`` that one copy command can move. An item is ``(storage, src_offset, nbytes,
    dst_offset, storage_bytes)``: the device storage a tensor views (its address), the tensor's byte offset in
    it and its bytes, its slot's byte offset in the host buffer, and the storage's size. Items ``i..j`` form
    one run when they view one storage in order and each lies as far from the run's first in the source as
    its slot does in the buffer, so the source span ``[src_i, src_j + nbytes_j)`` (inside the storage) copied
    to ``[dst_i, ...)`` puts every tensor on its slot; the bytes between them land in the slots' alignment
    padding, which no checksum covers. A tensor that cannot join is a run of its own."""
    runs: list[tuple[int, int]] = []
    start = 0
    for k in range(1, len(items) + 1):
        if k < len(items):
            s0, a0, _, d0, _ = items[start]
            sk, ak, nk, dk, size = items[k]
            _, ap, np_, _, _ = items[k - 1]
            if sk == s0 and ak >= ap + np_ and ak - a0 == dk - d0 and ak + nk <= size:
                continue
        runs.append((start, k))
        start = k
    return runs
