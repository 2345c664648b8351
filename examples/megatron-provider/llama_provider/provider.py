"""One pipeline stage of a Llama-style decoder, as a model-provider function for phoenix_hpc's Megatron engine.

Llama's choices on top of the job config's shape (``model.layers``, ``hidden_size``, ``heads``,
``ffn_hidden_size``, ``vocab_size``, ``seq_length``, ``dtype``, which arrive in ``config``): RMSNorm,
SwiGLU (SiLU-gated MLP), no biases in the linear layers, rotary position embeddings, separate input
embedding and output head; and, from ``model.options``:

- ``num_query_groups`` (default: ``model.heads``): grouped-query attention's key/value groups;
- ``rotary_base`` (default 10000): RoPE's theta;
- ``qk_layernorm`` (default false): normalise queries and keys per head (a setting the job config's model
  fields do not offer);
- ``transformer_impl`` (default ``local``): ``local`` layers (megatron-core's own modules, any CUDA GPU) or
  ``transformer_engine`` (fused kernels; Transformer Engine must be installed).

The layers come from megatron-core's layer specs (``get_gpt_layer_local_spec`` /
``get_gpt_layer_with_transformer_engine_spec``) and the stage is megatron-core's ``GPTModel``: the provider
only chooses. phoenix_hpc calls it once per rank (docs/engines.md, "A Megatron model of your own").
"""

from __future__ import annotations

import dataclasses

import torch.nn.functional as F

IMPLS = ("local", "transformer_engine")


def llama_config(config, options: dict):
    """``config`` (megatron-core ``TransformerConfig`` of the job) with Llama's choices and ``options``.

    Raises:
        ValueError: an option outside what is allowed (phoenix_hpc reports it naming model.provider).
    """
    groups = int(options.get("num_query_groups", config.num_attention_heads))
    if groups < 1 or config.num_attention_heads % groups:
        raise ValueError(f"options.num_query_groups ({groups}) must divide model.heads "
                         f"({config.num_attention_heads})")
    return dataclasses.replace(
        config, normalization="RMSNorm", gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False,
        num_query_groups=groups, qk_layernorm=bool(options.get("qk_layernorm", False)),
    )


def layer_spec(config, options: dict):
    """megatron-core's transformer layer spec for ``options["transformer_impl"]``.

    Raises:
        ValueError: an unknown implementation; ImportError: ``transformer_engine`` without Transformer Engine.
    """
    from megatron.core.models.gpt import gpt_layer_specs

    impl = options.get("transformer_impl", "local")
    if impl not in IMPLS:
        raise ValueError(f"options.transformer_impl is {impl!r}, expected one of {list(IMPLS)}")
    if impl == "transformer_engine":
        import transformer_engine  # noqa: F401  (megatron-core's TE spec would fall back silently)

        return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=config.qk_layernorm)
    return gpt_layer_specs.get_gpt_layer_local_spec(qk_layernorm=config.qk_layernorm, normalization="RMSNorm")


def llama_stage(*, pre_process: bool, post_process: bool, config, vocab_size: int, max_sequence_length: int,
                options: dict):
    """Megatron-LM's ``model_provider(pre_process, post_process)``, with what Megatron-LM reads from its
    arguments passed in: the ``GPTModel`` of this pipeline stage (embedding when ``pre_process``, output head
    and loss when ``post_process``)."""
    from megatron.core.models.gpt import GPTModel

    llama = llama_config(config, options)
    return GPTModel(
        config=llama, transformer_layer_spec=layer_spec(llama, options), vocab_size=vocab_size,
        max_sequence_length=max_sequence_length, pre_process=pre_process, post_process=post_process,
        position_embedding_type="rope", rotary_base=int(options.get("rotary_base", 10000)),
        share_embeddings_and_output_weights=False,
    )
