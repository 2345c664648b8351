"""The job config (``config.yaml``): typed pydantic models, validated once at the boundary.

Shape of the file (every section but ``name`` and ``data`` has defaults)::

    name: gpt-small                 # job name (Slurm --job-name)
    engine: torch                   # torch | megatron | package.module:Class | entry-point name
    python_path: ["."]              # folders (relative to this file) searched first for user code
    run_dir: runs/gpt-small         # where the script, resolved config, journal and logs go
    model:      {layers, hidden_size, heads, vocab_size, seq_length, dtype, ffn_hidden_size, num_query_groups,
                 position_embedding_type, rotary_base, activation, normalization, add_bias_linear,
                 untie_embeddings_and_output_weights, factory, provider, options}
    megatron:   {transformer_impl, attention_backend, recompute_granularity, sequence_parallel}
    parallelism: {tp, pp, dp}       # dp may be omitted: derived from nodes x GPUs per node / (tp x pp)
    training:   {steps, micro_batch_size, global_batch_size, lr, min_lr, lr_schedule, warmup_steps,
                 lr_decay_steps, weight_decay, grad_clip, seed, log_interval, train_samples,
                 lr_warmup_samples, lr_decay_samples, eval_interval, eval_iters}
    data:       {path, factory, options}  # a Megatron indexed dataset (PREFIX.bin + .idx), or your factory
    resilience: {enabled, mode, k, placement_levels, heartbeat_interval_s, heartbeat_timeout_s,
                 collective_timeout_s, chunk_bytes, checksum, checksum_threads, recovery_path,
                 checkpoint: {interval_steps, path}}
    resources:  {nodes, spares, gpus_per_node, time_limit, account, qos, partition, constraint}
    logging:    {tensorboard, tensorboard_dir, wandb: {project, entity, name, mode}}
    converted_from: {source, launcher, dropped, not_carried, kept_for_record, notes, not_run, environment}
                                    # written by `phoenix config from-megatron`: a record, not acted on

Relations that need only the config are checked here (heartbeat interval < heartbeat timeout < collective
timeout; micro batch divides global batch; hidden size divisible by heads; query groups dividing heads and
divisible by tp; the model options and ``megatron`` section the chosen engine can build; ``resilience.recovery_path``
a style the engine supports). Relations that need the site
profile (GPUs per node, QOS limits, failure domains) are checked by :func:`phoenix_hpc.config.resolve`.
A rejection lists every problem (field, value, what is allowed) in one :class:`ConfigError`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

from phoenix_hpc.engines.styles import recovery_path_of
from phoenix_hpc.engines.torch_dtypes import TORCH_ENGINE_DTYPES

# strict: a value of the wrong type is refused, not coerced (``k: true`` is not k = 1, ``steps: "50"`` is not
# 50, ``steps: 2.5`` is not 2); an int where a float is expected is still a float (YAML reads ``lr: 1`` as
# an int). allow_inf_nan=False: ``.inf`` / ``.nan`` are refused in every float field.
_STRICT = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

# Lower bounds of the resilience timings, with the reason a shorter value cannot work on a real network.
TIMING_FLOORS_S: dict[str, tuple[float, str]] = {
    "heartbeat_interval_s": (
        0.1, "every slot sends a signed TCP message to the coordinator each interval; faster beats load the "
             "coordinator of a large job without finding a dead slot any sooner than heartbeat_timeout_s"),
    "heartbeat_timeout_s": (
        1.0, "a live slot's heartbeat can be late by a TCP retransmission (Linux's minimum retransmission "
             "timeout is 200 ms, doubling per retry) or by scheduling delays on a busy node; a shorter "
             "timeout declares healthy slots dead"),
    "collective_timeout_s": (
        2.0, "it bounds every collective and every commit of a replica (H2H), which need TCP connections "
             "between nodes and a whole step's transfer; a shorter timeout fails healthy steps"),
}


def _check_reference(value: str | None) -> str | None:
    """A ``"package.module:attribute"`` reference is well formed (the import is checked at submit)."""
    if value is None:
        return None
    from phoenix_hpc.engines.user_code import split_reference
    from phoenix_hpc.errors import ConfigError

    try:
        split_reference("", value)
    except ConfigError as exc:
        raise ValueError(f"got {value!r}; " + exc.problems[0].split(" -- ", 1)[-1]) from None
    return value


#: ``"package.module:function"`` or unset, checked for its form when loaded.
_Reference = Annotated[str | None, AfterValidator(_check_reference)]


class ModelConfig(BaseModel):
    """GPT-style decoder shape. ``dtype`` is the parameter/compute dtype (fp32 main params are kept by the
    optimizer in every case)."""

    model_config = _STRICT
    layers: int = Field(4, ge=1, description="number of transformer layers (must be divisible by pp)")
    hidden_size: int = Field(128, ge=8, description="model width")
    heads: int = Field(4, ge=1, description="attention heads (must divide hidden_size and be divisible by tp)")
    vocab_size: int = Field(256, ge=2, description="vocabulary size (256 for the byte-level datasets)")
    seq_length: int = Field(64, ge=2, description="tokens per sample")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="parameter dtype")
    ffn_hidden_size: int | None = Field(
        None, ge=1, description="MLP inner size; null: 4 x hidden_size (GPT); Llama-2-7B: 11008"
    )
    num_query_groups: int | None = Field(
        None, ge=1,
        description="key/value head groups of grouped-query attention (must divide heads, be divisible by tp); "
        "null: heads (multi-head attention)",
    )
    position_embedding_type: Literal["learned_absolute", "rope"] = Field(
        "learned_absolute", description="learned_absolute: learned position embeddings (GPT); rope: rotary (Llama)"
    )
    rotary_base: int = Field(10000, ge=1, description="RoPE base (theta); used with position_embedding_type rope")
    activation: Literal["gelu", "swiglu"] = Field(
        "gelu", description="MLP activation: gelu (GPT) or swiglu (gated SiLU, Llama)"
    )
    normalization: Literal["LayerNorm", "RMSNorm"] = Field(
        "LayerNorm", description="LayerNorm (GPT) or RMSNorm (Llama)"
    )
    add_bias_linear: bool = Field(True, description="biases in the linear layers (GPT: true; Llama: false)")
    untie_embeddings_and_output_weights: bool = Field(
        True, description="separate input embedding and output head (Llama: true); false: tied (megatron only)"
    )
    attention_dropout: float = Field(
        0.0, ge=0, lt=1, description="dropout probability on the attention probabilities (Megatron-LM's "
        "--attention-dropout). The masks are a pure function of the seed and the step's place (engine torch: sample "
        "position and stage; engine megatron: step, pp and dp), so a replayed step draws the same ones "
        "(docs/engines.md)")
    hidden_dropout: float = Field(
        0.0, ge=0, lt=1, description="dropout probability on the embeddings' output and each residual branch "
        "(Megatron-LM's --hidden-dropout); masks drawn as attention_dropout's")
    init_method_std: float = Field(
        0.02, gt=0, description="standard deviation of the weights' normal initialisation (Megatron-LM's "
        "--init-method-std, megatron-core's TransformerConfig.init_method_std); the residual branches' output "
        "projections (attention's and the MLP's last linear) get init_method_std / sqrt(2 x layers), as "
        "Megatron-LM's scaled init; the built-in models only (with model.factory: 0.02)")

    @property
    def ffn_size(self) -> int:
        """``ffn_hidden_size``, or ``4 x hidden_size`` when unset."""
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def query_groups(self) -> int:
        """``num_query_groups``, or ``heads`` when unset (multi-head attention)."""
        return self.num_query_groups or self.heads

    # --- a model of your own (docs/engines.md): the torch engine and engines derived from it ---
    factory: _Reference = Field(
        None, description="'package.module:function' building your torch.nn.Module for one pipeline stage "
        "(called as f(stage=, num_stages=, seed=, options=)); unset: the built-in GPT (docs/engines.md)")
    provider: _Reference = Field(
        None, description="'package.module:function' building your megatron-core model for one pipeline stage, "
        "Megatron-LM's model_provider convention (called as f(pre_process=, post_process=, config=, vocab_size=, "
        "max_sequence_length=, options=)); engine megatron only; unset: GPTModel from these fields (docs/engines.md)")
    options: dict[str, Any] = Field(
        default_factory=dict, description="free-form mapping passed to model.factory or model.provider as options=")

    @model_validator(mode="after")
    def _heads_divide_hidden(self):
        """At most one of ``factory`` and ``provider``; ``hidden_size`` is divisible by ``heads``;
        ``num_query_groups`` divides ``heads`` (the built-in models and ``provider``, whose ``config`` is built
        from these fields; a factory's model has its own)."""
        if self.factory is not None and self.provider is not None:
            raise ValueError(
                f"set at most one of model.factory (your torch.nn.Module, engine torch) and model.provider (your "
                f"megatron-core model, engine megatron), got factory={self.factory!r}, provider={self.provider!r}"
            )
        if self.factory is not None:
            return self
        if self.hidden_size % self.heads:
            raise ValueError(
                f"model.hidden_size ({self.hidden_size}) must be divisible by model.heads ({self.heads})"
            )
        if self.heads % self.query_groups:
            raise ValueError(
                f"model.num_query_groups: {self.num_query_groups} must divide model.heads ({self.heads}) "
                f"(allowed: the divisors of {self.heads})"
            )
        return self


#: The values of model options the torch engine's GPT (:mod:`phoenix_hpc.engines.torch_gpt`) requires; it
#: implements every value of the others (RoPE, SwiGLU, RMSNorm, no biases, grouped-query attention, any
#: ffn_hidden_size). A tied output head needs engine ``megatron`` (tying across pipeline stages would need an
#: all-reduce of the shared weight between the first and last stage).
TORCH_ENGINE_MODEL = {"untie_embeddings_and_output_weights": True}

#: The built-in models' shape options, which a ``model.factory`` module does not read: with a factory they
#: must keep these defaults (its own settings go in ``model.options``).
BUILTIN_MODEL_OPTIONS = {
    "position_embedding_type": "learned_absolute", "activation": "gelu", "normalization": "LayerNorm",
    "add_bias_linear": True, "untie_embeddings_and_output_weights": True,
}


class MegatronOptions(BaseModel):
    """megatron-core's standard performance options (engine ``megatron`` only; Megatron-LM's argument names).
    None of them changes the model's maths beyond floating-point rounding."""

    model_config = _STRICT
    transformer_impl: Literal["transformer_engine", "local"] = Field(
        "local",
        description="layer implementation: transformer_engine (fused kernels; Transformer Engine must be "
        "installed on the compute nodes) or local (megatron-core's own PyTorch layers)",
    )
    attention_backend: Literal["auto", "flash", "fused", "unfused", "local"] | None = Field(
        None,
        description="attention kernel (megatron-core AttnBackend): flash / fused (cuDNN) / unfused / auto "
        "(Transformer Engine picks) with transformer_engine; local with local; null: auto or local",
    )
    recompute_granularity: Literal["none", "selective", "full"] = Field(
        "none",
        description="activation recomputation: none; selective (the attention core, Korthikanti et al. 2022); "
        "full (every layer's input only, method uniform, 1 layer per chunk)",
    )
    sequence_parallel: bool = Field(
        False, description="split LayerNorm/dropout activations over the tp ranks (needs parallelism.tp > 1)"
    )

    @property
    def backend(self) -> str:
        """``attention_backend``, or the implementation's default (``auto`` / ``local``) when unset."""
        if self.attention_backend is not None:
            return self.attention_backend
        return "auto" if self.transformer_impl == "transformer_engine" else "local"

    @model_validator(mode="after")
    def _backend_matches_impl(self):
        """``local`` layers have one attention kernel (``local``); Transformer Engine has the others."""
        b = self.attention_backend
        if self.transformer_impl == "local" and b not in (None, "local"):
            raise ValueError(
                f"megatron.attention_backend: {b!r} needs megatron.transformer_impl: transformer_engine "
                "(allowed with transformer_impl local: local)"
            )
        if self.transformer_impl == "transformer_engine" and b == "local":
            raise ValueError(
                "megatron.attention_backend: 'local' needs megatron.transformer_impl: local "
                "(allowed with transformer_engine: auto, flash, fused, unfused)"
            )
        return self


class ParallelismConfig(BaseModel):
    """Grid sizes. Logical rank order is Megatron's: tp fastest, then dp, then pp."""

    model_config = _STRICT
    tp: int = Field(1, ge=1, description="tensor-parallel size")
    pp: int = Field(1, ge=1, description="pipeline-parallel size")
    dp: int | None = Field(None, ge=1, description="data-parallel size; omitted: derived from the node count")


#: Megatron-LM's ``--eval-iters`` default (``megatron/training/arguments.py``): ``training.eval_iters`` when unset.
MEGATRON_EVAL_ITERS = 100


class TrainingConfig(BaseModel):
    """Optimisation settings. Batch sizes are in samples of ``model.seq_length`` tokens."""

    model_config = _STRICT
    steps: int = Field(50, ge=1, description="optimizer steps to run (with train_samples: train_samples // "
                       "global_batch_size, which it defaults to there)")
    micro_batch_size: int = Field(2, ge=1, description="samples per micro-batch per DP rank")
    global_batch_size: int = Field(16, ge=1, description="samples per step over all DP ranks")
    lr: float = Field(1e-3, gt=0, description="peak learning rate")
    min_lr: float = Field(0.0, ge=0, description="final learning rate of the decay")
    lr_schedule: Literal["constant", "cosine", "linear"] = Field(
        "cosine", description="decay from lr to min_lr after the warm-up (phoenix_hpc.engines.schedule)"
    )
    warmup_steps: int = Field(0, ge=0, description="steps of linear warm-up from 0 to lr")
    lr_decay_steps: int | None = Field(
        None, ge=1, description="steps from step 0, warm-up included, over which the lr_schedule decays lr to "
        "min_lr; min_lr after it (Megatron-LM's --lr-decay-iters; longer than steps: the run ends before min_lr). "
        "Allowed: >= warmup_steps; null: steps")
    weight_decay: float = Field(0.01, ge=0, description="AdamW decoupled weight decay")
    grad_clip: float = Field(1.0, ge=0, description="global grad-norm clip; 0 disables")
    seed: int = Field(1234, ge=0, description="seed of parameter initialisation and data order")
    log_interval: int = Field(1, ge=1, description="log every N steps")
    train_samples: int | None = Field(
        None, ge=1, description="samples to train on (Megatron-LM's --train-samples): the run is train_samples // "
        "global_batch_size steps (an incomplete last batch is not trained, as Megatron-LM's update_train_iters), "
        "training.steps may be left out (given, it must be that number), and the schedule counts samples: the update "
        "of step s uses the rate at s x global_batch_size samples, with lr_warmup_samples and lr_decay_samples "
        "instead of warmup_steps and lr_decay_steps. null: the run is counted in steps")
    lr_warmup_samples: int | None = Field(
        None, ge=0, description="samples of linear warm-up from 0 to lr (Megatron-LM's --lr-warmup-samples); with "
        "train_samples only. Allowed: < the decay samples; null: 0")
    lr_decay_samples: int | None = Field(
        None, ge=1, description="samples from sample 0, warm-up included, over which the lr_schedule decays lr to "
        "min_lr; min_lr after it (Megatron-LM's --lr-decay-samples); with train_samples only. Allowed: > "
        "lr_warmup_samples; null: train_samples")
    eval_interval: int | None = Field(
        None, ge=1, description="evaluate the validation loss after every step that is a multiple of N, and once "
        "more after the last step (as Megatron-LM does after training), on the validation part of data.split "
        "(Megatron-LM's --eval-interval; needs data.blend with a validation part); null: no evaluation")
    eval_iters: int | None = Field(
        None, ge=1, description="global batches of the validation part read by each evaluation (Megatron-LM's "
        f"--eval-iters); with eval_interval only; null: {MEGATRON_EVAL_ITERS}, Megatron-LM's default")

    @model_validator(mode="before")
    @classmethod
    def _steps_of_samples(cls, data):
        """``steps`` left out beside ``train_samples``: ``train_samples // global_batch_size`` (Megatron-LM's
        ``update_train_iters`` for a constant global batch size, ``megatron/training/training.py``), when that
        is at least one step (otherwise the sample-counted checks name the problem)."""
        if isinstance(data, dict) and "steps" not in data:
            n = data.get("train_samples")
            g = data.get("global_batch_size", cls.model_fields["global_batch_size"].default)
            if all(type(v) is int for v in (n, g)) and g >= 1 and n >= g:
                data = {**data, "steps": n // g}
        return data

    @model_validator(mode="after")
    def _batches(self):
        """``global_batch_size`` is a multiple of ``micro_batch_size``; ``min_lr <= lr``; ``eval_iters`` only
        with ``eval_interval``; ``lr_decay_steps >= warmup_steps`` when given (Megatron-LM's scheduler decays
        after the warm-up, within the decay steps; phoenix allows the two equal: min_lr right after the
        warm-up)."""
        if self.eval_iters is not None and self.eval_interval is None:
            raise ValueError(f"training.eval_iters: {self.eval_iters} is set but training.eval_interval is null "
                             "(allowed: eval_iters together with an eval_interval, or neither)")
        if self.global_batch_size % self.micro_batch_size:
            raise ValueError(
                f"training.global_batch_size ({self.global_batch_size}) must be a multiple of "
                f"training.micro_batch_size ({self.micro_batch_size})"
            )
        if self.min_lr > self.lr:
            raise ValueError(f"training.min_lr ({self.min_lr}) must be <= training.lr ({self.lr})")
        if self.lr_decay_steps is not None and self.lr_decay_steps < self.warmup_steps:
            raise ValueError(f"training.lr_decay_steps: {self.lr_decay_steps} is shorter than training.warmup_steps "
                             f"({self.warmup_steps}) (allowed: >= warmup_steps, the decay counting from step 0 "
                             "with the warm-up in it, as Megatron-LM's --lr-decay-iters; or null for steps)")
        return self

    @model_validator(mode="after")
    def _samples(self):
        """The sample-counted form as Megatron-LM's ``validate_args`` and ``OptimizerParamScheduler`` allow it
        (``megatron/training/arguments.py``, megatron-core's ``optimizer_param_scheduler.py``): ``lr_warmup_samples``
        and ``lr_decay_samples`` only with ``train_samples``; with it, no step-counted warm-up or decay
        (``warmup_steps`` 0, ``lr_decay_steps`` null), at least one global batch of samples, ``steps`` equal to
        ``train_samples // global_batch_size``, and a warm-up shorter than the decay (Megatron-LM asserts
        ``lr_warmup_steps < lr_decay_steps``)."""
        n, g = self.train_samples, self.global_batch_size
        if n is None:
            for name in ("lr_warmup_samples", "lr_decay_samples"):
                if getattr(self, name) is not None:
                    raise ValueError(f"training.{name}: {getattr(self, name)} is set but training.train_samples is "
                                     "null (allowed: the sample-counted schedule together with train_samples, as "
                                     "Megatron-LM's sample-based training; or warmup_steps / lr_decay_steps)")
            return self
        if self.warmup_steps:
            raise ValueError(f"training.warmup_steps: {self.warmup_steps} beside training.train_samples ({n}) "
                             "(allowed: 0 there: give the warm-up in samples, training.lr_warmup_samples, as Megatron-LM "
                             "refuses --lr-warmup-iters with --train-samples)")
        if self.lr_decay_steps is not None:
            raise ValueError(f"training.lr_decay_steps: {self.lr_decay_steps} beside training.train_samples ({n}) "
                             "(allowed: null there: give the decay in samples, training.lr_decay_samples, as "
                             "Megatron-LM refuses --lr-decay-iters with --train-samples)")
        if n < g:
            raise ValueError(f"training.train_samples: {n} is less than one global batch (training.global_batch_size "
                             f"{g}): no step would be trained (allowed: >= {g})")
        if self.steps != n // g:
            raise ValueError(f"training.steps: {self.steps} is not training.train_samples // "
                             f"training.global_batch_size = {n} // {g} = {n // g} (allowed: {n // g}, or leave "
                             "training.steps out: it is derived from train_samples)")
        warmup, decay = self.lr_warmup_samples or 0, self.decay_samples
        if warmup >= decay:
            of = "lr_decay_samples" if self.lr_decay_samples is not None else "train_samples (lr_decay_samples null)"
            raise ValueError(f"training.lr_warmup_samples: {warmup} is not less than the decay's {decay} samples "
                             f"(training.{of}) (allowed: < {decay}: the decay counts from sample 0 with the warm-up "
                             "in it, and Megatron-LM's scheduler asserts a warm-up shorter than it)")
        return self

    @property
    def decay_samples(self) -> int | None:
        """Samples of the learning-rate decay from sample 0, warm-up included, in the sample-counted form:
        ``lr_decay_samples``, or ``train_samples`` when unset (Megatron-LM's ``get_optimizer_param_scheduler``);
        None when the run is counted in steps."""
        if self.train_samples is None:
            return None
        return self.lr_decay_samples if self.lr_decay_samples is not None else self.train_samples

    @property
    def decay_steps(self) -> int:
        """Steps of the learning-rate decay, counted from step 0 with the warm-up in it: ``lr_decay_steps``, or
        ``steps`` when unset (:func:`phoenix_hpc.engines.schedule.lr_at`)."""
        return self.lr_decay_steps if self.lr_decay_steps is not None else self.steps

    @property
    def eval_batches(self) -> int:
        """Global batches per evaluation: ``eval_iters``, or Megatron-LM's default when unset."""
        return self.eval_iters if self.eval_iters is not None else MEGATRON_EVAL_ITERS


#: Megatron-LM's split when ``--data-path`` is given without ``--split`` (``megatron/training/arguments.py``).
MEGATRON_DEFAULT_SPLIT = "969,30,1"


class BlendEntry(BaseModel):
    """One dataset of a blend: a Megatron indexed dataset prefix and its weight (Megatron-LM's ``--data-path
    W1 P1 W2 P2 ...``; the weights are normalised to sum to 1). Without weights (``--data-path P1 P2``),
    megatron-core blends the datasets in proportion to their sizes; one dataset without a weight is read as
    Megatron-LM reads a single ``--data-path``."""

    model_config = _STRICT
    path: str = Field(..., min_length=1, description="dataset path prefix, without .bin/.idx")
    weight: float | None = Field(
        None, gt=0, description="relative weight (> 0), normalised over the blend; null on every entry: in proportion "
        "to the datasets' sizes (a single entry: the dataset alone), as Megatron-LM without weights")


class DataConfig(BaseModel):
    """Training data: a Megatron indexed dataset (``PREFIX.bin`` + ``PREFIX.idx``, e.g. made by
    ``phoenix data prepare``) in phoenix's own sample order (``path``), a Megatron-LM data blend in the order
    Megatron-LM trains on (``blend`` and ``split``: megatron-core's ``BlendedMegatronDatasetBuilder`` and
    ``GPTDataset``, :mod:`phoenix_hpc.data.blend`), or a map-style dataset built by ``factory``
    (docs/engines.md). A relative path is relative to the config file's folder. Exactly one of ``path``,
    ``blend`` and ``factory`` is set."""

    model_config = _STRICT
    path: str | None = Field(None, min_length=1, description="dataset path prefix, without .bin/.idx")
    blend: list[BlendEntry] | None = Field(
        None, min_length=1, description="a Megatron-LM data blend: [{path, weight}, ...] (one entry: a single "
        "dataset in Megatron-LM's GPTDataset order); the samples of step s are the train split's [(s-1) G, s G), "
        "as in Megatron-LM")
    split: str | None = Field(
        None, description="with blend only: Megatron-LM's --split 'train,valid,test' (e.g. '969,30,1', normalised); "
        f"null: Megatron-LM's default {MEGATRON_DEFAULT_SPLIT!r}. The validation part is read by evaluation (training.eval_interval)")
    factory: _Reference = Field(
        None, description="'package.module:function' returning a map-style dataset of samples indexed by "
        "global sample position (called as f(seq_length=, seed=, options=)); the torch engine and engines derived "
        "from it")
    options: dict[str, Any] = Field(
        default_factory=dict, description="free-form mapping passed to data.factory as options=")

    @property
    def prefixes(self) -> list[str]:
        """Every indexed-dataset prefix the job reads: ``[path]``, the blend's paths, or ``[]`` (a factory)."""
        if self.path is not None:
            return [self.path]
        return [e.path for e in self.blend] if self.blend else []

    @property
    def prefix_fields(self) -> list[tuple[str, str]]:
        """:attr:`prefixes`, each with the field that names it (``data.path`` or ``data.blend[I].path``)."""
        if self.path is not None:
            return [("data.path", self.path)]
        return [(f"data.blend[{i}].path", e.path) for i, e in enumerate(self.blend or [])]

    def resolved(self, base) -> DataConfig:
        """A copy whose relative ``path`` and blend paths are made absolute against the folder ``base``."""
        from pathlib import Path

        def absolute(p: str) -> str:
            return p if Path(p).is_absolute() else str((Path(base) / p).resolve())

        if self.path is not None:
            return self.model_copy(update={"path": absolute(self.path)})
        if self.blend:
            return self.model_copy(update={"blend": [e.model_copy(update={"path": absolute(e.path)})
                                                     for e in self.blend]})
        return self

    @property
    def split_text(self) -> str:
        """``split``, or Megatron-LM's default when unset."""
        return self.split if self.split is not None else MEGATRON_DEFAULT_SPLIT

    @field_validator("split")
    @classmethod
    def _split_form(cls, v):
        """``split`` parses as Megatron-LM's (:func:`phoenix_hpc.data.split.split_vector`)."""
        if v is not None:
            from phoenix_hpc.data.split import split_vector

            split_vector(v)  # ValueError naming what is allowed
        return v

    @model_validator(mode="after")
    def _one_source(self):
        """Exactly one of ``path``, ``blend`` and ``factory``; ``split`` only with ``blend``."""
        given = [n for n in ("path", "blend", "factory") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError(
                "set exactly one of data.path (a Megatron indexed dataset), data.blend (a Megatron-LM data blend) "
                f"and data.factory (your dataset), got {', '.join('data.' + g for g in given) or 'none'}"
            )
        if self.blend and len({e.weight is None for e in self.blend}) > 1:
            raise ValueError("data.blend: weights given for some entries only (allowed: a weight on every entry, or "
                             "on none)")
        if self.split is not None and self.blend is None:
            raise ValueError(f"data.split: {self.split!r} applies to data.blend only (allowed with data.path or "
                             "data.factory: no split)")
        return self


class CheckpointConfig(BaseModel):
    """Coarse persistent checkpoint: the fallback when memory replicas cannot cover a loss, and the whole
    mechanism in ``mode: checkpoint-restart``."""

    model_config = _STRICT
    interval_steps: int = Field(100, ge=1, description="write a persistent checkpoint every K steps")
    path: str | None = Field(None, description="checkpoint folder; default RUN_DIR/checkpoints")
    keep: int = Field(2, ge=1, description="complete checkpoints kept; older complete ones are deleted when a new "
                                          "one is complete (never the newest complete one)")
    restart: Literal["requeue", "in-job"] = Field(
        "requeue",
        description="mode checkpoint-restart only, how a fault is recovered: requeue: the job ends and is submitted "
        "again (phoenix resume), which restores the newest checkpoint; in-job: the batch script ends the srun step "
        "and starts a new one inside the same allocation, on the nodes left (spares take the dead ones' place), and "
        "every rank restores the newest checkpoint")
    load_megatron: str | None = Field(
        None,
        description="engine megatron: start from this Megatron-LM checkpoint directory (absolute path; what "
        "Megatron-LM's --load names: latest_checkpointed_iteration.txt and iter_NNNNNNN/ in the torch_dist format): "
        "its weights, and its optimizer state and iteration when it has them; used when no persistent checkpoint "
        "of this run exists yet")
    save_megatron: str | None = Field(
        None,
        description="engine megatron: also write every persistent checkpoint into this directory (absolute path) in "
        "Megatron-LM's torch_dist layout (iter_NNNNNNN/ and latest_checkpointed_iteration.txt), which Megatron-LM's "
        "--load reads: the periodic ones and the final one of a planned end; all are kept, as Megatron-LM keeps them")


#: ``resilience.d2h_copy_chunk_bytes`` must be a multiple of this (runtime/d2h_chunks.py COPY_CHUNK_ALIGN; a unit
#: test ties them)
D2H_COPY_CHUNK_ALIGN = 16

#: ``resilience.checksum_threads`` bounds, inclusive (runtime/checksum_pool.py THREADS_MIN/MAX; a unit test ties them)
CHECKSUM_THREADS_RANGE = (1, 64)
#: largest resilience.agreement_strikes_window_steps (a window longer than any run)
STRIKES_WINDOW_MAX = 1_000_000_000


class ResilienceConfig(BaseModel):
    """PHOENIX protection settings (docs/design.md sections 4-6). With ``enabled: false`` training runs with no
    extra layer at all."""

    model_config = _STRICT
    enabled: bool = Field(True, description="false: plain training, no snapshot or replication")
    mode: Literal["phoenix", "checkpoint-restart"] = Field(
        "phoenix",
        description="phoenix: in-memory replicas and hot swap; checkpoint-restart: the classic baseline",
    )
    k: int = Field(1, ge=1, description="replicas of each optimizer shard (holders besides the owner)")
    placement_levels: list[str] = Field(
        default_factory=lambda: ["node", "switch"],
        description="failure-domain levels to spread replicas over, most specific first, starting with node; not "
                    "given: node and the site's next level (phoenix submit: switch on local and Perlmutter, leaf on "
                    "Vista)",
    )
    heartbeat_interval_s: float = Field(1.0, ge=0.1, description="seconds between heartbeats (at least 0.1)")
    heartbeat_timeout_s: float = Field(
        10.0, ge=1.0, description="seconds without a heartbeat before a slot is dead (at least 1)")
    collective_timeout_s: float = Field(
        30.0, ge=2.0, description="timeout of every process-group collective and replica commit, seconds (at least 2)")
    coordinator_timeout_s: float = Field(
        60.0, gt=0, description="seconds a slot goes without an answer from the coordinator (its beat counter "
                                "advancing, asked by the slot's heartbeat thread) while their connection stays open, "
                                "before it stops with exit code 75; must exceed heartbeat_timeout_s (a busy coordinator "
                                "answers late, it is not gone). A closed connection (the coordinator's process ended) "
                                "stops the slot at once when coordinator_restarts is 0, else after "
                                "coordinator_restart_timeout_s without a restarted coordinator")
    coordinator_grace_s: float = Field(
        120.0, ge=0, description="start-up grace after a slot registered, seconds: imports, rendezvous and engine "
                                 "set-up on a loaded node starve both sides, so the slot does not judge the "
                                 "coordinator's silence before it ends, and the coordinator does not judge the slot's "
                                 "heartbeats before it ends or the slot reported its first step; a closed connection "
                                 "(process exit) counts at once on both sides")
    coordinator_restarts: int = Field(
        3, ge=0, le=20, description="times the batch script restarts a crashed coordinator within one job (a "
                                    "process end without its verdict: SIGKILL, OOM kill, an uncaught error); the "
                                    "restarted coordinator rebuilds its state from the journal and from the slots, "
                                    "which reconnect. 0: a crash ends the job (every slot stops with exit code 75)")
    coordinator_restart_timeout_s: float = Field(
        120.0, gt=0, description="seconds a slot trains on after its coordinator's connection closed, waiting for "
                                 "the restarted coordinator (reports are buffered meanwhile), before it stops with "
                                 "exit code 75; used when coordinator_restarts > 0")
    chunk_bytes: int = Field(4 << 20, gt=0, description="H2H message chunk size in bytes")
    thread_nice: int = Field(
        0, ge=0, le=19,
        description="added to the nice value (setpriority(2)) of the runtime's background threads, the D2H "
        "copy/checksum thread, the H2H MPI thread and a GPU rank's checksum threads, when they start (design section 4, Cost): on cores they "
        "share with the training thread they then take what it leaves, at the risk of starving replica verification "
        "on oversubscribed hosts (commits then time out). 0 (the default): the training thread's priority. "
        "Allowed: 0 .. 19")
    checksum: Literal["xxh3_64", "crc32c", "crc32", "wsum64"] = Field(
        "xxh3_64",
        description="checksum of every snapshot and replica tensor (design section 4, Checksums): xxh3_64 "
        "(XXH3, 64 bit; the fastest measured on CPU), crc32c (CRC-32C, hardware instruction where the CPU has one), "
        "crc32 (zlib CRC-32) or wsum64 (Fletcher-style weighted sums with torch ops: a GPU rank computes it on the "
        "device from the live tensors before they cross the link; holders and restores verify host bytes with "
        "the same function on CPU, slower per byte than xxh3_64)",
    )
    d2h_copy_chunk_bytes: int = Field(
        0,
        description="a GPU rank's D2H splits every tensor's copy into commands of at most this many bytes (design "
        "section 3, D2H), so that no long copy command holds the copy engine, or under "
        "CUDA_DEVICE_MAX_CONNECTIONS=1 the one queue of every stream; 0 (the default): one copy command per tensor. "
        "A CPU rank ignores it. Allowed: 0 or a positive multiple of 16")
    d2h_copy_coalesce: bool = Field(
        False,
        description="a GPU rank's D2H copies consecutive snapshot tensors that view one device storage (an engine's "
        "flat optimizer buffers) as their slots lie in the host buffer with one copy command per run, instead of one "
        "per tensor (design section 3, D2H); then split by d2h_copy_chunk_bytes. A CPU rank ignores it")
    checksum_threads: int | Literal["auto"] = Field(
        "auto",
        description="threads that checksum the snapshot tensors a CUDA D2H copy landed, while the next ones are "
        "still on the link (design section 4, Checksums): one core checksums pinned memory at about 10 GB/s, the "
        "host link copies 55 GB/s (H200, PCIe gen 5). auto (the default): half of the CPUs Slurm bound the rank "
        "to, at most 8, on a GPU rank; 1 on a CPU rank, whose copy thread checksums each tensor right after "
        "copying it. Allowed: auto or an integer from 1 to 64")
    recovery_path: Literal["auto", "rebind", "rebuild"] = Field(
        "auto",
        description="how members take part in a recovery (design section 6): rebind keeps each survivor's engine "
        "and gives it the new groups; rebuild tears every engine down and builds the next generation's anew; "
        "auto is the engine's own (torch: rebind, megatron: rebuild; megatron supports only rebuild)",
    )
    recovery_source: Literal["memory", "checkpoint"] = Field(
        "memory",
        description="mode phoenix only: memory: a recovery restores from the in-memory replicas (hot swap), the "
        "persistent checkpoint only when they cannot cover the loss; checkpoint: every recovery restarts in the "
        "same processes from the newest persistent checkpoint (the fallback path taken on purpose, to compare "
        "with the hot swap)")
    spares_exhausted: Literal["auto", "shrink", "stop"] = Field(
        "auto",
        description="mode phoenix only: what a fault does when it needs a replacement and no spare is left (design "
        "section 6, Shrink): shrink removes the whole DP replica of the lost slot(s) (dp - 1; its healthy slots "
        "become spares; global batch and sample order unchanged) and training goes on; stop ends the job naming "
        "the checkpoint to resubmit from (or restarts from it in the job if spares allow); auto is shrink with "
        "engine torch and stop with any other engine (shrink needs an engine that can re-partition its "
        "optimizer: torch only)")
    agreement_strikes_window_steps: int = Field(
        1000,
        description="replica agreement (design section 6): a member named the corrupted data-parallel replica "
        "(against a majority of its DP peers, so dp >= 3) at two different steps at most this many steps apart is "
        "treated as a failing node: fenced and replaced by a spare. 0: never replaced for it (every difference is "
        "still rolled back). Allowed: an integer from 0 to 1000000000")
    replica_agreement: bool = Field(
        True,
        description="replica agreement (design section 6): at every commit the data-parallel replicas of each "
        "(pp, tp) compare a 64-bit digest of their parameters (in the commit fence and the commit reports), and a "
        "difference is rolled back and replayed from memory. false: no digest is computed, the commit fence and "
        "the commit reports carry none, the coordinator compares nothing and journals once per generation that "
        "the check is off (agreement_off, shown by phoenix status): a silently corrupted replica then goes "
        "unnoticed. For measuring the check's cost. Allowed: true or false")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="persistent checkpoints")
    # after ``checkpoint``: its check reads checkpoint.interval_steps (pydantic validates fields in this order)
    protect_every_max: int = Field(
        1,
        description="mode phoenix with enabled: true only: largest adaptive protection interval m (design section "
        "4, Protection interval): when a step's protection cannot finish inside the next step's compute window, "
        "the ranks protect every m-th step (lost work then at most 2m-1 steps), m chosen from the measured times; "
        "1 (the default) protects every step whatever it costs. Allowed: 1 .. checkpoint.interval_steps")

    @field_validator("agreement_strikes_window_steps", mode="before")
    @classmethod
    def _strikes_window(cls, v):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= STRIKES_WINDOW_MAX:
            raise ValueError(f"not allowed (allowed: an integer from 0 to {STRIKES_WINDOW_MAX}; 0: never)")
        return v

    @field_validator("replica_agreement", mode="before")
    @classmethod
    def _replica_agreement(cls, v):
        if not isinstance(v, bool):
            raise ValueError("not allowed (allowed: true or false)")
        return v

    @field_validator("d2h_copy_chunk_bytes", mode="before")
    @classmethod
    def _d2h_copy_chunk_bytes(cls, v):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v % D2H_COPY_CHUNK_ALIGN:
            raise ValueError(f"not allowed (allowed: 0 for one copy per tensor, or a positive multiple of "
                             f"{D2H_COPY_CHUNK_ALIGN} bytes)")
        return v

    @field_validator("checksum_threads", mode="before")
    @classmethod
    def _checksum_threads(cls, v):
        """One message for every refused value (the two-member union would give one per member)."""
        lo, hi = CHECKSUM_THREADS_RANGE
        if not (isinstance(v, str) and v == "auto") and (
                isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi):
            raise ValueError(f"not allowed (allowed: 'auto' or an integer from {lo} to {hi})")
        return v

    @field_validator("protect_every_max")
    @classmethod
    def _interval_cap(cls, v, info):
        """``1 <= protect_every_max <= checkpoint.interval_steps`` (a field check, so that a bad cap is refused
        on its own and the section's other checks still run on the rest; the upper bound only when
        ``checkpoint`` itself is valid)."""
        ckpt = info.data.get("checkpoint")
        hi = ckpt.interval_steps if ckpt is not None else None
        if v < 1 or (hi is not None and v > hi):
            allowed = "1 .. resilience.checkpoint.interval_steps" + (f" = {hi}" if hi is not None else "")
            raise ValueError(f"not allowed (allowed: {allowed})")
        return v

    @field_validator("heartbeat_interval_s", "heartbeat_timeout_s", "collective_timeout_s", mode="before")
    @classmethod
    def _timing_floor(cls, v, info):
        """Lower bounds a real network can meet: ``heartbeat_interval_s`` >= 0.1 s, ``heartbeat_timeout_s`` >= 1 s,
        ``collective_timeout_s`` (also the replica commit timeout) >= 2 s; a shorter value is refused with the
        reason."""
        floor, why = TIMING_FLOORS_S[info.field_name]
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v < floor:
            raise ValueError(f"{v:g} s is below the lower bound of {floor:g} s: {why}")
        return v

    @model_validator(mode="after")
    def _timeouts(self):
        """``heartbeat_interval_s < heartbeat_timeout_s < collective_timeout_s`` and ``coordinator_timeout_s >
        heartbeat_timeout_s``; ``checkpoint.restart: in-job`` needs mode ``checkpoint-restart``; the phoenix-only
        fields away from their defaults (``recovery_source: checkpoint``, ``spares_exhausted``,
        ``protect_every_max``) need mode ``phoenix``, ``protect_every_max`` also ``enabled: true``;
        ``placement_levels`` contains ``node``."""
        a, b, c = self.heartbeat_interval_s, self.heartbeat_timeout_s, self.collective_timeout_s
        # (the field it is about, or () for several; message). A message names every other field it judges by
        # its full dotted path: the site re-check of an invalid config (config/partial.py) then leaves out a
        # problem that judged a refused field's default instead of the user's value (``about_dropped``)
        problems: list[tuple[tuple[str, ...], str]] = []
        mode = f"resilience.mode {self.mode!r}"
        if not a < b < c:
            problems.append(((), "need resilience.heartbeat_interval_s < resilience.heartbeat_timeout_s < "
                                 f"resilience.collective_timeout_s, got {a} < {b} < {c}"))
        if not self.coordinator_timeout_s > b:
            problems.append((("coordinator_timeout_s",), f"must be more than resilience.heartbeat_timeout_s ({b})"))
        if self.checkpoint.restart == "in-job" and self.mode != "checkpoint-restart":
            problems.append((("checkpoint", "restart"), f"needs resilience.mode 'checkpoint-restart', got {mode} "
                                                        "(allowed with it: 'requeue')"))
        if self.recovery_source == "checkpoint" and self.mode != "phoenix":
            problems.append((("recovery_source",), f"needs resilience.mode 'phoenix', got {mode} (allowed with it: "
                                                   "'memory')"))
        if self.spares_exhausted != "auto" and self.mode != "phoenix":
            problems.append((("spares_exhausted",), f"needs resilience.mode 'phoenix', got {mode} (allowed with "
                                                    "it: 'auto')"))
        if self.protect_every_max != 1 and not (self.enabled and self.mode == "phoenix"):
            problems.append((("protect_every_max",), "needs resilience.enabled true and resilience.mode 'phoenix', got "
                                                     f"resilience.enabled {str(self.enabled).lower()} and {mode} "
                                                     "(allowed with them: 1)"))
        if "node" not in self.placement_levels:
            problems.append((("placement_levels",), f"{self.placement_levels} must contain 'node' (a node is always a "
                                                    "failure domain)"))
        if problems:
            raise relation_errors(self, problems)
        return self


def relation_errors(model: BaseModel, problems: list[tuple[tuple[str, ...], str]]):
    """One pydantic ``ValidationError`` with a ``value_error`` per problem of ``model``'s relation checks, each
    located at the field it is about (its value as the input), or at the section itself for ``()``: so every
    problem is listed, and the site re-check of an invalid config (:mod:`phoenix_hpc.config.partial`) leaves
    out only those fields, not the whole section. Raised from a model validator, it is nested under the
    section's own location by pydantic."""
    from pydantic import ValidationError
    from pydantic_core import InitErrorDetails, PydanticCustomError

    def value(loc: tuple[str, ...]) -> Any:
        v: Any = model
        for k in loc:
            v = getattr(v, k)
        return v if loc else model.model_dump()

    return ValidationError.from_exception_data(type(model).__name__, [
        InitErrorDetails(type=PydanticCustomError("value_error", "{message}", {"message": msg}), loc=loc,
                         input=value(loc)) for loc, msg in problems])


class ResourcesConfig(BaseModel):
    """What to ask Slurm for. Unset scheduler fields take the site profile's defaults."""

    model_config = _STRICT
    nodes: int = Field(1, ge=1, description="active nodes")
    spares: int = Field(1, ge=0, description="spare nodes held in standby inside the same job")
    gpus_per_node: int | None = Field(None, ge=1, description="override of the site's GPUs per node")
    time_limit: str = Field("00:30:00", description="Slurm time limit, [D-]HH:MM:SS or minutes")
    account: str | None = Field(None, description="Slurm account (-A); default: the site's")
    qos: str | None = Field(None, description="Slurm QOS (-q); default: the site's")
    partition: str | None = Field(None, description="Slurm partition (-p); default: the site's")
    constraint: str | None = Field(None, description="node feature constraint (-C); default: the site's")
    chain: int = Field(0, ge=0, description="jobs the run may submit after this one to continue itself: each job, "
                                            "at its start, queues the next (sbatch --dependency=afternotok) from the "
                                            "newest complete checkpoint, which starts only when this job ends before "
                                            "the last step (time limit, signal, failure, lost batch host); at most "
                                            "the site's scheduler.max_chain")

    @field_validator("time_limit", mode="before")
    @classmethod
    def _time_limit_is_text(cls, v):
        """``resources.time_limit`` is quoted text: a YAML number is rejected, with the reason (YAML 1.1 reads
        an unquoted ``12:00:00`` as the base-60 number 43200)."""
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            raise ValueError(  # noqa: TRY003
                f"got the number {v!r}; must be a quoted string ([D-]HH:MM:SS or minutes); a YAML number here is ambiguous (an "
                "unquoted 12:00:00 is read as the base-60 number 43200): write e.g. time_limit: \"12:00:00\" "
                "or time_limit: \"720\""
            )
        return v


class WandbConfig(BaseModel):
    """Weights & Biases logging (``wandb.init`` arguments). Needs the ``wandb`` package installed (and, online,
    logged in: ``wandb login`` or ``WANDB_API_KEY``) wherever the job's ranks run; submit refuses the job when
    it cannot import ``wandb``."""

    model_config = _STRICT
    project: str = Field(..., min_length=1, description="W&B project (Megatron-LM's --wandb-project)")
    entity: str | None = Field(None, min_length=1, description="W&B entity (team or user); null: your default")
    name: str | None = Field(None, min_length=1, description="run name (Megatron-LM's --wandb-exp-name); null: the "
                                                             "job name")
    mode: Literal["online", "offline"] = Field(
        "online", description="online: stream to the W&B server; offline: write RUN_DIR/wandb for 'wandb sync'")


class LoggingConfig(BaseModel):
    """Training metrics to TensorBoard and W&B, written by one rank (the last pipeline stage's first DP and TP
    rank): loss, validation loss, learning rate, grad norm, step time, tokens/s, and each recovery with its
    phases. Both off unless asked."""

    model_config = _STRICT
    tensorboard: bool = Field(False, description="write TensorBoard event files (needs the tensorboard package)")
    tensorboard_dir: str | None = Field(
        None, min_length=1, description="with tensorboard: true, where the event files go (relative: to the run "
        "directory); null: RUN_DIR/tensorboard")
    wandb: WandbConfig | None = Field(None, description="log the same to W&B; null: no W&B")

    @model_validator(mode="after")
    def _dir_needs_tensorboard(self):
        """``tensorboard_dir`` only with ``tensorboard: true``."""
        if self.tensorboard_dir is not None and not self.tensorboard:
            raise ValueError(f"logging.tensorboard_dir: {self.tensorboard_dir!r} is set but logging.tensorboard is "
                             "false (allowed: tensorboard: true with it, or no tensorboard_dir)")
        return self


class ConversionRecord(BaseModel):
    """What ``phoenix config from-megatron`` did not carry over from the Megatron-LM launch it converted, and
    why (docs/megatron-args.md). phoenix does not act on any of it: it is kept in the config so that the run
    directory's ``config.yaml``, which ``phoenix submit`` writes without the file's comments, still says what
    the run left out of the original launch. Every entry is one line of text."""

    model_config = _STRICT
    source: str = Field(..., min_length=1, description="what was converted: the --args-file script (with its "
                        "--script-arg values) and/or the arguments given after --")
    launcher: str | None = Field(None, description="the script's launch command before pretrain_gpt.py (torchrun "
                                 "..., as bash expanded it); phoenix launches the ranks itself")
    dropped: list[str] = Field(default_factory=list, description="arguments that change the training, dropped "
                               "with --drop: 'ARGUMENT AS GIVEN: why'")
    not_carried: list[str] = Field(default_factory=list, description="arguments not carried over because they do "
                                   "not change what is trained: 'ARGUMENT VALUE: why'")
    kept_for_record: list[str] = Field(default_factory=list, description="arguments phoenix does not use "
                                       "(tokenizer files, checkpoint format): 'ARGUMENT VALUE'")
    notes: list[str] = Field(default_factory=list, description="derived values (the padded vocabulary, ...)")
    not_run: list[str] = Field(default_factory=list, description="commands of the --args-file script not run when "
                               "it was read: 'line N: command'")
    environment: dict[str, str] = Field(default_factory=dict, description="variables the script set for its "
                                        "launch (export, or NAME=VALUE before the launcher); phoenix does not set "
                                        "them in the job: the site profile's environment.env or the submitting "
                                        "shell (sbatch passes it on) does")


class JobConfig(BaseModel):
    """A whole job. Build with :func:`phoenix_hpc.config.load_job_config`; never mutate (frozen)."""

    model_config = _STRICT
    name: str = Field(..., min_length=1, max_length=128, description="job name")
    engine: str = Field(
        "torch", min_length=1,
        description="torch: plain PyTorch (CPU or GPU); megatron: megatron-core (needs CUDA); "
        "'package.module:Class': your Engine subclass; or an entry point of group phoenix_hpc.engines",
    )
    python_path: list[str] = Field(
        default_factory=lambda: ["."],
        description="folders put first on sys.path (at submit and on every rank) to import engine, model.factory, "
        "model.provider and data.factory; relative to the config file's folder",
    )
    run_dir: str | None = Field(None, description="run directory; default runs/<name>-<timestamp>")
    model: ModelConfig = Field(default_factory=ModelConfig)
    megatron: MegatronOptions = Field(
        default_factory=MegatronOptions, description="megatron-core performance options (engine megatron only)"
    )
    parallelism: ParallelismConfig = Field(default_factory=ParallelismConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    data: DataConfig
    resilience: ResilienceConfig = Field(default_factory=ResilienceConfig)
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    converted_from: ConversionRecord | None = Field(
        None, description="what `phoenix config from-megatron` did not carry over from the Megatron-LM launch (a "
        "record, not acted on); null: not converted")

    @model_serializer(mode="wrap")
    def _without_absent_record(self, handler):
        """The dump of a config without ``converted_from`` has no such key, so that every config written before
        the field existed dumps (``config.yaml``, W&B's config) exactly as it did."""
        data = handler(self)
        if self.converted_from is None and isinstance(data, dict):
            data.pop("converted_from", None)
        return data

    @field_validator("engine")
    @classmethod
    def _engine_name(cls, v):
        """``engine`` is a built-in name, ``package.module:Class`` or an entry-point name."""
        if ":" in v:
            return _check_reference(v)
        if not all(p.isidentifier() for p in v.replace("-", "_").split(".")):
            raise ValueError(
                f"got {v!r}; expected torch, megatron, 'package.module:Class' or an entry-point name"
            )
        return v

    @model_validator(mode="after")
    def _model_vs_grid(self):
        """``model.layers`` is divisible by ``parallelism.pp``; ``model.heads`` and ``model.num_query_groups``
        by ``parallelism.tp`` (the built-in models only: a ``model.factory`` decides its own split); engine
        ``torch`` gets only the model options its GPT implements (none with a factory) and no ``megatron``
        section; ``megatron.sequence_parallel`` needs tp > 1; ``resilience.recovery_path`` is ``auto`` or a style
        a built-in engine supports (:data:`phoenix_hpc.engines.styles.ENGINE_RECOVERY_STYLES`; a user engine's
        class is checked at submit, :func:`phoenix_hpc.engines.factory.check_user_code`)."""
        problems = []
        builtin = self.model.factory is None
        if builtin and self.model.layers % self.parallelism.pp:
            problems.append(
                f"model.layers ({self.model.layers}) must be divisible by parallelism.pp ({self.parallelism.pp})"
            )
        if builtin and self.model.heads % self.parallelism.tp:
            problems.append(
                f"model.heads ({self.model.heads}) must be divisible by parallelism.tp ({self.parallelism.tp})"
            )
        tp, groups = self.parallelism.tp, self.model.query_groups
        if builtin and self.model.num_query_groups is not None and groups % tp:
            problems.append(
                f"model.num_query_groups: {groups} must be divisible by parallelism.tp ({tp}) "
                "(each tensor-parallel rank holds whole key/value groups)"
            )
        if self.engine == "torch":
            problems += self._torch_engine_problems()
        elif self.megatron.sequence_parallel and tp == 1:
            problems.append("megatron.sequence_parallel: true needs parallelism.tp > 1 (allowed with tp 1: false)")
        try:
            recovery_path_of(self.engine, self.resilience.recovery_path)
        except ValueError as exc:
            problems.append(str(exc))
        problems += self._evaluation_problems()
        if self.resilience.spares_exhausted == "shrink" and self.engine != "torch":
            problems.append(f"resilience.spares_exhausted: 'shrink' needs engine 'torch' (engine is {self.engine!r}; "
                            "allowed here: auto, stop)")
        if problems:
            raise ValueError("\n".join(problems))  # one line each: format_validation_error lists them apart
        return self

    def _evaluation_problems(self) -> list[str]:
        """``training.eval_interval`` needs a validation part to read: data.blend with a split whose second
        number is above 0 (data.path and data.factory have no validation part)."""
        every = self.training.eval_interval
        if every is None:
            return []
        if self.data.blend is None:
            return [f"training.eval_interval: {every} needs a validation split, which only data.blend has (allowed "
                    "with data.path or data.factory: null)"]
        from phoenix_hpc.data.split import split_vector

        if split_vector(self.data.split_text)[1] <= 0:
            return [f"training.eval_interval: {every} needs a validation part, but data.split "
                    f"{self.data.split_text!r} gives it none (allowed: a split whose second number is above 0, e.g. "
                    "'98,2,0', or eval_interval null)"]
        return []

    def _torch_engine_problems(self) -> list[str]:
        m, out = self.model, []
        hint = ("use engine: megatron" if m.factory is None else
                "model.factory builds the model: pass your model's settings in model.options")
        fixed = TORCH_ENGINE_MODEL if m.factory is None else BUILTIN_MODEL_OPTIONS
        for name, allowed in fixed.items():
            if getattr(m, name) != allowed:
                out.append(f"model.{name}: {getattr(m, name)!r} is not supported by engine torch (allowed: "
                           f"{allowed!r}); {hint}")
        if m.factory is not None and m.ffn_hidden_size is not None and m.ffn_hidden_size != 4 * m.hidden_size:
            out.append(f"model.ffn_hidden_size: {m.ffn_hidden_size} is not supported by engine torch (allowed: "
                       f"null or 4 x hidden_size = {4 * m.hidden_size}); {hint}")
        if m.factory is not None and m.num_query_groups is not None and m.num_query_groups != m.heads:
            out.append(f"model.num_query_groups: {m.num_query_groups} is not supported by engine torch (allowed: "
                       f"null or heads = {m.heads}); {hint}")
        head_dim = m.hidden_size // m.heads
        if m.factory is None and m.position_embedding_type == "rope" and head_dim % 2:
            out.append(f"model.position_embedding_type: 'rope' needs an even head dimension, got model.hidden_size "
                       f"/ model.heads = {m.hidden_size} / {m.heads} = {head_dim} (allowed: hidden_size and heads "
                       "whose quotient is even, or learned_absolute)")
        if m.factory is not None and (m.attention_dropout or m.hidden_dropout):
            out.append(f"model.attention_dropout / model.hidden_dropout: {m.attention_dropout} / {m.hidden_dropout} "
                       "apply to the built-in GPT only (allowed with model.factory: 0; pass your model's dropout in "
                       "model.options)")
        if m.factory is not None and m.init_method_std != ModelConfig.model_fields["init_method_std"].default:
            out.append(f"model.init_method_std: {m.init_method_std} applies to the built-in GPT only (allowed with "
                       "model.factory: 0.02, the default; your factory initialises its own module: pass its std in "
                       "model.options)")
        if self.megatron != MegatronOptions():
            out.append("megatron: options are set but engine is torch (allowed: no megatron section, or "
                       "engine: megatron)")
        # what the torch engine refuses when a rank constructs it (engines/torch_engine.py), refused here first
        if m.dtype not in TORCH_ENGINE_DTYPES:
            out.append(f"model.dtype: {m.dtype!r} is not supported by engine torch (allowed: "
                       f"{', '.join(TORCH_ENGINE_DTYPES)}; float16 needs a loss scaler, which it has not); "
                       "use engine: megatron")
        if self.parallelism.tp != 1:
            out.append(f"parallelism.tp: {self.parallelism.tp} is not supported by engine torch (allowed: 1, no "
                       "tensor parallelism); use engine: megatron")
        return out
