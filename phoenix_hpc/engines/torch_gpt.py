"""A GPT-style decoder in plain PyTorch, built as one pipeline stage's chunk.

Architecture by default (GPT-2, Radford et al. 2019): learned token + position embeddings, ``layers``
pre-LayerNorm blocks (causal multi-head self-attention, then a 4x GELU MLP, each with a residual), a final
LayerNorm and an untied output head. Dropout as Megatron-LM places it (``attention_dropout`` on the attention
probabilities, ``hidden_dropout`` on the embeddings' output and on each residual branch before its add), 0 by
default.

Llama-shaped options (:class:`GPTShape`; the ``model`` fields of the same names), each with the semantics of
megatron-core's ``GPTModel`` for that setting (megatron-core 0.16, read from its source):

- ``position_embedding_type="rope"``: no position embedding; rotary embeddings (Su et al. 2021, RoFormer,
  eq. 34) on the queries and keys of every layer, the non-interleaved "rotate half" form of megatron-core's
  ``RotaryEmbedding`` / ``apply_rotary_pos_emb`` with ``rotary_percent`` 1: for position ``m`` and
  ``j < d/2`` (``d`` the head dimension) the pair ``(x_j, x_{j+d/2})`` is rotated by the angle
  ``m * theta_j``, ``theta_j = rotary_base ** (-2j / d)`` (:func:`rope_tables`, :func:`apply_rope`);
- ``num_query_groups`` g < heads: grouped-query attention (Ainslie et al. 2023): g key/value heads, query
  head ``i`` reads key/value head ``i // (heads / g)`` (megatron-core's ``Attention`` with
  ``num_query_groups``);
- ``ffn_hidden_size``: the MLP's inner size f (default ``4 x hidden_size``);
- ``activation="swiglu"``: gated linear unit (Shazeer 2020, "GLU Variants Improve Transformer", FFN_SwiGLU):
  the first linear gives ``2 f`` features ``[gate, up]`` concatenated in that order, the MLP applies
  ``silu(gate) * up`` (megatron-core's ``MLP`` with ``gated_linear_unit``, activation ``silu``);
- ``normalization="RMSNorm"``: ``torch.nn.RMSNorm`` (Zhang & Sennrich 2019) with epsilon 1e-5 (megatron-core's
  default ``layernorm_epsilon``; LayerNorm uses the same epsilon) and a weight only;
- ``add_bias_linear=False``: no bias in the attention's and the MLP's linear layers (the norms keep theirs:
  a LayerNorm still has a bias, an RMSNorm never has one).

The fused query/key/value weight keeps this module's own layout ``[all query heads | key heads | value
heads]`` (rows ``hidden + 2 g d``), not megatron-core's per-group interleaving; the two are a permutation of
rows of each other, the same function.

Dropout draws its masks from a seed that is a pure function of ``(training seed, global sample position of
the micro-batch, pipeline stage)`` (:meth:`GPTStage.begin_step`, :func:`dropout_seed`): each micro-batch's
forward runs under torch's global generator set to that seed and restored afterwards
(``torch.random.fork_rng``). So a replayed step draws the same masks, in any process, after any recovery,
and a micro-batch draws the same masks whichever DP rank reads it (a shrink moves micro-batches between
ranks); there is no random state to restore. With both at 0 the forward pass uses no random numbers.

Pipeline split: with ``pp`` stages, stage ``p`` holds blocks ``[p*L/pp, (p+1)*L/pp)``; stage 0 also holds the
embeddings, the last stage the final norm and the head. The head is untied from the token embedding
because tying across stages would need an extra all-reduce of the shared weight between first and last
stage. Parameter names are global (``blocks.{layer}.…`` uses the layer index in the whole model), so a
parameter has the same name whatever the pp split.

Initialisation is a pure function of ``(seed, parameter's owner)``: every block draws from its own
``torch.Generator`` seeded from ``(seed, layer)``, so a model built as 1 or 2 stages starts from the same
weights, and every DP replica of a stage starts identical. Weights ~ N(0, std), std = ``model.init_method_std``
(0.02 by default, Megatron-LM's ``--init-method-std``); the residual output projections ~ N(0, std / sqrt(2 L))
(GPT-2 paper, section 2.3; Megatron-LM's scaled init, ``scaled_init_method_normal``); LayerNorm and RMSNorm
weight 1, biases 0. A block draws its weights in the order query/key/value, attention projection, first MLP
linear, second MLP linear, whatever their shapes; the embeddings draw token then (when learned) position.

Shapes: tokens ``(B, S)`` int64; hidden states ``(B, S, H)`` in the model dtype; logits ``(B, S, V)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTShape:
    """Model shape. ``hidden_size`` must be divisible by ``heads``, ``heads`` by ``num_query_groups``.
    ``init_method_std``: the standard deviation of the weights' normal initialisation (``model.init_method_std``;
    module doc). The fields after it are the ``model`` fields of the same names (module doc); their defaults
    are GPT-2's: ``ffn_hidden_size`` None is ``4 x hidden_size``, ``num_query_groups`` None is ``heads``."""

    layers: int
    hidden_size: int
    heads: int
    vocab_size: int
    seq_length: int
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0
    init_method_std: float = 0.02
    ffn_hidden_size: int | None = None
    num_query_groups: int | None = None
    position_embedding_type: str = "learned_absolute"
    rotary_base: int = 10000
    activation: str = "gelu"
    normalization: str = "LayerNorm"
    add_bias_linear: bool = True

    @property
    def has_dropout(self) -> bool:
        return self.attention_dropout > 0 or self.hidden_dropout > 0

    @property
    def ffn_size(self) -> int:
        """The MLP's inner size f: ``ffn_hidden_size``, or ``4 x hidden_size`` when None."""
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def query_groups(self) -> int:
        """Key/value heads: ``num_query_groups``, or ``heads`` when None (multi-head attention)."""
        return self.num_query_groups or self.heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.heads

    def problems(self) -> list[str]:
        """What makes this shape unbuildable (empty: buildable)."""
        out = []
        if self.hidden_size % self.heads:
            out.append(f"hidden_size ({self.hidden_size}) must be divisible by heads ({self.heads})")
        elif self.heads % self.query_groups:
            out.append(f"num_query_groups ({self.query_groups}) must divide heads ({self.heads})")
        elif self.position_embedding_type == "rope" and self.head_dim % 2:
            out.append(f"rope needs an even head dimension (hidden_size / heads = {self.head_dim})")
        for name, allowed in (("position_embedding_type", ("learned_absolute", "rope")),
                              ("activation", ("gelu", "swiglu")), ("normalization", ("LayerNorm", "RMSNorm"))):
            if getattr(self, name) not in allowed:
                out.append(f"{name} {getattr(self, name)!r} is not one of {allowed}")
        return out


