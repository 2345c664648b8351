"""A model and a dataset of your own for the torch engine: ``model.factory`` and ``data.factory``.

The contract (docs/engines.md has the worked example):

``model.factory`` -- ``f(*, stage: int, num_stages: int, seed: int, options: dict) -> torch.nn.Module``,
called once per rank for its pipeline stage (``stage`` = the rank's pp coordinate, ``num_stages`` =
``parallelism.pp``; ``stage=0, num_stages=1`` without pipelining). It may instead return the list of all
``num_stages`` stage modules; entry ``stage`` is used. The call runs with torch's default generator seeded
with ``training.seed + stage`` (the caller's RNG state is restored afterwards), so default initialisation is
the same on every DP replica of a stage. The engine then casts the module to ``model.dtype`` and moves it
to the rank's device. The module:

- first stage: takes tokens ``(mbs, seq_length)`` int64;
- other stages: take hidden states ``(mbs, seq_length, hidden_size)`` in ``model.dtype``
  (``model.hidden_size``, ``model.seq_length``: one fixed shape at every stage boundary);
- last stage: returns logits ``(mbs, seq_length, vocab_size)`` (``model.vocab_size``); the engine computes
  the loss, mean next-token cross-entropy in fp32 (:func:`phoenix_hpc.engines.torch_gpt.lm_loss`);
- other stages: return hidden states of the shape above;
- has at least one parameter, stable parameter names (they name the shards), and a forward pass that uses
  no random numbers (no dropout), so that a replayed step computes the same bits.

``data.factory`` -- ``f(*, seq_length: int, seed: int, options: dict) -> dataset`` with ``len(dataset) >= 1``
and ``dataset[i]`` a 1-D ``torch.int64`` tensor of ``seq_length + 1`` token ids below ``model.vocab_size``
(inputs are ``[:-1]``, targets ``[1:]``). Global sample position ``p`` (a pure function of the step,
see :mod:`phoenix_hpc.engines.torch_engine`) reads item ``p % len(dataset)``; shuffle inside the dataset
(from ``seed``) if wanted. Items are checked on every read.

Errors: :class:`~phoenix_hpc.errors.ConfigError` (exit 2) naming the field, the value and what is expected.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from phoenix_hpc.engines.user_code import load_callable
from phoenix_hpc.errors import ConfigError

MODEL_FACTORY_ARGS = ("stage", "num_stages", "seed", "options")
DATA_FACTORY_ARGS = ("seq_length", "seed", "options")


def _check_signature(field: str, value: str, fn, names: tuple[str, ...]) -> None:
    try:
        inspect.signature(fn).bind(**{n: None for n in names})
    except TypeError as exc:
        raise ConfigError(
            f"{field}: value {value!r} -- expected a callable taking keyword arguments "
            f"{', '.join(names)} ({exc})"
        ) from None
    except ValueError:  # no signature to inspect (a builtin): let the call decide
        pass


def model_factory(cfg) -> Any:
    """The callable of ``cfg.model.factory`` (imported with ``cfg.python_path``), signature checked.

    Raises:
        ConfigError: see :func:`phoenix_hpc.engines.user_code.load_callable`, or it cannot take the keywords
            ``stage, num_stages, seed, options``.
    """
    fn = load_callable("model.factory", cfg.model.factory, cfg.python_path)
    _check_signature("model.factory", cfg.model.factory, fn, MODEL_FACTORY_ARGS)
    return fn


def build_stage(cfg, stage: int, num_stages: int, fn=None) -> nn.Module:
    """Call ``model.factory`` for ``stage`` of ``num_stages`` under the seeded RNG; check what it returns.

    Returns the stage's module as the factory made it (not yet cast or moved).

    Raises:
        ConfigError: the factory raised (its error quoted), returned something that is not an
            ``nn.Module``, returned a list of stages whose length is not ``num_stages``, or a module without
            parameters.
    """
    fn = fn or model_factory(cfg)
    value = cfg.model.factory
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.training.seed + stage)
        try:
            out = fn(stage=stage, num_stages=num_stages, seed=cfg.training.seed, options=dict(cfg.model.options))
        except Exception as exc:  # noqa: BLE001 - the user's code: report, do not crash
            raise ConfigError(
                f"model.factory: value {value!r} -- raised {type(exc).__name__}: {exc} when building stage "
                f"{stage} of {num_stages} (parallelism.pp = {num_stages}; options {dict(cfg.model.options)})"
            ) from None
    if isinstance(out, Sequence) and not isinstance(out, (str, bytes)) and not isinstance(out, nn.Module):
        if len(out) != num_stages:
            raise ConfigError(
                f"model.factory: value {value!r} -- returned {len(out)} stage modules, expected parallelism.pp "
                f"= {num_stages} (one module per pipeline stage, or the module of stage {stage} alone)"
            )
        out = out[stage]
    if not isinstance(out, nn.Module):
        raise ConfigError(
            f"model.factory: value {value!r} -- returned a {type(out).__name__} for stage {stage} of "
            f"{num_stages}, expected a torch.nn.Module"
        )
    if not any(True for _ in out.parameters()):
        raise ConfigError(
            f"model.factory: value {value!r} -- the module of stage {stage} of {num_stages} has no parameters "
            "(every stage must hold some of the model)"
        )
    return out


def stage_io_shapes(cfg, stage: int, num_stages: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(input shape, output shape)`` a stage's module must take and return for one micro-batch (pure)."""
    m, mbs = cfg.model, cfg.training.micro_batch_size
    hidden = (mbs, m.seq_length, m.hidden_size)
    inp = (mbs, m.seq_length) if stage == 0 else hidden
    out = (mbs, m.seq_length, m.vocab_size) if stage == num_stages - 1 else hidden
    return inp, out


