"""The on-disk check of a Megatron indexed dataset (``PREFIX.bin`` + ``PREFIX.idx``), without torch or numpy:
``phoenix submit`` runs it on the submit host, the ranks again before they train."""

from __future__ import annotations

import struct
from pathlib import Path

from phoenix_hpc.errors import DataError

INDEX_HEADER = b"MMIDIDX\x00\x00"  # Megatron indexed dataset .idx magic (megatron.core.datasets)


def check_indexed_dataset(prefix: str | Path) -> None:
    """Check that ``PREFIX.idx`` and ``PREFIX.bin`` exist and look like a Megatron indexed dataset.

    Raises:
        DataError: a file is missing, the .idx lacks the ``MMIDIDX`` header or version 1, or the .bin is
            shorter than the index says.
    """
    prefix = str(prefix)
    idx, bin_ = Path(prefix + ".idx"), Path(prefix + ".bin")
    missing = [str(p) for p in (idx, bin_) if not p.is_file()]
    if missing:
        raise DataError(
            f"data.path {prefix!r} is not a Megatron indexed dataset: missing {', '.join(missing)} "
            "(make one with `phoenix data prepare SRC_DIR OUT_PREFIX`)"
        )
    with idx.open("rb") as f:
        head = f.read(9 + 8 + 1 + 8)
    if len(head) < 26 or head[:9] != INDEX_HEADER:
        raise DataError(f"data.path {prefix!r}: {idx} is not a Megatron .idx file (no MMIDIDX header)")
    version = struct.unpack("<Q", head[9:17])[0]
    if version != 1:
        raise DataError(f"data.path {prefix!r}: {idx} has index version {version}, only version 1 is supported")