def dropout_seed(seed: int, position: int, stage: int) -> int:
    """The seed of the dropout masks of the micro-batch whose first sample is at global ``position``, on
    pipeline ``stage``: 63 bits of numpy's ``SeedSequence([seed, position, stage])`` (a hash of the three)."""
    import numpy as np

    return int(np.random.SeedSequence([int(seed), int(position), int(stage)]).generate_state(1, np.uint64)[0] >> 1)


def stage_layers(layers: int, pp: int, stage: int) -> range:
    """Global indices of the blocks held by pipeline ``stage`` (``layers`` divisible by ``pp``)."""
    if layers % pp:
        raise ValueError(f"layers ({layers}) must be divisible by pp ({pp})")
    per = layers // pp
    return range(stage * per, (stage + 1) * per)


#: epsilon of the norms: torch.nn.LayerNorm's default and megatron-core's default ``layernorm_epsilon``
NORM_EPS = 1e-5


def _norm(shape: GPTShape) -> nn.Module:
    if shape.normalization == "RMSNorm":
        return nn.RMSNorm(shape.hidden_size, eps=NORM_EPS)
    return nn.LayerNorm(shape.hidden_size)  # eps 1e-5 by default


def rope_tables(seq: int, head_dim: int, base: float, dtype: torch.dtype,
                device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` of the rotary angles, each ``(seq, head_dim)`` in ``dtype``, computed in fp32 and then
    cast, as megatron-core does: ``theta_j = base ** (-2j / head_dim)`` for ``j < head_dim / 2``; the angle of
    position ``m`` is ``m * theta_j`` in columns ``j`` and ``j + head_dim / 2`` (the halves repeated: the
    non-interleaved layout of megatron-core's ``RotaryEmbedding``; RoFormer, Su et al. 2021, eq. 34).
    ``head_dim`` even."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    angles = torch.outer(torch.arange(seq, dtype=torch.float32, device=device), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` over the last dimension split in halves (megatron-core's ``_rotate_half``,
    non-interleaved)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``t`` ``(..., S, head_dim)`` with :func:`rope_tables` ``(S, head_dim)``:
    ``t cos + rotate_half(t) sin``, i.e. the pair ``(t_j, t_{j+d/2})`` of position ``m`` multiplied, as the
    complex number ``t_j + i t_{j+d/2}``, by ``e^{i m theta_j}``."""
    return t * cos + rotate_half(t) * sin


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(norm1(x))`` then ``x + mlp(norm2(x))``. Attention: ``heads``
    query heads and ``query_groups`` key/value heads of dimension ``d = hidden / heads``, rotary embeddings
    on queries and keys when :meth:`forward` gets ``rope`` tables; MLP: GELU or SwiGLU (module doc)."""

    def __init__(self, shape: GPTShape):
        super().__init__()
        h, f, bias = shape.hidden_size, shape.ffn_size, shape.add_bias_linear
        self.heads, self.groups, self.head_dim = shape.heads, shape.query_groups, shape.head_dim
        self.kv = self.groups * self.head_dim
        self.swiglu = shape.activation == "swiglu"
        self.attn_p, self.hidden_p = shape.attention_dropout, shape.hidden_dropout
        self.ln1 = _norm(shape)
        self.qkv = nn.Linear(h, h + 2 * self.kv, bias=bias)
        self.proj = nn.Linear(h, h, bias=bias)
        self.ln2 = _norm(shape)
        self.fc = nn.Linear(h, 2 * f if self.swiglu else f, bias=bias)
        self.fc_out = nn.Linear(f, h, bias=bias)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """``x`` ``(B, S, H)``; ``rope``: :func:`rope_tables` for ``S`` in ``x``'s dtype, or None (no rotary)."""
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split([h, self.kv, self.kv], dim=-1)
        q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = (t.view(b, s, self.groups, self.head_dim).transpose(1, 2) for t in (k, v))
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        gqa = {"enable_gqa": True} if self.groups != self.heads else {}
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.attn_p if self.training else 0.0,
                                           **gqa)
        x = x + F.dropout(self.proj(a.transpose(1, 2).reshape(b, s, h)), self.hidden_p, self.training)
        return x + F.dropout(self.fc_out(self._act(self.fc(self.ln2(x)))), self.hidden_p, self.training)

    def _act(self, u: torch.Tensor) -> torch.Tensor:
        """GELU of ``u`` ``(B, S, f)``, or with SwiGLU ``silu(gate) * up`` of ``u = [gate, up]`` ``(B, S, 2f)``."""
        if not self.swiglu:
            return F.gelu(u)
        gate, up = u.chunk(2, dim=-1)
        return F.silu(gate) * up


