"""The on-disk check of a Megatron indexed dataset (``PREFIX.bin`` + ``PREFIX.idx``), without torch or numpy:
``phoenix submit`` runs it on the submit host, the ranks again before they train."""

from __future__ import annotations

import struct
from pathlib import Path

from phoenix_hpc.errors import DataError
from phoenix_hpc.files import read_bytes

INDEX_HEADER = b"MMIDIDX\x00\x00"  # Megatron indexed dataset .idx magic (megatron.core.datasets)


BYTE_VOCAB = 256  # the vocabulary of the byte-level datasets `phoenix data prepare` makes

#: the token dtypes of one byte in a Megatron .idx (``megatron.core.datasets.indexed_dataset.DType`` codes, the
#: byte after the version) by name and largest id: every id of the dtype may occur, so the model needs an
#: embedding for each
ONE_BYTE_TOKENS = {1: ("uint8", 255), 2: ("int8", 127)}


def vocab_too_small(prefix: str, vocab_size: int, dtype_name: str, max_id: int) -> str | None:
    """The message when ``vocab_size`` cannot cover ids up to ``max_id`` of a dataset's ``dtype_name`` tokens,
    else None (pure; the ranks' check and ``phoenix submit``'s say the same)."""
    if max_id < vocab_size:
        return None
    return (f"model.vocab_size ({vocab_size}) is too small for dataset {prefix!r}: its tokens are {dtype_name} "
            f"(ids up to {max_id}); use vocab_size >= {max_id + 1}")


def vocab_problem(prefix: str | Path, vocab_size: int, dtype_code: int) -> str | None:
    """What :func:`vocab_too_small` says of the dataset at ``prefix`` whose .idx names token dtype
    ``dtype_code`` (:func:`check_indexed_dataset` returns it) when its tokens are of one byte; None otherwise
    (pure)."""
    if dtype_code not in ONE_BYTE_TOKENS:
        return None
    name, top = ONE_BYTE_TOKENS[dtype_code]
    return vocab_too_small(str(prefix), vocab_size, name, top)


def how_to_make(vocab_size: int | None) -> str:
    """How to make a dataset for a model of ``vocab_size`` tokens (None: unknown)."""
    if vocab_size is None or vocab_size == BYTE_VOCAB:
        return "make one with `phoenix data prepare SRC_DIR OUT_PREFIX` (byte-level, vocabulary 256)"
    return (f"tokenize the text with the tokenizer of model.vocab_size={vocab_size} into Megatron's indexed format, "
            "e.g. with Megatron-LM's tools/preprocess_data.py; `phoenix data prepare` makes only byte-level "
            "datasets (vocabulary 256)")


def check_indexed_dataset(prefix: str | Path, vocab_size: int | None = None, field: str = "data.path") -> int:
    """Check that ``PREFIX.idx`` and ``PREFIX.bin`` exist and look like a Megatron indexed dataset; returns
    the token dtype code its header names (:data:`ONE_BYTE_TOKENS`, :func:`vocab_problem`).
    ``vocab_size``: the model's, so that a missing dataset's message says how to make a fitting one.
    ``field``: the config field that names ``prefix`` (``data.path`` or ``data.blend[I].path``), for messages.

    Raises:
        DataError: a file is missing; the .idx is a directory, unreadable or empty
            (:func:`phoenix_hpc.files.read_bytes`); the .bin is a directory; the .idx lacks the ``MMIDIDX``
            header or version 1.
    """
    prefix = str(prefix)
    idx, bin_ = Path(prefix + ".idx"), Path(prefix + ".bin")
    missing = [str(p) for p in (idx, bin_) if not p.exists()]
    if missing:
        raise DataError(
            f"{field} {prefix!r} is not a Megatron indexed dataset: missing {', '.join(missing)} "
            f"({how_to_make(vocab_size)})"
        )
    head = read_bytes(idx, "dataset index", error=DataError, max_bytes=9 + 8 + 1 + 8)
    if bin_.is_dir():
        raise DataError(f"dataset file {str(bin_)!r} is a directory, not a file")
    if len(head) < 26 or head[:9] != INDEX_HEADER:
        raise DataError(f"{field} {prefix!r}: {idx} is not a Megatron .idx file (no MMIDIDX header)")
    version = struct.unpack("<Q", head[9:17])[0]
    if version != 1:
        raise DataError(f"{field} {prefix!r}: {idx} has index version {version}, only version 1 is supported")
    return head[17]


def sequence_count(prefix: str | Path, field: str = "data.path") -> int:
    """The number of sequences (documents, for a dataset made by ``phoenix data prepare`` or Megatron-LM's
    ``preprocess_data.py``) that ``PREFIX.idx`` holds: the 8-byte count after its header, version and dtype
    code. Call after :func:`check_indexed_dataset`.

    Raises:
        DataError: the .idx is shorter than its header."""
    idx = Path(str(prefix) + ".idx")
    head = read_bytes(idx, "dataset index", error=DataError, max_bytes=9 + 8 + 1 + 8)
    if len(head) < 26:
        raise DataError(f"{field} {str(prefix)!r}: {idx} is not a Megatron .idx file (shorter than its header)")
    return struct.unpack("<Q", head[18:26])[0]
