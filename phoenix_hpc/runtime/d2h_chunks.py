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
