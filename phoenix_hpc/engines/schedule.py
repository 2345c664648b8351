"""Learning-rate schedule: a pure function of the step, Megatron-LM's.

Megatron-LM's ``OptimizerParamScheduler`` (megatron-core's ``optimizer_param_scheduler.py``) holds a position
``num_steps`` and sets the optimizer's rate to ``get_lr`` of it: its ``__init__`` calls ``step(0)``, and
``train_step`` (``megatron/training/training.py``) runs ``optimizer.step()`` BEFORE
``opt_param_scheduler.step(increment=global batch)``. So iteration ``s`` (1-based) trains with the rate at
position ``s - 1``: iteration 1 with the rate at 0 (with a warm-up, ``lr_warmup_init``, 0), the first
iteration after a warm-up of ``w`` with the peak rate. phoenix does the same: :func:`lr_at` is ``get_lr`` at a
position, :func:`lr_for` the rate of the update that produces S(step), ``lr_at(step - 1)``.

``lr_at(n)``, with ``decay`` the decay length counted from position 0, warm-up included
(``training.lr_decay_steps``, Megatron-LM's ``--lr-decay-iters``; ``training.steps`` when unset):

* warm-up (``n <= warmup_steps``): ``lr * n / warmup_steps`` (linear, from 0: Megatron-LM's default
  ``--lr-warmup-init`` 0);
* then, with ``t = (n - warmup) / max(1, decay - warmup)`` clamped to [0, 1] (so ``min_lr`` after ``decay``):
  ``constant``: ``lr``; ``linear``: ``lr - (lr - min_lr) * t``;
  ``cosine``: ``min_lr + (lr - min_lr) * (1 + cos(pi * t)) / 2`` (Loshchilov & Hutter, SGDR, eq. 5).

Megatron-LM's scheduler always counts samples: its iteration-based training steps it by the global batch size
``G`` after every iteration, with ``lr_warmup_steps = lr_warmup_iters x G`` and ``lr_decay_steps =
lr_decay_iters x G`` (``get_optimizer_param_scheduler``); the ratios are those of the step counts, so a
step-counted phoenix schedule (position ``step - 1``) is the same rate. With ``training.train_samples``
(Megatron-LM's ``--train-samples``) the update that produces S(step) uses the rate at ``(step - 1) x G``
samples, the warm-up is ``training.lr_warmup_samples`` samples and the decay ``training.decay_samples``
(``--lr-decay-samples``, else ``--train-samples``) in the formulas above, so a warm-up or decay that is not a
whole number of steps ends within a step, as in Megatron-LM. ``lr_at`` is the same function in either unit.

Logged rate: phoenix's step record of step ``s`` carries the rate its update used (``lr_for(training, s)``).
Megatron-LM's log line of iteration ``s`` prints the optimizer's rate after the scheduler step, that is the
rate iteration ``s + 1`` will use (``lr_at(s)``); the two logs are one step apart.

Because it is pure, the scheduler's whole state is the step counter (kept in the metadata envelope).
"""

from __future__ import annotations

import math


def lr_at(position: float, *, lr: float, min_lr: float, schedule: str, warmup_steps: float, total_steps: float,
          decay_steps: float | None = None) -> float:
    """Megatron-LM's ``OptimizerParamScheduler.get_lr`` at scheduler position ``position`` (``num_steps``: the
    steps, or the samples, completed before the update; >= 0). The update that produces S(step) uses
    ``position = step - 1`` (:func:`lr_for`). ``total_steps``: the run's length (``training.steps``);
    ``decay_steps``: the decay length from position 0, warm-up included (``training.decay_steps``); None:
    ``total_steps``. Every length may be in samples instead of steps, all in one unit with ``position``.

    Raises:
        ValueError: an unknown schedule, or a negative ``position``.
    """
    if position < 0:
        raise ValueError(f"lr_at: position {position} is negative (allowed: >= 0, the steps or samples completed "
                         "before the update)")
    decay = total_steps if decay_steps is None else decay_steps
    if warmup_steps > 0 and position <= warmup_steps:
        return lr * position / warmup_steps
    t = min(1.0, max(0.0, (position - warmup_steps) / max(1, decay - warmup_steps)))
    if schedule == "constant":
        return lr
    if schedule == "linear":
        return lr - (lr - min_lr) * t
    if schedule == "cosine":
        return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * t))
    raise ValueError(f"unknown lr schedule {schedule!r} (allowed: constant, linear, cosine)")


def lr_for(training, step: int) -> float:
    """The rate of the update that produces S(``step``) (``step`` >= 1) with the job's ``training`` section
    (``TrainingConfig``): :func:`lr_at` at position ``step - 1``, decaying over ``training.decay_steps``; with
    ``training.train_samples``, at ``(step - 1) x global_batch_size`` samples of a warm-up of
    ``lr_warmup_samples`` and a decay of ``decay_samples`` samples. Megatron-LM's rate of iteration ``step``
    (module doc): step 1 of a warm-up trains at 0, step ``warmup_steps + 1`` at ``training.lr``.

    Raises:
        ValueError: an unknown schedule, or ``step`` < 1 (no update produces S(0)).
    """
    if step < 1:
        raise ValueError(f"lr_for: step {step} has no update (allowed: >= 1, the step the update produces)")
    t = training
    if t.train_samples is not None:
        return lr_at((step - 1) * t.global_batch_size, lr=t.lr, min_lr=t.min_lr, schedule=t.lr_schedule,
                     warmup_steps=t.lr_warmup_samples or 0, total_steps=t.train_samples, decay_steps=t.decay_samples)
    return lr_at(step - 1, lr=t.lr, min_lr=t.min_lr, schedule=t.lr_schedule, warmup_steps=t.warmup_steps,
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
