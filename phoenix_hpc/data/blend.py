"""A Megatron-LM data blend (``data.blend``, ``data.split``), built by megatron-core's
``BlendedMegatronDatasetBuilder`` over ``GPTDataset``: the samples Megatron-LM's ``pretrain_gpt.py`` trains on.

Megatron-LM numbers the training samples by the samples consumed before them: step ``s`` (1-based) of global
batch ``G`` trains on the samples ``[(s-1) G, s G)`` of the train split, whichever DP rank reads which of them
(its ``MegatronPretrainingSampler`` hands DP rank ``d`` the ``d``-th micro-batch of every ``mbs x dp`` chunk;
phoenix hands DP rank ``d`` the ``d``-th ``G / dp`` run of consecutive positions). So a step trains on the same
samples as Megatron-LM's step, and the sample at a position is a pure function of the position, which
recovery relies on. The builder is given Megatron-LM's train size, ``training.steps x G`` samples, or
``training.train_samples`` when given (Megatron-LM's ``get_train_valid_test_num_samples`` passes
``--train-samples`` itself, an incomplete last batch included; a changed ``training.steps`` or ``train_samples``
changes the order, as a changed ``--train-iters`` or ``--train-samples`` does in Megatron-LM). The validation and test
parts (built when the split gives them weight) get Megatron-LM's validation size, ``(steps // eval_interval + 1)
x eval_iters x G`` samples, with ``training.eval_interval``; one global batch without it (never read then). Their
sizes do not change the train part, which a unit test checks against the sizes Megatron-LM passes. Evaluation
reads the validation part (:meth:`BlendSamples.valid_batch`; which positions:
:func:`phoenix_hpc.launch.evaluate.eval_position`); the test part is never read.

The builder synchronises ranks with ``torch.distributed.barrier()`` on the default process group whenever one
exists (``megatron/core/datasets/blended_megatron_dataset_builder.py``). A phoenix slot builds the blend before
its first generation's process groups (:func:`phoenix_hpc.launch.execute.import_runtime`, also for a spare in
standby), and every engine of the process uses that one object (:func:`open_blend` caches it): a spare joining
a running generation, or an engine rebuilt in a recovery, never enters a barrier the other members are not in.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import torch

from phoenix_hpc.data.split import split_problem
from phoenix_hpc.errors import DataError


@dataclass(frozen=True)
class BlendKey:
    """Everything the built blend depends on (the cache key)."""

    prefixes: tuple[str, ...]
    weights: tuple[float, ...] | None
    split: str
    seq_length: int
    seed: int
    vocab_size: int
    train_samples: int
    eval_samples: int


class _Tokenizer:
    """What ``GPTDatasetConfig`` reads of a tokenizer: its size, end-of-document id (used only with
    ``reset_position_ids``, ``reset_attention_mask`` or ``eod_mask_loss``, all off) and ``unique_identifiers``
    (part of the dataset's description, which names cache files; not of the sample order). No ``pad``:
    megatron-core then pads with an id no dataset holds."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self.eod = 0
        self.unique_identifiers = {"class": "phoenix_hpc token ids", "vocab_size": vocab_size}


class BlendSamples:
    """The train split of a blend, addressed by global position (the :class:`~phoenix_hpc.data.indexed.TokenSamples`
    interface: ``batch(position, count) -> (inputs, targets)``, both ``(count, seq_length)`` int64).

    Raises:
        DataError: a prefix is not a readable Megatron indexed dataset, a token id is not below
            ``model.vocab_size``, or megatron-core refuses the blend (its message is kept).
    """

    def __init__(self, key: BlendKey):
        from phoenix_hpc.data.format import check_indexed_dataset, sequence_count
        from phoenix_hpc.data.indexed import megatron_indexed_module

        for i, p in enumerate(key.prefixes):  # the header only, as submit reads it; megatron-core opens them below
            field = f"data.blend[{i}].path"
            check_indexed_dataset(p, field=field)  # DataError naming a missing or malformed prefix
            problem = split_problem(key.split, p, sequence_count(p, field=field))
            if problem is not None:
                raise DataError(problem)
        megatron_indexed_module()  # megatron-core's import notices silenced
        from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

        config = GPTDatasetConfig(
            random_seed=key.seed, sequence_length=key.seq_length,
            blend=(list(key.prefixes), None if key.weights is None else list(key.weights)), split=key.split, tokenizer=_Tokenizer(key.vocab_size),
            reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False, path_to_cache=None,
            mmap_bin_files=True)
        # Megatron-LM passes a size for every part; the builder builds only the parts of non-zero weight
        sizes = [key.train_samples, key.eval_samples, key.eval_samples]
        try:
            train, valid, _test = BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()
        except (AssertionError, ValueError, IndexError, RuntimeError) as exc:
            raise DataError(f"data.blend: megatron-core cannot build the blend with data.split {key.split!r}: "
                            f"{type(exc).__name__}: {exc}") from None
        if train is None or len(train) < 1:
            raise DataError(f"data.blend: the train part of data.split {key.split!r} holds no sample")
        self.key = key
        self.dataset = train
        self.seq_length = key.seq_length
        self.vocab_size = key.vocab_size
        self.num_samples = len(train)
        self.valid_dataset = valid  # None when the split gives the validation part no weight

    def batch(self, position: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples at global positions ``position .. position+count-1``: ``(inputs, targets)``, both
        ``(count, seq_length)`` int64 (targets are inputs shifted by one token, as GPTDataset's labels)."""
        return self._rows(self.dataset, position, count)

    def valid_batch(self, position: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`batch`, from the validation part (positions wrap around its length).

        Raises:
            DataError: the split gives the validation part no weight (no evaluation is possible)."""
        if self.valid_dataset is None or len(self.valid_dataset) < 1:
            raise DataError(f"data.split {self.key.split!r}: the validation part holds no sample (allowed with "
                            "training.eval_interval: a split whose second number is above 0)")
        return self._rows(self.valid_dataset, position, count)

    def _rows(self, dataset, position: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = []
        for i in range(count):
            item = dataset[int(position + i) % len(dataset)]
            rows.append((np.asarray(item["tokens"], dtype=np.int64), np.asarray(item["labels"], dtype=np.int64)))
        x = torch.from_numpy(np.stack([r[0] for r in rows]))
        y = torch.from_numpy(np.stack([r[1] for r in rows]))
        top = int(max(x.max(), y.max()))
        if top >= self.vocab_size:
            raise DataError(f"data.blend: token id {top} >= model.vocab_size ({self.vocab_size})")
        return x, y


_CACHE: dict[BlendKey, BlendSamples] = {}
_LOCK = threading.Lock()


def blend_key(cfg) -> BlendKey:
    """The :class:`BlendKey` of a job config with ``data.blend``."""
    d, m, t = cfg.data, cfg.model, cfg.training
    weights = None if d.blend[0].weight is None else tuple(float(e.weight) for e in d.blend)
    return BlendKey(prefixes=tuple(e.path for e in d.blend), weights=weights,
                    split=d.split_text, seq_length=m.seq_length, seed=t.seed, vocab_size=m.vocab_size,
                    train_samples=train_samples(t), eval_samples=valid_samples(t))


def train_samples(training) -> int:
    """Samples megatron-core is asked for in the train part: Megatron-LM's ``--train-samples``
    (``training.train_samples``) when given, else ``train_iters x global_batch_size`` (``megatron/training/
    training.py``, ``get_train_valid_test_num_samples``)."""
    if training.train_samples is not None:
        return training.train_samples
    return training.steps * training.global_batch_size


def valid_samples(training) -> int:
    """Samples megatron-core is asked for in the validation part: Megatron-LM's ``(train_iters // eval_interval +
    1) x eval_iters x global_batch_size`` (``megatron/training/training.py``, ``get_train_valid_test_num_samples``)
    with ``training.eval_interval``; one global batch without it."""
    if training.eval_interval is None:
        return training.global_batch_size
    return (training.steps // training.eval_interval + 1) * training.eval_batches * training.global_batch_size


def open_blend(cfg) -> BlendSamples:
    """The process's :class:`BlendSamples` for ``cfg`` (built once, then the same object).

    Raises:
        DataError: see :class:`BlendSamples`.
        RuntimeError: it would be built for the first time while a default process group of more than one
            rank exists (megatron-core's builder would enter a barrier the other ranks are not in); a slot builds
            it before its first generation's groups (:func:`phoenix_hpc.launch.execute.import_runtime`).
    """
    key = blend_key(cfg)
    with _LOCK:
        found = _CACHE.get(key)
        if found is not None:
            return found
        if torch.distributed.is_available() and torch.distributed.is_initialized() \
                and torch.distributed.get_world_size() > 1:
            raise RuntimeError("data.blend must be built before the process groups (launch/execute.import_runtime)")
        built = BlendSamples(key)
        _CACHE.clear()  # one job per process: keep one blend
        _CACHE[key] = built
        return built
