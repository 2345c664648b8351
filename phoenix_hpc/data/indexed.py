"""Training samples from a Megatron indexed dataset, in a deterministic, resumable order.

The dataset (``PREFIX.bin`` + ``PREFIX.idx``, Megatron's "MMIDIDX" format) is read with megatron-core's
:class:`~megatron.core.datasets.indexed_dataset.IndexedDataset` (memory-mapped; works on CPU). All its
sequences are treated as one token stream (in index order); sample ``j`` is the ``seq_length + 1`` tokens
starting at ``j * seq_length`` (inputs are the first ``seq_length``, targets the last ``seq_length``), so
there are ``(total_tokens - 1) // seq_length`` samples.

Order: a *global position* ``p`` counts samples consumed by the whole job (all DP ranks). Position ``p``
is sample ``perm_e[p mod n]`` of epoch ``e = p // n``, where ``perm_e`` is the permutation drawn by
``numpy.random.default_rng([seed, e])`` (PCG64; bit-stable across numpy versions by numpy's stream
policy). The order is therefore a pure function of ``(seed, p)``: resuming needs only ``p`` (the
data-iterator position in the metadata envelope), and it does not depend on how many ranks read.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from phoenix_hpc.data.format import INDEX_HEADER, check_indexed_dataset, vocab_too_small  # noqa: F401 (re-exported)
from phoenix_hpc.errors import DataError

def open_indexed_dataset(prefix: str | Path):
    """Open a Megatron indexed dataset after :func:`check_indexed_dataset`.

    Raises:
        DataError: see :func:`check_indexed_dataset`; or megatron-core cannot read it (truncated index,
            .bin shorter than the index).
    """
    check_indexed_dataset(prefix)
    IndexedDataset = megatron_indexed_module().IndexedDataset

    try:
        ds = IndexedDataset(str(prefix), mmap=True)
    except Exception as exc:  # megatron-core asserts on malformed files
        raise DataError(f"data.path {str(prefix)!r} cannot be read as an indexed dataset: {exc!r}") from None
    lengths = np.asarray(ds.sequence_lengths, dtype=np.int64)
    if len(lengths):
        end = int(ds.index.sequence_pointers[-1]) + int(lengths[-1]) * ds.index.dtype_size
        size = Path(str(prefix) + ".bin").stat().st_size
        if size < end:
            raise DataError(f"data.path {str(prefix)!r}: .bin has {size} bytes, the index needs {end}")
    return ds


class TokenSamples:
    """Fixed-length LM samples over an indexed dataset, addressed by global position.

    Args:
        prefix: dataset path prefix (without ``.bin``/``.idx``).
        seq_length: tokens per sample (model input length).
        seed: order seed (``training.seed``).
        vocab_size: model vocabulary; every token id must be below it.

    Raises:
        DataError: the dataset is missing or malformed, holds fewer than ``seq_length + 1`` tokens, or its
            token dtype can hold ids >= ``vocab_size`` (checked on the dtype, e.g. uint8 needs >= 256).
    """

    def __init__(self, prefix: str | Path, seq_length: int, seed: int, vocab_size: int):
        self.dataset = open_indexed_dataset(prefix)
        self.seq_length = int(seq_length)
        self.seed = int(seed)
        lengths = np.asarray(self.dataset.sequence_lengths, dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(lengths)])  # token offset of each sequence
        self.total_tokens = int(self._starts[-1])
        self.num_samples = (self.total_tokens - 1) // self.seq_length if self.total_tokens else 0
        if self.num_samples < 1:
            raise DataError(
                f"data.path {str(prefix)!r} holds {self.total_tokens} tokens; need at least "
                f"model.seq_length + 1 = {self.seq_length + 1}"
            )
        dtype = np.dtype(self.dataset.index.dtype)
        if dtype.kind in "iu" and dtype.itemsize == 1:
            problem = vocab_too_small(str(prefix), vocab_size, dtype.name, int(np.iinfo(dtype).max))
            if problem is not None:
                raise DataError(problem)
        self.vocab_size = vocab_size
        self._perm_cache: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        p = self._perm_cache.get(epoch)
        if p is None:
            p = np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)
            self._perm_cache = {epoch: p}  # keep one epoch: positions move forward
        return p

    def sample_index(self, position: int) -> int:
        """The sample at global ``position`` (>= 0)."""
        epoch, k = divmod(int(position), self.num_samples)
        return int(self._perm(epoch)[k])

    def _tokens(self, start: int, count: int) -> np.ndarray:
        out = np.empty(count, dtype=np.int64)
        seq = int(np.searchsorted(self._starts, start, side="right")) - 1
        filled = 0
        while filled < count:
            off = start + filled - int(self._starts[seq])
            n = min(count - filled, int(self._starts[seq + 1]) - (start + filled))
            if n > 0:
                out[filled : filled + n] = self.dataset.get(seq, offset=off, length=n)
                filled += n
            seq += 1
        return out

    def batch(self, position: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples at global positions ``position .. position+count-1``.

        Returns ``(inputs, targets)``, both ``(count, seq_length)`` int64 (targets are inputs shifted by
        one token).
        """
        rows = [self._tokens(self.sample_index(position + i) * self.seq_length, self.seq_length + 1) for i in range(count)]
        arr = torch.from_numpy(np.stack(rows))
        if int(arr.max()) >= self.vocab_size:
            raise DataError(f"token id {int(arr.max())} >= model.vocab_size ({self.vocab_size})")
        return arr[:, :-1].contiguous(), arr[:, 1:].contiguous()


def megatron_indexed_module():
    """``megatron.core.datasets.indexed_dataset``, imported with megatron-core's import-time notices about
    missing Transformer Engine / Apex silenced (they do not concern dataset I/O)."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex.*")
        from megatron.core.datasets import indexed_dataset
    return indexed_dataset
