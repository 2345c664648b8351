"""Megatron-LM's learning-rate scheduler state for a phoenix config, and where a checkpoint's differs.

Megatron-LM saves its ``OptimizerParamScheduler.state_dict()`` (megatron-core's
``optimizer_param_scheduler.py``) as the ``opt_param_scheduler`` entry of a checkpoint's common state
(``common.pt``; ``lr_scheduler`` in old checkpoints; ``megatron/training/checkpointing.py``). Its
iteration-based training counts the scheduler in samples: every iteration steps it by
``global_batch_size``, ``lr_warmup_steps = lr_warmup_iters x global_batch_size``, ``lr_decay_steps =
lr_decay_iters x global_batch_size``, and ``num_steps`` is the samples consumed so far.

phoenix's schedule is a pure function of the step (:mod:`phoenix_hpc.engines.schedule`), Megatron-LM's
exactly: ``train_step`` runs ``optimizer.step()`` before ``opt_param_scheduler.step(increment=global batch)``,
so a checkpoint of iteration ``S`` holds ``num_steps = S x global_batch_size`` and the iteration after it,
``S + 1``, trains at the rate there (:func:`phoenix_hpc.engines.schedule.lr_for` of ``S + 1``); iteration 1
at position 0. The schedule: linear warm-up over ``training.warmup_steps`` steps from 0 to ``training.lr``, then ``training.lr_schedule`` decay to
``training.min_lr`` within ``training.lr_decay_steps`` steps from step 0 (``training.steps`` when unset;
Megatron-LM's ``--lr-decay-iters``), weight decay constant (``training.weight_decay``, incremented over
``training.steps`` as Megatron-LM's ``wd_incr_steps = train_iters x global_batch_size``). With
``training.train_samples`` (Megatron-LM's sample-based training) the lengths are the config's samples
themselves: ``lr_warmup_steps = lr_warmup_samples``, ``lr_decay_steps = lr_decay_samples`` (else
``train_samples``), ``wd_incr_steps = train_samples`` (``get_optimizer_param_scheduler``). A run
continued from a checkpoint whose scheduler says otherwise would train with another schedule than the one that
wrote it; Megatron-LM refuses the same (its ``load_state_dict`` asserts each value unless
``--override-opt_param-scheduler`` or ``--use-checkpoint-opt_param-scheduler`` is given), so phoenix refuses
it at submit (:func:`differences`, used by :func:`phoenix_hpc.engines.megatron_layout.load_problems`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

#: Where Megatron-LM's ``OptimizerParamScheduler.load_state_dict`` reads each value, in its order of
#: preference (the first name present wins: old checkpoints' names before today's).
NAMES: dict[str, tuple[str, ...]] = {
    "max_lr": ("start_lr", "max_lr"),
    "min_lr": ("min_lr",),
    "lr_warmup_steps": ("warmup_iter", "warmup_steps", "lr_warmup_steps"),
    "lr_decay_steps": ("end_iter", "decay_steps", "lr_decay_steps"),
    "lr_decay_style": ("decay_style", "lr_decay_style"),
    "num_steps": ("num_iters", "num_steps"),
}

#: the decay styles phoenix implements (``training.lr_schedule``), under Megatron-LM's names
STYLES = ("constant", "cosine", "linear")


def scheduler_state(cfg, step: int) -> dict[str, Any]:
    """Megatron-LM's ``OptimizerParamScheduler.state_dict()`` after iteration ``step`` for the config's schedule,
    counted in samples (module doc): ``num_steps = step x global_batch_size``, the position whose rate the next
    update (step + 1) uses; weight decay constant."""
    t = cfg.training
    g = t.global_batch_size
    if t.train_samples is not None:
        warmup, decay, wd_incr = t.lr_warmup_samples or 0, t.decay_samples, t.train_samples
    else:
        warmup, decay, wd_incr = t.warmup_steps * g, t.decay_steps * g, t.steps * g
    return {"max_lr": t.lr, "lr_warmup_steps": warmup, "num_steps": int(step) * g,
            "lr_decay_style": t.lr_schedule, "lr_decay_steps": decay, "min_lr": t.min_lr,
            "start_wd": t.weight_decay, "end_wd": t.weight_decay, "wd_incr_style": "constant",
            "wd_incr_steps": wd_incr}


def scheduler_of(common: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """``(key, scheduler state)`` of a checkpoint's common state dict: ``lr_scheduler`` when present (old
    checkpoints; Megatron-LM prefers it), else ``opt_param_scheduler``; None when it has neither or it is not
    a dict."""
    for key in ("lr_scheduler", "opt_param_scheduler"):
        if key in common:
            return (key, common[key]) if isinstance(common[key], dict) else None
    return None


@dataclass(frozen=True)
class Difference:
    """One scheduler value that differs: ``field`` (the key it was read under), its value in the checkpoint
    (``checkpoint``) and for the config (``config``), how the config's is made (``source``), and what to
    change (``change``)."""

    field: str
    checkpoint: Any
    config: Any
    source: str
    change: str


def _read(sd: dict[str, Any], what: str) -> tuple[str, Any] | None:
    for name in NAMES[what]:
        if name in sd:
            return name, sd[name]
    return None


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _same(a: Any, b: Any) -> bool:
    """Equal; numbers within a relative 1e-9 (Megatron-LM computes a warm-up given as a fraction of the decay
    in floating point: ``0.01 x 800000`` samples may be a rounding away from the config's whole steps)."""
    if _number(a) and _number(b):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
    return a == b


def whole(x: Any) -> int | None:
    """``x`` as a whole number when it is a number within a relative 1e-9 of one (:func:`_same`: a product
    Megatron-LM computes in floating point, ``0.29 x 100`` is 28.999999999999996), else None. Pure."""
    if not _number(x) or not math.isfinite(x):
        return None
    n = round(x)
    return int(n) if _same(x, n) else None


def _iterations(samples: Any, g: int, fld: str, why: str) -> str:
    """What to set so that ``fld x global batch g`` is ``samples``."""
    n = whole(samples)
    if n is not None and n >= 0 and n % g == 0:
        return f"{fld} = {n // g}{why}"
    return (f"{fld} x training.global_batch_size = {samples} (no whole number of steps at global batch {g}: "
            "a checkpoint trained at another global batch size)")


def differences(sd: dict[str, Any], cfg, iteration: int) -> list[Difference]:
    """Where the checkpoint's scheduler state ``sd`` (:func:`scheduler_of`) at ``iteration`` differs from
    the config's schedule in a way that changes the training: the peak and the final learning rate, the
    warm-up and the decay length (in samples), the decay style, the position (``num_steps`` against
    ``iteration x global_batch_size``) and the weight decay (a value other than ``training.weight_decay``,
    or one that changes during training). Strings are compared exactly, numbers within a relative 1e-9
    (:func:`_same`; Megatron-LM asserts equality); a value the checkpoint does not hold is not compared. Empty: the run continues on the checkpoint's schedule.
    Pure."""
    t = cfg.training
    g = t.global_batch_size
    want = scheduler_state(cfg, iteration)
    out: list[Difference] = []

    def check(what: str, source: str, change: str) -> None:
        got = _read(sd, what)
        if got is not None and not _same(got[1], want[what]):
            out.append(Difference(got[0], got[1], want[what], source, change))

    got = _read(sd, "max_lr")
    check("max_lr", "training.lr", f"training.lr = {got[1] if got else ''} (Megatron-LM's --lr)")
    got = _read(sd, "min_lr")
    check("min_lr", "training.min_lr", f"training.min_lr = {got[1] if got else ''} (Megatron-LM's --min-lr)")
    got = _read(sd, "lr_warmup_steps")
    if t.train_samples is not None:
        check("lr_warmup_steps", f"training.lr_warmup_samples {t.lr_warmup_samples or 0}",
              _samples_change(got[1], "training.lr_warmup_samples", " (Megatron-LM's --lr-warmup-samples)")
              if got else "")
    else:
        check("lr_warmup_steps", f"training.warmup_steps {t.warmup_steps} x training.global_batch_size {g}",
              _iterations(got[1], g, "training.warmup_steps", " (Megatron-LM's --lr-warmup-iters)") if got else "")
    got = _read(sd, "lr_decay_steps")
    if t.train_samples is not None:
        check("lr_decay_steps", f"training.lr_decay_samples {t.lr_decay_samples}" if t.lr_decay_samples is not None
              else f"training.train_samples {t.train_samples} (training.lr_decay_samples unset)",
              _samples_change(got[1], "training.lr_decay_samples", " (Megatron-LM's --lr-decay-samples)")
              if got else "")
    else:
        check("lr_decay_steps", (f"training.lr_decay_steps {t.lr_decay_steps}" if t.lr_decay_steps is not None else
                                 f"training.steps {t.steps} (training.lr_decay_steps unset)")
              + f" x training.global_batch_size {g}", _decay_change(got[1], g, t.lr_decay_steps) if got else "")
    got = _read(sd, "lr_decay_style")
    if got is not None:
        style = got[1]
        check("lr_decay_style", "training.lr_schedule",
              f"training.lr_schedule = {style}" if style in STYLES else
              f"none: phoenix implements {', '.join(STYLES)} (a checkpoint trained with one of them)")
    got = _read(sd, "num_steps")
    check("num_steps", f"iteration {iteration} x training.global_batch_size {g}: the update after iteration "
          "N trains at the rate of N x global batch samples", _position_change(got[1] if got else None,
                                                                                int(iteration)))
    if "start_wd" in sd or "end_wd" in sd:
        start, end = sd.get("start_wd", t.weight_decay), sd.get("end_wd", sd.get("start_wd", t.weight_decay))
        if not _same(start, end):
            out.append(Difference("start_wd/end_wd", f"{start} -> {end} ({sd.get('wd_incr_style', '?')})",
                                  t.weight_decay, "training.weight_decay: phoenix's weight decay is constant",
                                  "none: a checkpoint trained with a constant weight decay (Megatron-LM's "
                                  "--weight-decay-incr-style constant)"))
        elif not _same(start, t.weight_decay):
            out.append(Difference("start_wd", start, t.weight_decay, "training.weight_decay",
                                  f"training.weight_decay = {start} (Megatron-LM's --weight-decay)"))
    return out


def _samples_change(samples: Any, fld: str, why: str) -> str:
    """What to set so that the sample-counted config's length ``fld`` is the checkpoint's ``samples``."""
    n = whole(samples)
    if n is not None and n >= 0:
        return f"{fld} = {n}{why}"
    return f"{fld} = {samples} (not a whole number of samples: a warm-up given as a fraction of the decay)"


def _decay_change(samples: Any, g: int, lr_decay_steps: int | None) -> str:
    """What to set so that the config's decay length is the checkpoint's ``samples``: ``training.lr_decay_steps``
    (Megatron-LM's ``--lr-decay-iters``); while it is unset, the decay length is ``training.steps``, so that
    is named first."""
    change = _iterations(samples, g, "training.lr_decay_steps", " (Megatron-LM's --lr-decay-iters)")
    n = whole(samples)
    if lr_decay_steps is None and n is not None and n >= 0 and n % g == 0:
        return f"training.steps = {n // g} (the decay length while training.lr_decay_steps is unset), or {change}"
    return change


def _position_change(num_steps: Any, iteration: int) -> str:
    n = whole(num_steps)
    if n is not None and iteration > 0 and n > 0 and n % iteration == 0:
        return (f"training.global_batch_size = {n // iteration} (the checkpoint's samples per iteration), "
                "or a checkpoint trained at this global batch size")
    return ("none: the checkpoint consumed a number of samples that is not its iteration times one global batch "
            "size (a batch-size ramp-up)")
