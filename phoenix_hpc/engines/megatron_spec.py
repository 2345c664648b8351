"""The job config as megatron-core arguments: ``TransformerConfig`` fields, ``GPTModel`` arguments, the layer
spec, and the submit-time check that megatron-core can build them (runs on CPU).

Mapping (config field -> megatron-core argument; names as in Megatron-LM's ``arguments.py``):

- ``model.layers / hidden_size / heads`` -> ``num_layers / hidden_size / num_attention_heads``;
  ``model.ffn_hidden_size`` (null: 4 x hidden) -> ``ffn_hidden_size``; ``model.num_query_groups`` (null:
  heads) -> ``num_query_groups`` (grouped-query attention);
- ``model.activation``: ``gelu`` -> ``activation_func=F.gelu, gated_linear_unit=False``; ``swiglu`` ->
  ``activation_func=F.silu, gated_linear_unit=True`` (Megatron-LM's ``--swiglu``);
- ``model.normalization`` -> ``normalization`` (``LayerNorm`` / ``RMSNorm``); ``model.add_bias_linear`` ->
  ``add_bias_linear``;
- ``model.position_embedding_type`` / ``rotary_base`` -> ``GPTModel(position_embedding_type, rotary_base)``;
  ``model.untie_embeddings_and_output_weights`` -> ``share_embeddings_and_output_weights`` (negated);
- ``megatron.transformer_impl`` -> the layer spec (``get_gpt_layer_with_transformer_engine_spec`` or
  ``get_gpt_layer_local_spec(normalization=...)``); ``megatron.attention_backend`` -> ``attention_backend``
  (``AttnBackend``); ``megatron.recompute_granularity`` -> ``recompute_granularity`` (``full`` with
  ``recompute_method="uniform", recompute_num_layers=1``); ``megatron.sequence_parallel`` ->
  ``sequence_parallel``;
- ``model.dtype`` -> ``params_dtype / pipeline_dtype / bf16 / fp16``; ``model.attention_dropout /
  hidden_dropout`` -> ``attention_dropout / hidden_dropout`` (0 by default; the engine reseeds the dropout
  random states every step, :mod:`.megatron_rng`) and ``deterministic_mode=True``, so a replayed step is
  bitwise the same;
- ``model.init_method_std`` -> ``init_method_std`` (megatron-core's ``init_method`` is N(0, std) and its
  ``output_layer_init_method`` N(0, std / sqrt(2 num_layers)), both derived from it in
  ``TransformerConfig.__post_init__``).
"""

from __future__ import annotations

from typing import Any

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def transformer_config_kwargs(cfg) -> dict[str, Any]:
    """Keyword arguments of megatron-core's ``TransformerConfig`` for job config ``cfg`` (see the module
    docstring). Imports ``megatron.core.transformer.enums`` (for ``AttnBackend``); allocates nothing."""
    import torch.nn.functional as F
    from megatron.core.transformer.enums import AttnBackend

    m, p, mg = cfg.model, cfg.parallelism, cfg.megatron
    dtype = DTYPES[m.dtype]
    recompute: dict[str, Any] = {"recompute_granularity": None}
    if mg.recompute_granularity == "selective":
        recompute = {"recompute_granularity": "selective"}
    elif mg.recompute_granularity == "full":
        recompute = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
    return dict(
        num_layers=m.layers, hidden_size=m.hidden_size, num_attention_heads=m.heads,
        num_query_groups=m.query_groups, ffn_hidden_size=m.ffn_size,
        tensor_model_parallel_size=p.tp, pipeline_model_parallel_size=p.pp, sequence_parallel=mg.sequence_parallel,
        params_dtype=dtype, pipeline_dtype=dtype, bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16,
        hidden_dropout=m.hidden_dropout, attention_dropout=m.attention_dropout, deterministic_mode=True,
        init_method_std=m.init_method_std,
        normalization=m.normalization, add_bias_linear=m.add_bias_linear,
        gated_linear_unit=m.activation == "swiglu", activation_func=F.silu if m.activation == "swiglu" else F.gelu,
        attention_backend=AttnBackend[mg.backend], **recompute,
    )


def gpt_model_kwargs(cfg) -> dict[str, Any]:
    """``GPTModel`` arguments besides ``config``, the layer spec and ``pre_/post_process``."""
    m = cfg.model
    return dict(
        vocab_size=m.vocab_size, max_sequence_length=m.seq_length, position_embedding_type=m.position_embedding_type,
        rotary_base=m.rotary_base, share_embeddings_and_output_weights=not m.untie_embeddings_and_output_weights,
    )


def layer_spec(cfg):
    """The transformer layer spec of ``megatron.transformer_impl``.

    Raises:
        ImportError: ``transformer_engine`` is chosen and Transformer Engine is not installed.
    """
    from megatron.core.models.gpt import gpt_layer_specs

    if cfg.megatron.transformer_impl == "transformer_engine":
        import transformer_engine  # noqa: F401  (the TE spec falls back silently otherwise)

        return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec()
    return gpt_layer_specs.get_gpt_layer_local_spec(normalization=cfg.model.normalization)


def build_problems(cfg) -> list[str]:
    """What megatron-core refuses in ``cfg``'s model: builds the real ``TransformerConfig`` (on CPU, no
    process group needed) and reports its rejection as one problem naming the fields and megatron-core's
    words. Empty when it builds.

    The installed megatron-core must be importable; check :func:`megatron_version.version_problem` first.
    """
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.transformer import TransformerConfig

        kwargs = transformer_config_kwargs(cfg)
        try:
            TransformerConfig(**kwargs)
        except Exception as exc:  # megatron-core raises AssertionError / ValueError / TypeError here
            shown = {k: kwargs[k] for k in ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups",
                                             "ffn_hidden_size", "normalization", "gated_linear_unit",
                                             "tensor_model_parallel_size", "pipeline_model_parallel_size")}
            return [f"model: megatron-core cannot build this model ({type(exc).__name__}: {exc}); "
                    f"TransformerConfig got {shown}"]
    return []


def submit_problems(cfg, resuming: bool = False, on_cluster: bool = False) -> list[str]:
    """Submit-time checks of engine ``megatron`` that need megatron-core: the installed version is
    supported (:mod:`.megatron_version`), and megatron-core builds the model (:func:`build_problems`); and,
    for every engine, the Megatron-LM checkpoint fields ``resilience.checkpoint.load_megatron`` /
    ``save_megatron`` (:func:`phoenix_hpc.engines.megatron_layout.load_problems`: engine megatron only,
    the tracker file, the iteration folder, the model shape; ``resuming``: ``phoenix submit --resume``, which
    loads the run's own checkpoint, not ``load_megatron``'s; ``on_cluster``: ``phoenix submit
    --data-on-cluster``, a ``load_megatron`` folder not here is left to the ranks). Empty for engine ``torch``
    without them."""
    from phoenix_hpc.engines.megatron_version import installed_version, version_problem
    from phoenix_hpc.engines.megatron_layout import load_problems

    ckpt = load_problems(cfg, resuming, on_cluster)
    if cfg.engine != "megatron":
        return ckpt
    problem = version_problem(installed_version())
    if problem is not None:
        return [problem] + ckpt
    return build_problems(cfg) + ckpt