class GPTStage(nn.Module):
    """The chunk of the GPT model held by one pipeline stage.

    ``forward`` takes tokens ``(B, S)`` int64 on the first stage, hidden states ``(B, S, H)`` otherwise, and
    returns hidden states, or logits ``(B, S, V)`` on the last stage.
    """

    def __init__(self, shape: GPTShape, pp: int, stage: int, seed: int, dtype: torch.dtype = torch.float32,
                 init: bool = True):
        super().__init__()
        if shape.problems():
            raise ValueError("; ".join(shape.problems()))
        self.shape = shape
        self.stage = stage
        self._draws: tuple[int, int, int] | None = None  # (seed, first position, micro-batch size): begin_step
        self._micro = 0
        self.is_first = stage == 0
        self.is_last = stage == pp - 1
        self.rope = shape.position_embedding_type == "rope"
        self.layer_ids = list(stage_layers(shape.layers, pp, stage))
        if self.is_first:
            self.tok_embed = nn.Embedding(shape.vocab_size, shape.hidden_size)
            if not self.rope:
                self.pos_embed = nn.Embedding(shape.seq_length, shape.hidden_size)
        self.blocks = nn.ModuleDict({str(i): Block(shape) for i in self.layer_ids})
        if self.is_last:
            self.ln_f = _norm(shape)
            self.head = nn.Linear(shape.hidden_size, shape.vocab_size, bias=False)
        if init:  # init=False: the caller loads every parameter (see :func:`empty_stage`)
            self._init_weights(seed)
        self.to(dtype)

    @torch.no_grad()
    def _init_weights(self, seed: int) -> None:
        std = self.shape.init_method_std
        proj_std = std / math.sqrt(2 * self.shape.layers)

        def gen(owner: int) -> torch.Generator:
            return torch.Generator().manual_seed(seed * 100_003 + owner)

        if self.is_first:
            g = gen(0)
            self.tok_embed.weight.normal_(0.0, std, generator=g)
            if not self.rope:
                self.pos_embed.weight.normal_(0.0, std, generator=g)
        for i in self.layer_ids:
            blk, g = self.blocks[str(i)], gen(1 + i)
            for lin, s in ((blk.qkv, std), (blk.proj, proj_std), (blk.fc, std), (blk.fc_out, proj_std)):
                lin.weight.normal_(0.0, s, generator=g)
                if lin.bias is not None:
                    lin.bias.zero_()
        if self.is_last:
            self.head.weight.normal_(0.0, std, generator=gen(1 + self.shape.layers))

    def begin_step(self, seed: int, first_position: int, micro_batch: int) -> None:
        """Before a step's forward passes: the ``k``-th forward of the step (micro-batches run in order on a
        stage, also under the pipeline schedule) is the micro-batch at ``first_position + k x micro_batch``,
        whose dropout masks are drawn from :func:`dropout_seed`. Needed only with dropout."""
        self._draws = (int(seed), int(first_position), int(micro_batch))
        self._micro = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Raises RuntimeError: dropout is on, the module is in training mode and :meth:`begin_step` was not
        called (its masks would come from an unknown random state)."""
        if not (self.training and self.shape.has_dropout):
            return self._forward(x)
        if self._draws is None:
            raise RuntimeError("GPTStage with dropout: begin_step() before the step's forward passes")
        seed, first, mbs = self._draws
        s = dropout_seed(seed, first + self._micro * mbs, self.stage)
        self._micro += 1
        devices = [x.device] if x.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(s)
            return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.is_first:
            e = self.tok_embed(x)
            if not self.rope:
                e = e + self.pos_embed(torch.arange(x.shape[1], device=x.device))
            x = F.dropout(e, self.shape.hidden_dropout, self.training)
        sh = self.shape
        rope = rope_tables(x.shape[1], sh.head_dim, sh.rotary_base, x.dtype, x.device) if self.rope else None
        for i in self.layer_ids:
            x = self.blocks[str(i)](x, rope)
        if self.is_last:
            x = self.head(self.ln_f(x))
        return x


def empty_stage(shape: GPTShape, pp: int, stage: int, dtype: torch.dtype, device: torch.device) -> GPTStage:
    """A :class:`GPTStage` whose parameters are allocated on ``device`` but hold whatever the memory held
    (not even filled by the deterministic mode, :func:`phoenix_hpc.engines.alloc.no_fill`):
    built on the ``meta`` device without any initialisation, then given storage (``Module.to_empty``). For a
    stage whose every parameter is about to be loaded (a joining spare, a rebuilt member), it skips the
    random draws of construction (``nn.Linear``'s own and :meth:`GPTStage._init_weights`: about 0.2 s for
    11 M parameters on one CPU core). The stage has no buffers, so nothing else is left unset."""
    from phoenix_hpc.engines.alloc import no_fill

    with torch.device("meta"):
        module = GPTStage(shape, pp, stage, 0, dtype, init=False)
    with no_fill():  # not even the deterministic mode's fill: every parameter is loaded next
        return module.to_empty(device=device)


def load_meta_kernels() -> None:
    """Build a one-layer stage of width 8 with :func:`empty_stage` and drop it: the first construction on
    the ``meta`` device imports what torch runs it with (its meta registrations and their dependencies, about
    800 modules and 0.9 s on an idle core, unless megatron-core's import brought them in already), which a
    joining spare would otherwise pay inside a recovery (:func:`phoenix_hpc.launch.execute.import_runtime`)."""
    empty_stage(GPTShape(1, 8, 1, 16, 4), 1, 0, torch.float32, torch.device("cpu"))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (nats/token, fp32). logits ``(B, S, V)``, targets ``(B, S)`` int64."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
