"""A model of your own for the Megatron engine: ``model.provider``, a model-provider function.

Megatron-LM builds its model through a *model provider* (``model_provider(pre_process=True,
post_process=True, ...)`` in Megatron-LM's ``pretrain_gpt.py`` / ``model_provider.py``): called once per
pipeline stage, with ``pre_process`` true on the first stage (it holds the embedding) and ``post_process`` true
on the last (output layer and loss). Megatron-LM's providers read the model's settings from its global
arguments (``get_args()``); phoenix_hpc has none, so it passes them as keywords::

    provider(*, pre_process: bool, post_process: bool, config: TransformerConfig, vocab_size: int,
             max_sequence_length: int, options: dict) -> MegatronModule

- ``config``: megatron-core's ``TransformerConfig`` of the job config's ``model:``, ``megatron:`` and
  ``parallelism:`` fields (:func:`phoenix_hpc.engines.megatron_spec.transformer_config_kwargs`: the grid's
  tp/pp, ``model.dtype``, ``model.attention_dropout / hidden_dropout``, ``deterministic_mode``). Use it, or
  derive your own from it with ``dataclasses.replace`` (the tp/pp sizes and ``params_dtype`` must stay: checked);
- ``vocab_size`` = ``model.vocab_size``, ``max_sequence_length`` = ``model.seq_length`` (the data's);
- ``options``: ``model.options`` (any mapping).

It is called after megatron-core's parallel state exists and the RNGs are seeded (``training.seed``; the
engine's seeding, as for its own ``GPTModel``), on the rank's CUDA device. The returned module must be a
megatron-core ``MegatronModule`` (``GPTModel``, or a subclass of ``MegatronModule``: the engine wraps it in
megatron-core's ``DistributedDataParallel`` and the pipeline schedule reads ``module.config`` and calls
``set_input_tensor``) with ``GPTModel``'s forward: ``forward(input_ids, position_ids, attention_mask,
labels=labels)`` with ``input_ids``, ``position_ids``, ``labels`` ``(mbs, seq_length)`` int64 and
``attention_mask`` ``(1, 1, seq_length, seq_length)`` bool (True: masked); on the last stage it returns the
per-token cross-entropy ``(mbs, seq_length)`` (nats; the engine averages it in fp32), elsewhere the hidden
states megatron-core passes between stages (``(seq_length, mbs, config.hidden_size)``).

Checks: at submit (:func:`check_provider`) the engine reads providers (``megatron`` or a subclass of
``MegatronEngine``), the reference imports and is callable with these keywords; on every rank before the
first step (:func:`check_stage_module`) the returned module is a ``MegatronModule`` with parameters, built
for the stage asked for, with the grid's tp/pp and ``model.dtype``. Every failure is a
:class:`~phoenix_hpc.errors.ConfigError` naming ``model.provider``, its value and what is expected (exit 2).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from phoenix_hpc.errors import ConfigError

FIELD = "model.provider"
#: The keywords a provider is called with.
PROVIDER_ARGS = ("pre_process", "post_process", "config", "vocab_size", "max_sequence_length", "options")
#: The ``TransformerConfig`` fields the engine relies on, with the job-config field each comes from.
KEPT_CONFIG = {"tensor_model_parallel_size": "parallelism.tp", "pipeline_model_parallel_size": "parallelism.pp",
               "params_dtype": "model.dtype"}


def _head(cfg) -> str:
    return f"{FIELD}: value {cfg.model.provider!r} --"


def wrong_engine_problem(cfg, megatron_like: bool) -> str | None:
    """The problem of a ``model.provider`` set for an engine that does not read it (pure): only engine
    ``megatron`` and user engines derived from ``MegatronEngine`` (``megatron_like``) call providers."""
    if cfg.model.provider is None or megatron_like:
        return None
    return (f"{_head(cfg)} a model provider is read by engine 'megatron' (and engines derived from "
            f"MegatronEngine) only, and engine is {cfg.engine!r}; expected engine: megatron (for engine torch, "
            "model.factory builds a torch.nn.Module)")


def load_provider(cfg) -> Callable[..., Any]:
    """The callable of ``model.provider``, imported with ``cfg.python_path`` (megatron-core's "no Transformer
    Engine / Apex" warnings silenced), its signature checked against :data:`PROVIDER_ARGS`.

    Raises:
        ConfigError: malformed reference, a module that does not import (its error quoted), no such
            attribute, not callable, or it cannot take the keywords of :data:`PROVIDER_ARGS`.
    """
    import warnings

    from phoenix_hpc.engines.user_code import load_callable

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn = load_callable(FIELD, cfg.model.provider, cfg.python_path)
    try:
        inspect.signature(fn).bind(**{n: None for n in PROVIDER_ARGS})
    except TypeError as exc:
        raise ConfigError(f"{_head(cfg)} expected a callable taking the keyword arguments "
                          f"{', '.join(PROVIDER_ARGS)} (Megatron-LM's model_provider(pre_process, post_process) "
                          f"plus what it would read from its arguments) ({exc})") from None
    except ValueError:  # no signature to inspect (a builtin): the call decides
        pass
    return fn


def check_provider(cfg, megatron_like: bool) -> None:
    """What ``phoenix submit`` checks of ``model.provider`` (no GPU, no model built): the engine reads it
    (:func:`wrong_engine_problem`), then :func:`load_provider`.

    Raises:
        ConfigError: see :func:`wrong_engine_problem` and :func:`load_provider`.
    """
    problem = wrong_engine_problem(cfg, megatron_like)
    if problem is not None:
        raise ConfigError(problem)
    load_provider(cfg)


def provider_kwargs(cfg, config, pre_process: bool, post_process: bool) -> dict[str, Any]:
    """The keywords the engine calls the provider with (pure): see the module docstring."""
    m = cfg.model
    return {"pre_process": bool(pre_process), "post_process": bool(post_process), "config": config,
            "vocab_size": m.vocab_size, "max_sequence_length": m.seq_length, "options": dict(m.options)}


def base_config(cfg, **overrides):
    """megatron-core ``TransformerConfig`` of the job config (what the provider gets as ``config``), with
    ``overrides`` (e.g. ``use_cpu_initialization=True`` in tests). Allocates nothing."""
    import warnings

    from phoenix_hpc.engines.megatron_spec import transformer_config_kwargs

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.transformer import TransformerConfig

        return TransformerConfig(**{**transformer_config_kwargs(cfg), **overrides})


def stage_name(stage: int, num_stages: int, pre_process: bool, post_process: bool) -> str:
    """``"pipeline stage 0 of 2 (pre_process=True, post_process=False)"`` (pure)."""
    return f"pipeline stage {stage} of {num_stages} (pre_process={pre_process}, post_process={post_process})"


def check_stage_module(cfg, module: Any, stage: int, pre_process: bool, post_process: bool) -> None:
    """What the ranks check of the module the provider returned, before the first step.

    The module must be a megatron-core ``MegatronModule`` with at least one parameter; when it records
    ``pre_process`` / ``post_process`` (as ``GPTModel`` does), they are the stage's; its ``config`` keeps
    :data:`KEPT_CONFIG` (the grid's tp and pp, ``model.dtype``).

    Raises:
        ConfigError: naming model.provider, its value, the stage, what it returned and what is expected.
    """
    import torch
    from torch import nn

    from phoenix_hpc.engines.megatron_spec import DTYPES

    megatron_module = _megatron_module_class()
    pp = cfg.parallelism.pp
    where = stage_name(stage, pp, pre_process, post_process)
    if not isinstance(module, nn.Module):
        raise ConfigError(f"{_head(cfg)} returned a {type(module).__name__} for {where}, expected a megatron-core "
                          "MegatronModule (e.g. megatron.core.models.gpt.GPTModel)")
    if not isinstance(module, megatron_module):
        raise ConfigError(
            f"{_head(cfg)} returned a {type(module).__name__} for {where}, a torch.nn.Module but not a megatron-core "
            "MegatronModule: expected megatron.core.models.gpt.GPTModel or a subclass of "
            "megatron.core.transformer.module.MegatronModule (megatron-core's DDP and pipeline schedule need one; "
            "a plain torch.nn.Module trains with engine: torch and model.factory)")
    if not any(True for _ in module.parameters()):
        raise ConfigError(f"{_head(cfg)} the module of {where} has no parameters (every stage must hold some of "
                          "the model)")
    for flag, want in (("pre_process", pre_process), ("post_process", post_process)):
        got = getattr(module, flag, want)
        if isinstance(got, bool) and got != want:
            raise ConfigError(
                f"{_head(cfg)} returned a module built with {flag}={got} for {where}; expected {flag}={want}: the "
                f"stages must match parallelism.pp = {pp} (build the stage the arguments ask for)")
    mconf = getattr(module, "config", None)
    want = {"tensor_model_parallel_size": cfg.parallelism.tp, "pipeline_model_parallel_size": pp,
            "params_dtype": DTYPES[cfg.model.dtype]}
    for name, value in want.items():
        got = getattr(mconf, name, None)
        if got != value:
            shown = str(value).removeprefix("torch.") if isinstance(value, torch.dtype) else value
            raise ConfigError(
                f"{_head(cfg)} the module of {where} has config.{name} = {got}, expected {shown} "
                f"({KEPT_CONFIG[name]}): derive the model's TransformerConfig from the config= argument")


def build_stage(cfg, stage: int, pre_process: bool, post_process: bool, config=None, fn=None):
    """Call the provider for this rank's stage and check what it returned (:func:`check_stage_module`).
    Parallel state must be initialised (megatron-core's layers read it). ``config``: the
    ``TransformerConfig`` to pass (default :func:`base_config`).

    Raises:
        ConfigError: see :func:`load_provider` and :func:`check_stage_module`, or the provider raised (its
            error quoted). CUDA out-of-memory errors are not caught.
    """
    import torch

    fn = fn or load_provider(cfg)
    config = config if config is not None else base_config(cfg)
    where = stage_name(stage, cfg.parallelism.pp, pre_process, post_process)
    try:
        module = fn(**provider_kwargs(cfg, config, pre_process, post_process))
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's code: report, do not crash
        raise ConfigError(f"{_head(cfg)} raised {type(exc).__name__}: {exc} when building {where} "
                          f"(options {dict(cfg.model.options)})") from None
    check_stage_module(cfg, module, stage, pre_process, post_process)
    return module


def _megatron_module_class() -> type:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.transformer.module import MegatronModule
    return MegatronModule
