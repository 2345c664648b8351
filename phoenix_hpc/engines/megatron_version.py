"""Which megatron-core versions the Megatron engine works with, and the API it calls (pure, no import of
megatron-core).

:data:`SUPPORTED` is the same range as the ``megatron-core`` requirement in ``pyproject.toml`` (a unit test
compares them): 0.16 through 0.19. ``DistributedOptimizer.get_parameter_state_dp_reshardable`` (the engine's
view of the optimizer shard) first appears in megatron-core 0.15.0 (0.12 to 0.14 have only
``get_parameter_state_dp_zero``, which gathers to DP rank 0); 0.16.1 is what the CPU tests run (Python 3.11),
and :data:`NEWEST_CHECKED` (0.19.2, which needs Python 3.12) is the newest release the engine's calls are
checked against. :data:`API` lists every megatron-core module attribute, keyword argument and method the
engine uses; a unit test checks each against the installed version by importing it, and another against
:data:`NEWEST_CHECKED`'s wheel by reading its source (:mod:`phoenix_hpc.engines.megatron_source`); no API
difference between the two needs a separate code path today.
"""

from __future__ import annotations

from importlib import metadata

#: ``(floor, ceiling)``: floor included, ceiling excluded, as ``pyproject.toml`` says ``>=0.16,<0.20``.
SUPPORTED = ((0, 16), (0, 20))
REQUIREMENT = "megatron-core>=0.16,<0.20"
#: The newest megatron-core release whose source the API is checked against (``scripts/setup.sh`` fetches its
#: wheel into :data:`WHEEL_DIR`; the GPU check runs the Megatron engine on it).
NEWEST_CHECKED = "0.19.2"
WHEEL_DIR = ".cache/megatron-core"

