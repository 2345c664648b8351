"""Model providers for the Megatron engine's tests (``model.provider``): ones that break the contract in one
way each, and a user engine derived from MegatronEngine. megatron-core is imported only when called."""

from __future__ import annotations

import dataclasses

import torch

from phoenix_hpc.engines.megatron_engine import MegatronEngine

NOT_CALLABLE = 3


class DerivedMegatron(MegatronEngine):
    """A user engine derived from the Megatron engine: it reads model.provider."""


def positional_only(pre_process, post_process):
    """Megatron-LM's bare signature: it cannot take config=, vocab_size=, ... ."""
    return None


def returns_string(**kw):
    return "a model"


def returns_linear(**kw):
    return torch.nn.Linear(4, 4)


def _module(config, with_param: bool = True):
    from megatron.core.transformer.module import MegatronModule

    class Stage(MegatronModule):
        def __init__(self):
            super().__init__(config)
            if with_param:
                self.w = torch.nn.Parameter(torch.zeros(4))

    return Stage()


def no_parameters(*, config, **kw):
    return _module(config, with_param=False)


def minimal(*, config, **kw):
    """A MegatronModule with one parameter and the config it was given: passes every check."""
    return _module(config)


def other_tp(*, config, **kw):
    return _module(dataclasses.replace(config, tensor_model_parallel_size=2))


def other_dtype(*, config, **kw):
    return _module(dataclasses.replace(config, params_dtype=torch.float16, fp16=True))


def swapped_stage(*, pre_process, post_process, config, vocab_size, max_sequence_length, options):
    """A GPTModel of the wrong stage: pre_process and post_process swapped."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    return GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=vocab_size,
                    max_sequence_length=max_sequence_length, pre_process=post_process, post_process=pre_process)


def seen(**kw):
    """Records the keywords it was called with (``seen.calls``) and returns :func:`minimal`'s module."""
    seen.calls.append(kw)
    return minimal(**kw)


seen.calls = []
