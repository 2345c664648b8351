"""Checksums of snapshot and replica bytes (docs/design.md section 4, "Checksums").

One function per supported name, each ``f(view) -> int`` over a contiguous byte view (``memoryview`` or
uint8 ``numpy`` array), taken from a maintained library:

- ``crc32``: CRC-32 (ISO-HDLC polynomial 0x04C11DB7), ``zlib.crc32`` of the standard library;
- ``crc32c``: CRC-32C (Castagnoli polynomial 0x1EDC6F41, RFC 3720), the ``crc32c`` package, which uses the
  SSE4.2 ``crc32`` instruction (x86-64) or the ARMv8 CRC extension where present, a software table otherwise;
- ``xxh3_64``: XXH3 64-bit (``xxhash`` package, the reference xxHash C library);
- ``wsum64``: position-weighted Fletcher-style sums over 32-bit words with torch ops (:mod:`.wsum`, where
  what it detects is stated): the one a CUDA D2H computes on the device, from the live tensors
  (:data:`DEVICE_CHECKSUMS`); on host bytes the same function runs on torch's CPU ops.

:func:`combine` folds a list of per-tensor checksums into the one value a holder acknowledges (a CRC-32 of
the values as little-endian u64, so it fits the acknowledgement's int64 field whatever the algorithm).

Which one is the default, and why, is measured (``phoenix_hpc.bench.throughput``; numbers in
docs/design.md section 4). None is a defence against an adversary: they detect torn or corrupted copies.
"""

from __future__ import annotations

import zlib
from typing import Callable

import numpy as np

from phoenix_hpc.errors import ReplicationError

#: the names a job config may give in ``resilience.checksum``, and a snapshot index in ``checksum``
CHECKSUMS = ("xxh3_64", "crc32c", "crc32", "wsum64")
#: the ones a CUDA D2H computes on the device (runtime/d2h.py); on host bytes they run on CPU like the others
DEVICE_CHECKSUMS = ("wsum64",)
#: the default (chosen by measurement; docs/design.md section 4)
DEFAULT_CHECKSUM = "xxh3_64"


def _crc32(view) -> int:
    return zlib.crc32(view) & 0xFFFFFFFF


def _crc32c(view) -> int:
    import crc32c

    return crc32c.crc32c(view)


def _xxh3_64(view) -> int:
    import xxhash

    return xxhash.xxh3_64_intdigest(view)


def _wsum64(view) -> int:
    from phoenix_hpc.runtime.wsum import wsum64_bytes

    return wsum64_bytes(view)


_FUNCS: dict[str, Callable[[object], int]] = {"crc32": _crc32, "crc32c": _crc32c, "xxh3_64": _xxh3_64,
                                               "wsum64": _wsum64}


def checksum_function(name: str) -> Callable[[object], int]:
    """The function computing checksum ``name`` over a contiguous byte view.

    Raises ReplicationError naming the allowed values when ``name`` is not one of :data:`CHECKSUMS`."""
    try:
        return _FUNCS[name]
    except KeyError:
        raise ReplicationError(f"unknown checksum {name!r}; allowed: {', '.join(CHECKSUMS)}") from None


def combine(values: list[int]) -> int:
    """One 32-bit value over per-tensor checksums (CRC-32 of the values as little-endian u64); what a
    holder acknowledges and its owner compares."""
    return zlib.crc32(np.asarray(values, dtype="<u8").tobytes()) & 0xFFFFFFFF


def digest64(values: list[int]) -> int:
    """One 64-bit value over per-tensor checksums (XXH3-64 of the values as little-endian u64, in the order
    given): what a member reports of its parameter tensors with each commit, and its DP peers' must equal
    (control/agreement.py)."""
    return _xxh3_64(np.asarray(values, dtype="<u8").tobytes())