#: ``(module, attribute, kind, names)``: ``kind`` is ``"attr"`` (``names`` empty), ``"kwargs"`` (keyword
#: arguments of the callable, or fields of the dataclass) or ``"methods"`` (methods of the class).
API: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("megatron.core.parallel_state", "initialize_model_parallel", "kwargs",
     ("tensor_model_parallel_size", "pipeline_model_parallel_size", "distributed_timeout_minutes",
      "create_gloo_process_groups", "order")),
    ("megatron.core.parallel_state", "destroy_model_parallel", "attr", ()),
    ("megatron.core.parallel_state", "model_parallel_is_initialized", "attr", ()),
    ("megatron.core.parallel_state", "_global_process_group_list", "attr", ()),
    ("megatron.core.parallel_state", "get_data_parallel_group", "attr", ()),
    ("megatron.core.parallel_state", "get_pipeline_model_parallel_group", "attr", ()),
    ("megatron.core.parallel_state", "get_tensor_model_parallel_group", "attr", ()),
    ("megatron.core.parallel_state", "get_pipeline_model_parallel_rank", "attr", ()),
    ("megatron.core.parallel_state", "get_data_parallel_rank", "attr", ()),
    ("megatron.core.parallel_state", "get_tensor_model_parallel_rank", "attr", ()),
    ("megatron.core.parallel_state", "get_data_parallel_world_size", "attr", ()),
    ("megatron.core.parallel_state", "is_pipeline_first_stage", "attr", ()),
    ("megatron.core.parallel_state", "is_pipeline_last_stage", "attr", ()),
    ("megatron.core.tensor_parallel", "model_parallel_cuda_manual_seed", "attr", ()),
    ("megatron.core.tensor_parallel", "get_cuda_rng_tracker", "attr", ()),
    ("megatron.core.transformer", "TransformerConfig", "kwargs",
     ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "ffn_hidden_size",
      "tensor_model_parallel_size", "pipeline_model_parallel_size", "sequence_parallel", "params_dtype",
      "pipeline_dtype", "bf16", "fp16", "hidden_dropout", "attention_dropout", "normalization",
      "gated_linear_unit", "activation_func", "add_bias_linear", "attention_backend", "recompute_granularity",
      "recompute_method", "recompute_num_layers", "deterministic_mode", "grad_scale_func",
      "finalize_model_grads_func")),
    ("megatron.core.transformer.enums", "AttnBackend", "attr", ()),
    ("megatron.core.models.gpt", "GPTModel", "kwargs",
     ("config", "transformer_layer_spec", "vocab_size", "max_sequence_length", "pre_process", "post_process",
      "share_embeddings_and_output_weights", "position_embedding_type", "rotary_base")),
    ("megatron.core.models.gpt.gpt_layer_specs", "get_gpt_layer_local_spec", "kwargs", ("normalization",)),
    ("megatron.core.models.gpt.gpt_layer_specs", "get_gpt_layer_with_transformer_engine_spec", "attr", ()),
    ("megatron.core.distributed", "DistributedDataParallel", "methods", ("broadcast_params", "zero_grad_buffer")),
    ("megatron.core.distributed", "DistributedDataParallelConfig", "kwargs",
     ("grad_reduce_in_fp32", "overlap_grad_reduce", "use_distributed_optimizer")),
    ("megatron.core.distributed", "finalize_model_grads", "attr", ()),
    ("megatron.core.optimizer", "OptimizerConfig", "kwargs",
     ("optimizer", "lr", "min_lr", "weight_decay", "adam_beta1", "adam_beta2", "adam_eps", "clip_grad", "bf16",
      "fp16", "params_dtype", "use_distributed_optimizer")),
    ("megatron.core.optimizer", "get_megatron_optimizer", "kwargs", ("config", "model_chunks",
                                                                     "use_gloo_process_groups")),
    ("megatron.core.optimizer.distrib_optimizer", "DistributedOptimizer", "methods",
     ("get_parameter_state_dp_reshardable", "step", "zero_grad", "scale_loss", "sharded_state_dict",
      "load_state_dict", "reload_model_params")),
    # Megatron-LM checkpoints (engines/megatron_ckpt.py)
    ("megatron.core.dist_checkpointing", "save", "kwargs",
     ("sharded_state_dict", "checkpoint_dir", "validate_access_integrity", "content_metadata")),
    ("megatron.core.dist_checkpointing", "load", "kwargs", ("sharded_state_dict", "checkpoint_dir")),
    ("megatron.core.dist_checkpointing", "load_content_metadata", "kwargs", ("checkpoint_dir",)),
    ("megatron.core.dist_checkpointing", "load_common_state_dict", "kwargs", ("checkpoint_dir",)),
    ("megatron.core.dist_checkpointing.mapping", "ShardedObject", "kwargs",
     ("key", "data", "global_shape", "global_offset", "replica_id")),
    ("megatron.core.dist_checkpointing.mapping", "ShardedTensor", "attr", ()),
    ("megatron.core.optimizer", "ChainedOptimizer", "attr", ()),
    ("megatron.core.pipeline_parallel", "get_forward_backward_func", "attr", ()),
    ("megatron.core.transformer.module", "MegatronModule", "attr", ()),
    ("megatron.core.datasets.indexed_dataset", "IndexedDataset", "attr", ()),
    ("megatron.core.datasets.indexed_dataset", "IndexedDatasetBuilder", "methods", ("add_document", "finalize")),
)


def parse_version(text: str) -> tuple[int, int]:
    """``"0.16.1"`` -> ``(0, 16)`` (major, minor); pre-release tails such as ``0.16.0rc1`` count as their
    release.

    Raises:
        ValueError: ``text`` does not start with ``MAJOR.MINOR``.
    """
    parts = text.split(".")
    if len(parts) < 2:
        raise ValueError(f"not a version: {text!r}")
    minor = "".join(c for c in parts[1] if c.isdigit())
    return int(parts[0]), int(minor)


def installed_version() -> str | None:
    """The installed megatron-core's version string (package metadata, no import), or None."""
    try:
        return metadata.version("megatron-core")
    except metadata.PackageNotFoundError:
        return None


def version_problem(version: str | None) -> str | None:
    """None when ``version`` is supported, else the problem in one line naming the value and what is allowed."""
    allowed = f"allowed: {REQUIREMENT.removeprefix('megatron-core')}, as pyproject.toml requires"
    if version is None:
        return f"engine: 'megatron' needs megatron-core, which is not installed here ({allowed})"
    try:
        v = parse_version(version)
    except ValueError:
        return f"engine: 'megatron' cannot read the installed megatron-core version {version!r} ({allowed})"
    lo, hi = SUPPORTED
    if not lo <= v < hi:
        return f"engine: 'megatron' does not support the installed megatron-core {version} ({allowed})"
    return None
