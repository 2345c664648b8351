"""Megatron-LM's ``--split`` string (``data.split``), parsed and laid over a dataset's documents (pure).

The rules are megatron-core's (``megatron/core/datasets/blended_megatron_dataset_config.py``
``parse_and_normalize_split`` and ``convert_split_vector_to_split_matrix``; the document ranges of
``blended_megatron_dataset_builder.py``): up to three numbers, missing ones 0, normalised to sum to 1; part
``i`` of a dataset of ``n`` documents holds documents ``[round(b_i n), round(e_i n))`` where ``[b_i, e_i)`` are
the cumulative bounds.
"""

from __future__ import annotations

import math
import re

PARTS = ("train", "valid", "test")


def split_vector(text: str) -> list[float]:
    """``"969, 30, 1"`` -> ``[0.969, 0.03, 0.001]``; ``"100"`` -> ``[1.0, 0.0, 0.0]``.

    Raises:
        ValueError: not one to three non-negative numbers with a positive train part (the message names the
            value and what is allowed)."""
    nums = [float(x) for x in re.findall(r"[.0-9]+", str(text))]
    ok = (1 <= len(nums) <= 3 and all(math.isfinite(x) and x >= 0 for x in nums) and nums[0] > 0
          and re.fullmatch(r"\s*[.0-9]+(\s*[,/]\s*[.0-9]+){0,2}\s*", str(text)) is not None)
    if not ok:
        raise ValueError(f"{text!r} is not a split (allowed: one to three non-negative numbers 'train,valid,test' "
                         "with a positive train part, e.g. '969,30,1' or '100,0,0'; missing parts are 0)")
    nums += [0.0] * (3 - len(nums))
    total = sum(nums)
    return [x / total for x in nums]


def document_ranges(vector: list[float], n_documents: int) -> list[tuple[int, int] | None]:
    """Per part, the ``[begin, end)`` document range megatron-core gives it in a dataset of ``n_documents``
    documents, or None for a part of weight 0."""
    out: list[tuple[int, int] | None] = []
    lo = 0.0
    for x in vector:
        hi = lo + x
        out.append(None if x <= 0 else (int(round(lo * n_documents)), int(round(hi * n_documents))))
        lo = hi
    return out


def empty_parts(vector: list[float], n_documents: int) -> list[str]:
    """The names of the parts that have weight but hold no document (megatron-core would loop forever
    computing their epochs: ``GPTDataset._get_num_epochs`` with 0 tokens per epoch)."""
    return [PARTS[i] for i, r in enumerate(document_ranges(vector, n_documents)) if r is not None and r[1] <= r[0]]


def split_problem(split_text: str, prefix: str, n_documents: int) -> str | None:
    """None when every part of ``split_text`` with weight gets a document of the dataset at ``prefix`` (of
    ``n_documents`` documents), else the refusal, naming ``data.split``, the dataset and what is allowed."""
    empty = empty_parts(split_vector(split_text), n_documents)
    if not empty:
        return None
    return (f"data.split {split_text!r}: the {' and '.join(empty)} part of data.blend dataset {prefix!r} holds no "
            f"document ({n_documents} documents in all; megatron-core cannot build an empty part); allowed: a split "
            "whose every non-zero part gets a document, e.g. '100,0,0', or more documents")
