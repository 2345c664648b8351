"""A Llama-style decoder, split into pipeline stages, built by :func:`build_stage` for phoenix_hpc.

Architecture (Touvron et al., "LLaMA", 2023, section 2.2): token embedding; ``layers`` pre-norm blocks, each
``x + attn(rmsnorm(x))`` then ``x + swiglu(rmsnorm(x))``; causal multi-head attention with rotary position
embeddings (Su et al., "RoFormer", 2021, eq. 34) on queries and keys; RMSNorm (Zhang & Sennrich, 2019) with a
learned gain; SwiGLU feed-forward ``w2(silu(w1 x) * w3 x)`` (Shazeer, "GLU Variants", 2020); no biases; a final
RMSNorm and an untied output head. No dropout: the forward pass draws no random numbers.

Stages: with ``num_stages`` stages, stage ``s`` holds blocks ``[s*L/n, (s+1)*L/n)``; stage 0 also the
embedding, the last stage the final norm and the head. Tensors: tokens ``(B, S)`` int64 into stage 0;
hidden states ``(B, S, hidden_size)`` between stages; logits ``(B, S, vocab_size)`` out of the last stage.
Initialisation draws from generators seeded by ``(seed, owner)``, so a model built as 1 or 2 stages starts
from the same weights.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * gain`` over the last dimension (computed in fp32)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.gain = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.gain


def rotary_tables(seq_length: int, head_dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables ``(seq_length, head_dim / 2)`` fp32 for rotary embeddings (RoFormer eq. 34)."""
    inv = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    ang = torch.outer(torch.arange(seq_length, dtype=torch.float32), inv)
    return ang.cos(), ang.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (even, odd) of ``x`` ``(B, heads, S, head_dim)`` by the position angles."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    c, s = cos[: x.shape[-2]].to(x.dtype), sin[: x.shape[-2]].to(x.dtype)
    return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)


class Block(nn.Module):
    """Pre-norm decoder block: rotary causal attention, then a SwiGLU feed-forward, each with a residual."""

    def __init__(self, hidden: int, heads: int, ffn: int, seq_length: int):
        super().__init__()
        self.heads = heads
        self.attn_norm = RMSNorm(hidden)
        self.wqkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.wo = nn.Linear(hidden, hidden, bias=False)
        self.ffn_norm = RMSNorm(hidden)
        self.w1 = nn.Linear(hidden, ffn, bias=False)
        self.w3 = nn.Linear(hidden, ffn, bias=False)
        self.w2 = nn.Linear(ffn, hidden, bias=False)
        cos, sin = rotary_tables(seq_length, hidden // heads)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.wqkv(self.attn_norm(x)).split(h, dim=-1)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        q, k = apply_rotary(q, self.cos, self.sin), apply_rotary(k, self.cos, self.sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(a.transpose(1, 2).reshape(b, s, h))
        y = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(y)) * self.w3(y))


class LlamaStage(nn.Module):
    """The part of the decoder that pipeline stage ``stage`` of ``num_stages`` holds (see the module doc)."""

    def __init__(self, *, stage: int, num_stages: int, seed: int, layers: int, hidden_size: int, heads: int,
                 ffn_hidden_size: int, vocab_size: int, seq_length: int):
        super().__init__()
        if layers % num_stages:
            raise ValueError(f"options.layers ({layers}) must be divisible by the number of stages ({num_stages})")
        if hidden_size % heads or (hidden_size // heads) % 2:
            raise ValueError(f"options.hidden_size ({hidden_size}) / heads ({heads}) must be an even integer")
        per = layers // num_stages
        self.layers = layers
        self.is_first, self.is_last = stage == 0, stage == num_stages - 1
        self.layer_ids = list(range(stage * per, (stage + 1) * per))
        if self.is_first:
            self.embed = nn.Embedding(vocab_size, hidden_size)
        self.blocks = nn.ModuleDict({str(i): Block(hidden_size, heads, ffn_hidden_size, seq_length)
                                     for i in self.layer_ids})
        if self.is_last:
            self.norm = RMSNorm(hidden_size)
            self.head = nn.Linear(hidden_size, vocab_size, bias=False)
        self._init(seed)

    @torch.no_grad()
    def _init(self, seed: int) -> None:
        std, out_std = 0.02, 0.02 / math.sqrt(2 * self.layers)

        def gen(owner: int) -> torch.Generator:
            return torch.Generator().manual_seed(seed * 100_003 + owner)

        if self.is_first:
            self.embed.weight.normal_(0.0, std, generator=gen(0))
        for i in self.layer_ids:
            blk, g = self.blocks[str(i)], gen(1 + i)
            for lin, s in ((blk.wqkv, std), (blk.wo, out_std), (blk.w1, std), (blk.w3, std), (blk.w2, out_std)):
                lin.weight.normal_(0.0, s, generator=g)
        if self.is_last:
            self.head.weight.normal_(0.0, std, generator=gen(1 + self.layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.is_first:
            x = self.embed(x)
        for i in self.layer_ids:
            x = self.blocks[str(i)](x)
        if self.is_last:
            x = self.head(self.norm(x))
        return x


def build_stage(*, stage: int, num_stages: int, seed: int, options: dict) -> nn.Module:
    """phoenix_hpc's ``model.factory``: the module of pipeline ``stage`` of ``num_stages``.

    ``options`` (``model.options`` of the job config): ``layers``, ``hidden_size`` (must equal
    ``model.hidden_size``: the shape crossing stage boundaries), ``heads``, ``ffn_hidden_size``,
    ``vocab_size`` and ``seq_length`` (equal to ``model.vocab_size`` / ``model.seq_length``).

    Raises:
        ValueError: ``layers`` not divisible by ``num_stages``, or an odd head dimension.
        KeyError: an option is missing.
    """
    keys = ("layers", "hidden_size", "heads", "ffn_hidden_size", "vocab_size", "seq_length")
    return LlamaStage(stage=stage, num_stages=num_stages, seed=seed, **{k: int(options[k]) for k in keys})
