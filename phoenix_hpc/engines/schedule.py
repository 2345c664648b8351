"""Learning-rate schedule: a pure function of the step.

``lr_at(step)`` is the rate used by the update that produces S(step) (``step`` >= 1):

* warm-up (``step <= warmup_steps``): ``lr * step / warmup_steps`` (linear, as in Megatron-LM);
* then, with ``t = (step - warmup) / max(1, steps - warmup)`` clamped to [0, 1]:
  ``constant``: ``lr``; ``linear``: ``lr - (lr - min_lr) * t``;
  ``cosine``: ``min_lr + (lr - min_lr) * (1 + cos(pi * t)) / 2`` (Loshchilov & Hutter, SGDR, eq. 5).

Because it is pure, the scheduler's whole state is the step counter (kept in the metadata envelope).
"""

from __future__ import annotations

import math


def lr_at(step: int, *, lr: float, min_lr: float, schedule: str, warmup_steps: int, total_steps: int) -> float:
    """Learning rate for the update of step ``step`` (1-based). Raises ValueError on an unknown schedule."""
    if warmup_steps > 0 and step <= warmup_steps:
        return lr * step / warmup_steps
    t = min(1.0, max(0.0, (step - warmup_steps) / max(1, total_steps - warmup_steps)))
    if schedule == "constant":
        return lr
    if schedule == "linear":
        return lr - (lr - min_lr) * t
    if schedule == "cosine":
        return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * t))
    raise ValueError(f"unknown lr schedule {schedule!r} (allowed: constant, linear, cosine)")
