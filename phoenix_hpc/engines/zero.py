"""ZeRO-1 style sharded AdamW over one DP group, on a flat fp32 buffer.

Layout (Rajbhandari et al., "ZeRO", 2020, stage 1): the model chunk's parameters, in ``named_parameters``
order, are laid end to end in one flat vector of ``numel`` elements, padded with zeros to
``padded = ceil(numel / dp) * dp``, and cut into ``dp`` contiguous slices of ``shard_len = padded / dp``.
DP rank ``d`` owns slice ``[d * shard_len, (d + 1) * shard_len)`` and keeps, for it only, three fp32
1-D tensors of ``shard_len`` elements: the main parameters, ``exp_avg`` and ``exp_avg_sq``
(``3 * 4 * shard_len`` bytes). Every DP rank keeps the full model parameters in the model dtype.

Per step: the flat fp32 gradient is summed over the DP group and divided by ``dp`` (reduce-scatter on NCCL;
on gloo an all-reduce followed by taking the own slice, since reduce-scatter on gloo is missing from older
torch versions) -> AdamW on the slice (decoupled weight decay, Loshchilov & Hutter 2019, as
``torch.optim.AdamW``; decay only on parameters with >= 2 dimensions) -> all-gather of the updated slices
cast to the model dtype -> copy into the parameters. So parameters are bit-identical on all DP peers.

Logical names of the shard (docs/design.md section 2): for each parameter that intersects the slice,
``{prefix}/{param}/main``, ``.../exp_avg``, ``.../exp_avg_sq`` -- 1-D fp32 views (live storage) of the part
of the slice that belongs to that parameter. :meth:`ShardedAdamW.pieces` says which elements of the
parameter each view covers. Across the DP ranks these pieces cover every element of every parameter
exactly once (the padding belongs to no parameter and has no name).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

KINDS = ("main", "exp_avg", "exp_avg_sq")


@dataclass(frozen=True)
class Piece:
    """The part of parameter ``name`` in a DP rank's slice: parameter elements
    ``[param_offset, param_offset + length)`` (flattened) sit at ``[shard_offset, shard_offset + length)``
    of the slice."""

    name: str
    param_offset: int
    shard_offset: int
    length: int


def flat_pieces(sizes: list[tuple[str, int]], dp_rank: int, dp_size: int) -> tuple[int, list[Piece]]:
    """Pure layout maths: ``(shard_len, pieces of dp_rank)`` for parameters of ``sizes`` ((name, numel)
    in order) split over ``dp_size`` ranks."""
    numel = sum(n for _, n in sizes)
    shard_len = -(-numel // dp_size) if numel else 0
    lo, hi = dp_rank * shard_len, (dp_rank + 1) * shard_len
    pieces, off = [], 0
    for name, n in sizes:
        a, b = max(off, lo), min(off + n, hi)
        if a < b:
            pieces.append(Piece(name, a - off, a - lo, b - a))
        off += n
    return shard_len, pieces


class ShardedAdamW:
    """AdamW over the rank's 1/dp slice of the flat fp32 parameters.

    Args:
        named_params: the model chunk's ``(name, parameter)`` pairs in a fixed order.
        dp_rank, dp_size: this rank's index in its DP group and the group's size.
        betas, eps, weight_decay: AdamW hyper-parameters.
    """

    def __init__(
        self,
        named_params: list[tuple[str, nn.Parameter]],
        dp_rank: int,
        dp_size: int,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ):
        self.named_params = list(named_params)
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.betas, self.eps, self.weight_decay = betas, eps, weight_decay
        self.numel = sum(p.numel() for _, p in self.named_params)
        self.shard_len, self.pieces = flat_pieces([(n, p.numel()) for n, p in self.named_params], dp_rank, dp_size)
        self.padded = self.shard_len * dp_size
        device = self.named_params[0][1].device
        self.model_dtype = self.named_params[0][1].dtype
        self.lo = dp_rank * self.shard_len
        f32 = dict(dtype=torch.float32, device=device)
        self.main = torch.zeros(self.shard_len, **f32)
        self.exp_avg = torch.zeros(self.shard_len, **f32)
        self.exp_avg_sq = torch.zeros(self.shard_len, **f32)
        self.grad = torch.zeros(self.shard_len, **f32)
        self.wd_mask = torch.zeros(self.shard_len, **f32)
        by_name = dict(self.named_params)
        for pc in self.pieces:
            p = by_name[pc.name]
            sl = slice(pc.shard_offset, pc.shard_offset + pc.length)
            self.main[sl] = p.detach().reshape(-1)[pc.param_offset : pc.param_offset + pc.length].float()
            if p.dim() >= 2:
                self.wd_mask[sl] = 1.0

    # --- naming --------------------------------------------------------------------------------------
    def named_state(self, prefix: str) -> list[tuple[str, torch.Tensor]]:
        """``(f"{prefix}/{param}/{kind}", view)`` for every piece and kind in KINDS (live fp32 1-D views)."""
        out = []
        for pc in self.pieces:
            sl = slice(pc.shard_offset, pc.shard_offset + pc.length)
            for kind in KINDS:
                out.append((f"{prefix}/{pc.name}/{kind}", getattr(self, kind)[sl]))
        return out

    # --- the step --------------------------------------------------------------------------------------
    def reduce_gradients(self, group) -> None:
        """Average the chunk's gradients over ``group`` (the DP group) into ``self.grad`` (fp32, the own
        slice). Parameters without a gradient count as zero."""
        flat = torch.zeros(self.padded, dtype=torch.float32, device=self.main.device)
        off = 0
        for _, p in self.named_params:
            n = p.numel()
            if p.grad is not None:
                flat[off : off + n] = p.grad.reshape(-1).float()
            off += n
        if self.dp_size > 1:
            if dist.get_backend(group) == "nccl":
                dist.reduce_scatter_tensor(self.grad, flat, op=dist.ReduceOp.SUM, group=group)
            else:
                dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
                self.grad.copy_(flat[self.lo : self.lo + self.shard_len])
            self.grad.div_(self.dp_size)
        else:
            self.grad.copy_(flat[: self.shard_len])

    def grad_sq_sum(self) -> torch.Tensor:
        """Sum of squares of the own gradient slice, fp64 scalar (for the global grad-norm clip)."""
        return self.grad.double().pow(2).sum()

    @torch.no_grad()
    def step(self, lr: float, step: int, grad_scale: float = 1.0) -> None:
        """One AdamW update of the slice with learning rate ``lr``; ``step`` (>= 1) is the bias-correction
        step; the gradient is first multiplied by ``grad_scale`` (grad-norm clipping)."""
        b1, b2 = self.betas
        g = self.grad if grad_scale == 1.0 else self.grad * grad_scale
        if self.weight_decay:
            self.main.mul_(1.0 - lr * self.weight_decay * self.wd_mask)
        self.exp_avg.lerp_(g, 1.0 - b1)
        self.exp_avg_sq.mul_(b2).addcmul_(g, g, value=1.0 - b2)
        bc1, bc2 = 1.0 - b1**step, 1.0 - b2**step
        denom = (self.exp_avg_sq.sqrt() / math.sqrt(bc2)).add_(self.eps)
        self.main.addcdiv_(self.exp_avg, denom, value=-lr / bc1)

    @torch.no_grad()
    def gather_params(self, group) -> None:
        """All-gather the updated slices (cast to the model dtype) over ``group`` and copy them into the
        parameters, so that every DP peer holds identical parameters."""
        flat = torch.empty(self.padded, dtype=self.model_dtype, device=self.main.device)
        own = self.main.to(self.model_dtype)
        if self.dp_size > 1:
            dist.all_gather(list(flat.chunk(self.dp_size)), own, group=group)
        else:
            flat.copy_(own)
        off = 0
        for _, p in self.named_params:
            n = p.numel()
            p.copy_(flat[off : off + n].view_as(p))
            off += n

    # --- re-partition (a shrink, docs/design.md section 6) ---------------------------------------------
    @torch.no_grad()
    def load_resharded(self, old: dict[str, torch.Tensor], old_dp: int, prefix_of) -> None:
        """Fill this rank's slice (``main``, ``exp_avg``, ``exp_avg_sq``) from slices of the same flat vector
        cut over ``old_dp`` ranks: ``old`` maps ``f"{prefix_of(d)}/{param}/{kind}"`` to the 1-D fp32 tensor
        of that old piece (:meth:`named_state` of old DP index ``d``); only the old slices that intersect
        this rank's slice are needed (:func:`phoenix_hpc.recovery.shrink.overlapping`).

        Raises:
            ValueError: a needed old piece is missing or has the wrong length, or the old pieces do not cover
                every element of this rank's slice exactly once.
        """
        sizes = [(n, p.numel()) for n, p in self.named_params]
        base, off = {}, 0
        for n, k in sizes:
            base[n] = off
            off += k
        lo, hi = self.lo, min(self.lo + self.shard_len, self.numel)
        covered = torch.zeros(self.shard_len, dtype=torch.int32)
        old_len = -(-self.numel // old_dp) if self.numel else 0
        for d in range(old_dp):
            if old_len == 0 or (d + 1) * old_len <= lo or d * old_len >= hi:
                continue
            _, pieces = flat_pieces(sizes, d, old_dp)
            for pc in pieces:
                g0 = base[pc.name] + pc.param_offset
                a, b = max(g0, lo), min(g0 + pc.length, hi)
                if a >= b:
                    continue
                for kind in KINDS:
                    name = f"{prefix_of(d)}/{pc.name}/{kind}"
                    src = old.get(name)
                    if src is None or src.numel() != pc.length:
                        raise ValueError(f"re-partition: old piece {name} is "
                                         f"{'missing' if src is None else f'{src.numel()} elements, expected {pc.length}'}")
                    getattr(self, kind)[a - lo : b - lo] = src[a - g0 : b - g0].to(self.main.device)
                covered[a - lo : b - lo] += 1
        if hi > lo and not bool((covered[: hi - lo] == 1).all()):
            bad = int((covered[: hi - lo] != 1).nonzero()[0])
            raise ValueError(f"re-partition: element {lo + bad} of the flat vector is covered "
                             f"{int(covered[bad])} times by the old slices (expected once)")