def check_stage_output(cfg, stage: int, num_stages: int, got: torch.Tensor) -> None:
    """Check one micro-batch's output of a stage against :func:`stage_io_shapes`.

    Raises:
        ConfigError: not a tensor, or the wrong shape (naming model.factory, the shape and the expected one).
    """
    _, want = stage_io_shapes(cfg, stage, num_stages)
    what = "logits (mbs, seq_length, vocab_size)" if stage == num_stages - 1 else \
        "hidden states (mbs, seq_length, hidden_size)"
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != want:
        shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
        raise ConfigError(
            f"model.factory: value {cfg.model.factory!r} -- stage {stage} of {num_stages} returned {shape}, "
            f"expected {what} = {want} (model.hidden_size, model.seq_length, model.vocab_size, "
            "training.micro_batch_size)"
        )


def check_model_factory(cfg) -> None:
    """What ``phoenix submit`` checks of ``model.factory`` without training: import and signature, then for
    every stage of ``parallelism.pp`` the module is built on the ``meta`` device (no memory is allocated, no
    data read) and one micro-batch is passed through it to check its output shape.

    Raises:
        ConfigError: see :func:`build_stage` and :func:`check_stage_output`. A forward pass that cannot run
            on the meta device is not an error here (the ranks check the first micro-batch again).
    """
    fn = model_factory(cfg)
    pp = cfg.parallelism.pp
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[cfg.model.dtype]
    with torch.device("meta"):
        for stage in range(pp):
            mod = build_stage(cfg, stage, pp, fn).to(dtype)
            inp_shape, _ = stage_io_shapes(cfg, stage, pp)
            x = torch.zeros(inp_shape, dtype=torch.long if stage == 0 else dtype)
            try:
                with torch.no_grad():
                    y = mod(x)
            except Exception:  # noqa: BLE001 - meta tensors do not support every operator
                continue
            check_stage_output(cfg, stage, pp, y)


# --- data ----------------------------------------------------------------------------------------------
def open_dataset(cfg) -> Any:
    """Call ``data.factory`` and check it and its first item.

    Raises:
        ConfigError: see :func:`phoenix_hpc.engines.user_code.load_callable`, the factory raised, the dataset
            has no ``len`` or is empty, or item 0 is malformed (:func:`check_item`).
    """
    value = cfg.data.factory
    fn = load_callable("data.factory", value, cfg.python_path)
    _check_signature("data.factory", value, fn, DATA_FACTORY_ARGS)
    try:
        ds = fn(seq_length=cfg.model.seq_length, seed=cfg.training.seed, options=dict(cfg.data.options))
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(f"data.factory: value {value!r} -- raised {type(exc).__name__}: {exc}") from None
    try:
        n = len(ds)
    except TypeError:
        raise ConfigError(
            f"data.factory: value {value!r} -- returned a {type(ds).__name__} without len(); expected a map-style "
            "dataset (__len__ and __getitem__)"
        ) from None
    if n < 1:
        raise ConfigError(f"data.factory: value {value!r} -- the dataset is empty (len 0); expected >= 1 sample")
    check_item(cfg, 0, ds[0])
    return ds


def check_item(cfg, index: int, item: Any) -> torch.Tensor:
    """Check dataset item ``index``: a 1-D ``torch.int64`` tensor of ``seq_length + 1`` ids in
    ``[0, vocab_size)``. Returns it.

    Raises:
        ConfigError: naming data.factory, the item, what it is and what is expected.
    """
    want = (cfg.model.seq_length + 1,)
    head = f"data.factory: value {cfg.data.factory!r} -- item {index}"
    if not isinstance(item, torch.Tensor):
        raise ConfigError(f"{head} is a {type(item).__name__}, expected a torch.Tensor of shape {want}, int64")
    if tuple(item.shape) != want or item.dtype != torch.int64:
        raise ConfigError(
            f"{head} has shape {tuple(item.shape)} dtype {item.dtype}, expected shape {want} "
            f"(model.seq_length + 1 tokens) dtype torch.int64"
        )
    lo, hi = int(item.min()), int(item.max())
    if lo < 0 or hi >= cfg.model.vocab_size:
        raise ConfigError(f"{head} holds token ids in [{lo}, {hi}], expected [0, model.vocab_size = "
                          f"{cfg.model.vocab_size})")
    return item


class FactorySamples:
    """The ``data.factory`` dataset addressed by global sample position, with the interface of
    :class:`phoenix_hpc.data.indexed.TokenSamples` (``batch``)."""

    def __init__(self, cfg, dataset=None):
        self.cfg = cfg
        self.dataset = dataset if dataset is not None else open_dataset(cfg)
        self.num_samples = len(self.dataset)

    def batch(self, position: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples at global positions ``position .. position+count-1`` (item ``p % len``).

        Returns ``(inputs, targets)``, both ``(count, seq_length)`` int64. Raises ConfigError on a bad item.
        """
        rows = []
        for p in range(position, position + count):
            i = p % self.num_samples
            rows.append(check_item(self.cfg, i, self.dataset[i]))
        arr = torch.stack(rows)
        return arr[:, :-1].contiguous(), arr[:, 1:].contiguous()
