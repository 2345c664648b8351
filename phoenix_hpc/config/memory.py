"""GPU memory per rank of a Megatron-engine job, estimated at submit (pure).

The estimate is for the pipeline stage that needs the most, of one rank (its 1/tp of the stage), in bytes
(reported in GB = 1e9 bytes):

- **weights**: the rank's parameters (:func:`stage_params`) x the bytes of ``model.dtype``;
- **gradients**: the same count x 4 (the engine's DDP keeps fp32 gradient buffers, ``grad_reduce_in_fp32``);
- **optimizer shard**: ``12 / dp`` bytes per parameter (fp32 main parameter, ``exp_avg``, ``exp_avg_sq``
  split over the DP group by the distributed optimizer; Rajbhandari et al. 2020, ZeRO stage 1);
- **activations**: per layer and micro-batch after Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models" (arXiv:2205.05198), section 4, Table 2, whose 16-bit bytes
  ``sbh (10 + 24/t + 5as/(ht))`` this splits into its terms, with K/V of ``num_query_groups`` heads, and an MLP of ``ffn_hidden_size`` f (GeLU keeps its input and
  output, ``2 e s b f``; SwiGLU the gate and up projections and their product, ``3 e s b f``):
  replicated over tp ``R = 4 e s b h`` (two norm inputs, QKV input, FC1 input; divided by t with sequence
  parallelism), plus with ``model.hidden_dropout`` above 0 the two 1-byte dropout masks ``2 s b h`` (the
  attention projection's and the MLP's output), split over tp ``T = e s b (2h + 2 h_kv) + MLP`` plus the
  attention scores ``e a s^2 b`` (with ``model.attention_dropout`` above 0 also their 1-byte mask and dropped
  copy, ``(1 + e) a s^2 b``) only with the ``local``/``unfused`` attention kernel and no selective
  recomputation (flash and fused attention never store them: Dao et al. 2022). Full recomputation keeps each layer's input ``e s b h``
  (``/t`` with sequence parallelism) plus one layer's activations while it is recomputed. ``e`` is the
  bytes of ``model.dtype``. With the 1F1B pipeline schedule stage ``i`` holds ``min(pp - i, micro-batches)``
  micro-batches in flight (Narayanan et al. 2021, section 2.2), each of ``layers / pp`` layers;
- **logits** (last stage): fp32 logits and their gradient in the vocabulary-parallel cross entropy,
  ``2 x 4 s b V / t``;
- **overhead**: :data:`OVERHEAD_BYTES`, an assumption for the CUDA context, NCCL buffers and cuBLAS /
  Transformer Engine workspaces.

It is an estimate: the allocator's fragmentation and framework buffers not listed above are not counted, so
a config that is close to the limit can still run out of memory.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9
#: CUDA context (~0.5 GB), NCCL communicator buffers and cuBLAS / Transformer Engine workspaces: an
#: assumption, not a measurement.
OVERHEAD_BYTES = 3 * GB
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def layer_params(m) -> tuple[int, int]:
    """``(split, replicated)`` parameter counts of one transformer layer of model config ``m``: ``split``
    is divided over tp (column/row-parallel weights, column-parallel biases), ``replicated`` is not (norms,
    row-parallel biases)."""
    h, f = m.hidden_size, m.ffn_size
    kv = h // m.heads * m.query_groups
    gate = 2 if m.activation == "swiglu" else 1
    split = h * (h + 2 * kv) + h * h + h * f * gate + f * h
    norm = h if m.normalization == "RMSNorm" else 2 * h
    replicated = 2 * norm
    if m.add_bias_linear:
        split += (h + 2 * kv) + f * gate
        replicated += 2 * h
    return split, replicated


def stage_params(m, pp: int, stage: int, tp: int) -> int:
    """Parameters held by one rank of pipeline ``stage`` (of ``pp``) with tensor-parallel size ``tp``: its
    ``layers / pp`` layers, the word (and learned position) embeddings on the first stage, the final norm
    and the output layer on the last (a tied output layer is a copy of the word embeddings there when
    pp > 1, megatron-core's shared embedding)."""
    split, replicated = layer_params(m)
    per = m.layers // pp
    total_split, total_rep = split * per, replicated * per
    if stage == 0:
        total_split += m.vocab_size * m.hidden_size
        if m.position_embedding_type == "learned_absolute":
            total_rep += m.seq_length * m.hidden_size
    if stage == pp - 1:
        total_rep += m.hidden_size if m.normalization == "RMSNorm" else 2 * m.hidden_size
        if m.untie_embeddings_and_output_weights or pp > 1:
            total_split += m.vocab_size * m.hidden_size
    return total_split // tp + total_rep


def layer_activation_bytes(cfg) -> tuple[float, float]:
    """``(kept, full)`` activation bytes of one layer and one micro-batch: ``kept`` is what the chosen
    recomputation keeps until the backward pass, ``full`` what the layer holds while it runs (see the
    module docstring)."""
    m, mg, t = cfg.model, cfg.megatron, cfg.parallelism.tp
    e = _BYTES[m.dtype]
    s, b, h, f = m.seq_length, cfg.training.micro_batch_size, m.hidden_size, m.ffn_size
    kv = h // m.heads * m.query_groups
    rep = 4 * e * s * b * h + (2 * s * b * h if m.hidden_dropout > 0 else 0)
    mlp = (3 if m.activation == "swiglu" else 2) * e * s * b * f
    split = e * s * b * (2 * h + 2 * kv) + mlp
    per_score = e + (1 + e if m.attention_dropout > 0 else 0)
    scores = per_score * m.heads * s * s * b if mg.backend in ("local", "unfused") else 0
    rep_t = t if mg.sequence_parallel else 1
    full = rep / rep_t + (split + scores) / t
    if mg.recompute_granularity == "full":
        return e * s * b * h / rep_t, full
    if mg.recompute_granularity == "selective":
        return rep / rep_t + split / t, full
    return full, full


@dataclass(frozen=True)
class MemoryEstimate:
    """GPU memory of one rank of the stage that needs the most, in bytes (see the module docstring)."""

    stage: int
    params: int
    weights: float
    grads: float
    optimizer: float
    activations: float
    logits: float
    overhead: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.logits + self.overhead

    def summary(self) -> str:
        """One line: ``total = weights + ... (GB)``."""
        return (f"{self.total / GB:.1f} GB = weights {self.weights / GB:.1f} + gradients {self.grads / GB:.1f} + "
                f"optimizer shard {self.optimizer / GB:.1f} + activations {self.activations / GB:.1f} + logits "
                f"{self.logits / GB:.1f} + overhead {self.overhead / GB:.1f} (pipeline stage {self.stage}, "
                f"{self.params / 1e9:.2f} B parameters per rank)")


def estimate_gpu_memory(cfg, dp: int) -> MemoryEstimate:
    """The estimate for job config ``cfg`` with data-parallel size ``dp``: the stage whose total is largest."""
    m, p, t = cfg.model, cfg.parallelism, cfg.training
    e = _BYTES[m.dtype]
    n_micro = max(1, t.global_batch_size // (t.micro_batch_size * dp))
    kept, full = layer_activation_bytes(cfg)
    per = m.layers // p.pp
    best: MemoryEstimate | None = None
    for stage in range(p.pp):
        n = stage_params(m, p.pp, stage, p.tp)
        in_flight = min(p.pp - stage, n_micro)
        acts = kept * per * in_flight + (full if cfg.megatron.recompute_granularity == "full" else 0.0)
        logits = 2 * 4 * m.seq_length * t.micro_batch_size * m.vocab_size / p.tp if stage == p.pp - 1 else 0.0
        est = MemoryEstimate(stage=stage, params=n, weights=n * e, grads=n * 4.0, optimizer=12.0 * n / dp,
                             activations=acts, logits=logits, overhead=OVERHEAD_BYTES)
        if best is None or est.total > best.total:
            best = est
    assert best is not None
    return best


def memory_advice(cfg) -> str:
    """What to change to need less memory, from the options not yet at their most frugal setting."""
    mg, out = cfg.megatron, []
    if mg.recompute_granularity != "full":
        out.append("megatron.recompute_granularity: full")
    if cfg.parallelism.tp > 1 and not mg.sequence_parallel:
        out.append("megatron.sequence_parallel: true")
    if mg.backend in ("local", "unfused"):
        out.append("megatron.transformer_impl: transformer_engine with attention_backend flash or fused")
    if cfg.training.micro_batch_size > 1:
        out.append("a smaller training.micro_batch_size")
    out.append("a larger parallelism.tp or parallelism.pp")
    return "; ".join(out)
