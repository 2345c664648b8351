"""Learning-rate schedule: a pure function of the step.

``lr_at(step)`` is the rate used by the update that produces S(step) (``step`` >= 1). As Megatron-LM's
``OptimizerParamScheduler.get_lr`` (megatron-core's ``optimizer_param_scheduler.py``), with ``decay`` the decay
length counted from step 0, warm-up included (``training.lr_decay_steps``, Megatron-LM's ``--lr-decay-iters``;
``training.steps`` when unset):

* warm-up (``step <= warmup_steps``): ``lr * step / warmup_steps`` (linear, from 0);
* then, with ``t = (step - warmup) / max(1, decay - warmup)`` clamped to [0, 1] (so ``min_lr`` after ``decay``):
  ``constant``: ``lr``; ``linear``: ``lr - (lr - min_lr) * t``;
  ``cosine``: ``min_lr + (lr - min_lr) * (1 + cos(pi * t)) / 2`` (Loshchilov & Hutter, SGDR, eq. 5).

With ``training.train_samples`` (Megatron-LM's ``--train-samples``) the schedule counts samples, as Megatron-LM's
scheduler always does (``megatron/training/training.py`` steps it by the global batch size ``G`` after every
iteration): the update that produces S(step) uses the rate at ``step x G`` samples, the warm-up is
``training.lr_warmup_samples`` samples and the decay ``training.decay_samples`` (``--lr-decay-samples``, else
``--train-samples``) in the formulas above, so a warm-up or decay that is not a whole number of steps ends within
a step, as in Megatron-LM. ``lr_at`` is the same function in either unit.

Because it is pure, the scheduler's whole state is the step counter (kept in the metadata envelope).
"""

from __future__ import annotations

import math


def lr_at(step: int, *, lr: float, min_lr: float, schedule: str, warmup_steps: int, total_steps: int,
          decay_steps: int | None = None) -> float:
    """Learning rate for the update of step ``step`` (1-based). ``total_steps``: the run's steps
    (``training.steps``); ``decay_steps``: the decay length from step 0, warm-up included
    (``training.decay_steps``); None: ``total_steps``. Every length may be in samples instead of steps (``step``
    then the samples consumed after the update: :func:`lr_for` with ``training.train_samples``), all in one unit.
    Raises ValueError on an unknown schedule."""
    decay = total_steps if decay_steps is None else decay_steps
    if warmup_steps > 0 and step <= warmup_steps:
        return lr * step / warmup_steps
    t = min(1.0, max(0.0, (step - warmup_steps) / max(1, decay - warmup_steps)))
    if schedule == "constant":
        return lr
    if schedule == "linear":
        return lr - (lr - min_lr) * t
    if schedule == "cosine":
        return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * t))
    raise ValueError(f"unknown lr schedule {schedule!r} (allowed: constant, linear, cosine)")


def lr_for(training, step: int) -> float:
    """:func:`lr_at` with the job's ``training`` section (``TrainingConfig``): the rate of the update that
    produces S(``step``), decaying over ``training.decay_steps``; with ``training.train_samples``, the rate at
    ``step x global_batch_size`` samples of a warm-up of ``lr_warmup_samples`` and a decay of ``decay_samples``
    samples (module doc). Raises ValueError on an unknown schedule."""
    t = training
    if t.train_samples is not None:
        return lr_at(step * t.global_batch_size, lr=t.lr, min_lr=t.min_lr, schedule=t.lr_schedule,
                     warmup_steps=t.lr_warmup_samples or 0, total_steps=t.train_samples, decay_steps=t.decay_samples)
    return lr_at(step, lr=t.lr, min_lr=t.min_lr, schedule=t.lr_schedule, warmup_steps=t.warmup_steps,
                 total_steps=t.steps, decay_steps=t.decay_steps)


def scheduler_record(training, step: int, last_lr: float | None) -> dict:
    """The ``lr_scheduler`` entry of an engine's metadata envelope: the schedule as the job's ``training``
    section gives it, the step reached (``last_step``) and the rate its update used (``last_lr``). A record
    of what ran (the schedule itself is :func:`lr_for` of the config, not read back from it); a run counted in
    samples adds ``train_samples``, ``warmup_samples`` and ``decay_samples``, the lengths the rate was taken
    from, so a step-counted record is what it always was."""
    t = training
    out = {"kind": t.lr_schedule, "lr": t.lr, "min_lr": t.min_lr, "warmup_steps": t.warmup_steps,
           "total_steps": t.steps, "decay_steps": t.decay_steps, "last_step": step, "last_lr": last_lr}
    if t.train_samples is not None:
        out.update(train_samples=t.train_samples, warmup_samples=t.lr_warmup_samples or 0,
                   decay_samples=t.decay_samples)
    return out
