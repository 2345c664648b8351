"""A GPT-style decoder in plain PyTorch, built as one pipeline stage's chunk.

Architecture (GPT-2, Radford et al. 2019): learned token + position embeddings, ``layers`` pre-LayerNorm
blocks (causal multi-head self-attention, then a 4x GELU MLP, each with a residual), a final LayerNorm and
an untied output head. Dropout as Megatron-LM places it (``attention_dropout`` on the attention probabilities,
``hidden_dropout`` on the embeddings' output and on each residual branch before its add), 0 by default.

Dropout draws its masks from a seed that is a pure function of ``(training seed, global sample position of
the micro-batch, pipeline stage)`` (:meth:`GPTStage.begin_step`, :func:`dropout_seed`): each micro-batch's
forward runs under torch's global generator set to that seed and restored afterwards
(``torch.random.fork_rng``). So a replayed step draws the same masks, in any process, after any recovery,
and a micro-batch draws the same masks whichever DP rank reads it (a shrink moves micro-batches between
ranks); there is no random state to restore. With both at 0 the forward pass uses no random numbers.

Pipeline split: with ``pp`` stages, stage ``p`` holds blocks ``[p*L/pp, (p+1)*L/pp)``; stage 0 also holds the
embeddings, the last stage the final LayerNorm and the head. The head is untied from the token embedding
because tying across stages would need an extra all-reduce of the shared weight between first and last
stage. Parameter names are global (``blocks.{layer}.…`` uses the layer index in the whole model), so a
parameter has the same name whatever the pp split.

Initialisation is a pure function of ``(seed, parameter's owner)``: every block draws from its own
``torch.Generator`` seeded from ``(seed, layer)``, so a model built as 1 or 2 stages starts from the same
weights, and every DP replica of a stage starts identical. Weights ~ N(0, std), std = ``model.init_method_std``
(0.02 by default, Megatron-LM's ``--init-method-std``); the residual output projections ~ N(0, std / sqrt(2 L))
(GPT-2 paper, section 2.3; Megatron-LM's scaled init, ``scaled_init_method_normal``); LayerNorm weight 1, biases 0.

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
    """Model shape. ``hidden_size`` must be divisible by ``heads``. ``init_method_std``: the standard deviation
    of the weights' normal initialisation (``model.init_method_std``; module doc)."""

    layers: int
    hidden_size: int
    heads: int
    vocab_size: int
    seq_length: int
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0
    init_method_std: float = 0.02

    @property
    def has_dropout(self) -> bool:
        return self.attention_dropout > 0 or self.hidden_dropout > 0


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


class Block(nn.Module):
    """Pre-LN transformer block: ``x + attn(ln1(x))`` then ``x + mlp(ln2(x))``."""

    def __init__(self, shape: GPTShape):
        super().__init__()
        h = shape.hidden_size
        self.heads = shape.heads
        self.attn_p, self.hidden_p = shape.attention_dropout, shape.hidden_dropout
        self.ln1 = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h)
        self.fc = nn.Linear(h, 4 * h)
        self.fc_out = nn.Linear(4 * h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=-1)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.attn_p if self.training else 0.0)
        x = x + F.dropout(self.proj(a.transpose(1, 2).reshape(b, s, h)), self.hidden_p, self.training)
        return x + F.dropout(self.fc_out(F.gelu(self.fc(self.ln2(x)))), self.hidden_p, self.training)


class GPTStage(nn.Module):
    """The chunk of the GPT model held by one pipeline stage.

    ``forward`` takes tokens ``(B, S)`` int64 on the first stage, hidden states ``(B, S, H)`` otherwise, and
    returns hidden states, or logits ``(B, S, V)`` on the last stage.
    """

    def __init__(self, shape: GPTShape, pp: int, stage: int, seed: int, dtype: torch.dtype = torch.float32,
                 init: bool = True):
        super().__init__()
        if shape.hidden_size % shape.heads:
            raise ValueError(f"hidden_size ({shape.hidden_size}) must be divisible by heads ({shape.heads})")
        self.shape = shape
        self.stage = stage
        self._draws: tuple[int, int, int] | None = None  # (seed, first position, micro-batch size): begin_step
        self._micro = 0
        self.is_first = stage == 0
        self.is_last = stage == pp - 1
        self.layer_ids = list(stage_layers(shape.layers, pp, stage))
        if self.is_first:
            self.tok_embed = nn.Embedding(shape.vocab_size, shape.hidden_size)
            self.pos_embed = nn.Embedding(shape.seq_length, shape.hidden_size)
        self.blocks = nn.ModuleDict({str(i): Block(shape) for i in self.layer_ids})
        if self.is_last:
            self.ln_f = nn.LayerNorm(shape.hidden_size)
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
            self.pos_embed.weight.normal_(0.0, std, generator=g)
        for i in self.layer_ids:
            blk, g = self.blocks[str(i)], gen(1 + i)
            for lin, s in ((blk.qkv, std), (blk.proj, proj_std), (blk.fc, std), (blk.fc_out, proj_std)):
                lin.weight.normal_(0.0, s, generator=g)
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
            pos = torch.arange(x.shape[1], device=x.device)
            x = F.dropout(self.tok_embed(x) + self.pos_embed(pos), self.shape.hidden_dropout, self.training)
        for i in self.layer_ids:
            x = self.blocks[str(i)](x)
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
