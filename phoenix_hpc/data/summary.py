"""What a Megatron indexed dataset holds (``phoenix data inspect``): documents, sequences, tokens and the
vocabulary its token ids need."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

CHUNK_TOKENS = 1 << 24  # tokens scanned at a time (64 MiB of int32)


@dataclass(frozen=True)
class DatasetSummary:
    prefix: str
    documents: int  # Megatron document index entries
    sequences: int
    tokens: int
    dtype: str  # token dtype on disk (uint8 for byte-level datasets)
    distinct_tokens: int  # token ids that occur
    max_token_id: int | None  # None for an empty dataset
    min_vocab_size: int  # max_token_id + 1: the smallest model.vocab_size that fits

    def to_json(self) -> dict:
        return asdict(self)


def summarize_dataset(prefix: str | Path) -> DatasetSummary:
    """Read ``PREFIX.idx`` and scan ``PREFIX.bin`` once (memory-mapped, in chunks of :data:`CHUNK_TOKENS`).

    Raises:
        DataError: missing or malformed files (:func:`phoenix_hpc.data.indexed.open_indexed_dataset`).
    """
    from phoenix_hpc.data.indexed import open_indexed_dataset

    ds = open_indexed_dataset(prefix)
    dtype = np.dtype(ds.index.dtype)
    lengths = np.asarray(ds.sequence_lengths, dtype=np.int64)
    tokens = int(lengths.sum())
    seen = np.zeros(1 << (8 * dtype.itemsize), dtype=bool) if dtype.itemsize <= 2 else None
    distinct: set[int] = set()
    top = -1
    if tokens:
        data = np.memmap(str(prefix) + ".bin", dtype=dtype, mode="r",
                         offset=int(ds.index.sequence_pointers[0]), shape=(tokens,))
        for i in range(0, tokens, CHUNK_TOKENS):
            part = np.asarray(data[i:i + CHUNK_TOKENS])
            top = max(top, int(part.max()))
            if seen is not None:
                seen[part] = True
            else:
                distinct.update(np.unique(part).tolist())
    n_distinct = int(seen.sum()) if seen is not None else len(distinct)
    return DatasetSummary(prefix=str(prefix), documents=max(0, len(ds.document_indices) - 1),
                          sequences=len(lengths), tokens=tokens, dtype=dtype.name, distinct_tokens=n_distinct,
                          max_token_id=top if top >= 0 else None, min_vocab_size=top + 1 if top >= 0 else 0)
