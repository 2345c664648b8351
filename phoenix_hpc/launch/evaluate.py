"""Evaluation on the validation part of ``data.split`` (``training.eval_interval``, ``training.eval_iters``).

Schedule (pure, :func:`eval_due`): after every step ``N`` that is a multiple of ``eval_interval``, right after
its optimizer step and before the step's record is logged or a persistent checkpoint of ``N`` is written
(:func:`phoenix_hpc.launch.loop.train`). Every member of the generation evaluates at the same steps, since
they all train the same steps.

Which samples (pure, :func:`eval_position`): as Megatron-LM's validation iterator, which moves on across
evaluations (``megatron/training/training.py``, ``evaluate``: ``eval_iters`` global batches per evaluation,
read from the iterator the previous evaluation left off): the ``k``-th evaluation (``k = N / eval_interval``)
reads the global batches ``(k-1) x eval_iters .. k x eval_iters - 1`` of the validation part, each DP rank its
own run of each batch as in training. So the result for step ``N`` is a pure function of the parameters at
step ``N`` and ``N``.

Never training progress: an evaluation runs forward only, without gradients, with the model in eval mode and
put back in train mode after (dropout off; no training RNG is drawn), and changes no engine state (step, data
position, learning rate, optimizer). A fault during the evaluation of step ``N`` is recovered as any fault
after step ``N``'s optimizer step: the snapshot of ``S(N)`` starts only with iteration ``N+1``, so the
recoverable step is below ``N``, step ``N`` is trained again and its evaluation redone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass


def eval_due(step: int, interval: int | None) -> bool:
    """Whether step ``step`` (the number of optimizer steps done) is followed by an evaluation. Pure."""
    return interval is not None and step > 0 and step % interval == 0


def eval_position(step: int, interval: int, iters: int, global_batch_size: int) -> int:
    """The validation part's global sample position of the first sample the evaluation after step ``step``
    reads: ``(step / interval - 1) x iters x global_batch_size`` (module doc). Pure.

    Raises:
        ValueError: ``step`` is not a positive multiple of ``interval``."""
    if not eval_due(step, interval):
        raise ValueError(f"step {step} is not followed by an evaluation (eval_interval {interval})")
    return (step // interval - 1) * iters * global_batch_size


@dataclass(frozen=True)
class EvalRecord:
    """One evaluation: after optimizer step ``step``, the mean loss (nats/token) over ``iters`` global
    batches of the validation part (None except on the last pipeline stage), starting at validation position
    ``position``; ``eval_time_ms``: its wall time."""

    step: int
    loss: float | None
    iters: int
    position: int
    eval_time_ms: float

    def as_dict(self) -> dict:
        return asdict(self)


class Evaluator:
    """What :func:`phoenix_hpc.launch.loop.train` calls after each step: evaluates when :func:`eval_due`.

    Args:
        interval, iters, global_batch_size: ``training.eval_interval``, ``eval_iters``, ``global_batch_size``.
        on_eval: gets each finished evaluation's record (an interrupted one is not reported).
        clock: seconds, monotonic (injectable for tests).
    """

    def __init__(self, interval: int | None, iters: int, global_batch_size: int,
                 on_eval: Callable[[EvalRecord], None] | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        self.interval = interval
        self.iters = iters
        self.global_batch_size = global_batch_size
        self.on_eval = on_eval
        self.clock = clock

    def due(self, step: int) -> bool:
        return eval_due(step, self.interval)

    def run(self, engine) -> EvalRecord:
        """Evaluate ``engine`` at its current step (:meth:`phoenix_hpc.engines.base.Engine.evaluate`); errors
        of the engine propagate unchanged (the caller recovers, and the step's evaluation is run again)."""
        step = int(engine.step)
        pos = eval_position(step, self.interval, self.iters, self.global_batch_size)
        t0 = self.clock()
        loss = engine.evaluate(pos, self.iters)
        rec = EvalRecord(step=step, loss=loss, iters=self.iters, position=pos,
                         eval_time_ms=(self.clock() - t0) * 1e3)
        if self.on_eval is not None:
            self.on_eval(rec)
        return rec


def evaluator_of(cfg, on_eval: Callable[[EvalRecord], None] | None = None) -> Evaluator | None:
    """The job's :class:`Evaluator`, or None without ``training.eval_interval``."""
    t = cfg.training
    if t.eval_interval is None:
        return None
    return Evaluator(t.eval_interval, t.eval_batches, t.global_batch_size, on_eval)
