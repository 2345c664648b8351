"""Evaluation on the validation part of ``data.split`` (``training.eval_interval``, ``training.eval_iters``).

Schedule (pure, :func:`evaluations_after`): after every step ``N`` that is a multiple of ``eval_interval``
(:func:`eval_due`), and once more after the job's last step ``T`` (``training.steps``) whether or not ``T`` is
such a multiple, right after the step's optimizer step and before its record is logged or a persistent
checkpoint of it is written (:func:`phoenix_hpc.launch.loop.train`). The evaluation after the last step is
Megatron-LM's: ``pretrain`` (``megatron/training/training.py``) evaluates on the validation set after
``train`` returns from its last iteration, when there is a validation set and ``--eval-iters > 0``, also when
the last iteration was an evaluation one (it then evaluates twice at that iteration, on the next batches);
an early exit (``--exit-interval``, ``--exit-duration-in-mins``, the signal handler) leaves before it, and so
does a phoenix job that a planned end or a stop ends before ``T``. Every member of the generation evaluates
at the same steps, since they all train the same steps.

Which samples (pure, :func:`eval_position`, :func:`final_eval_position`): as Megatron-LM's validation
iterator, which moves on across evaluations (``megatron/training/training.py``, ``evaluate``: ``eval_iters``
global batches per evaluation, read from the iterator the previous evaluation left off): the ``k``-th periodic
evaluation (``k = N / eval_interval``) reads the global batches ``(k-1) x eval_iters .. k x eval_iters - 1`` of
the validation part, each DP rank its own run of each batch as in training; the one after the last step
reads the next ``eval_iters`` batches, ``K x eval_iters .. (K+1) x eval_iters - 1`` with
``K = T // eval_interval`` (Megatron-LM sizes the validation set for exactly these ``K + 1`` evaluations,
``get_train_valid_test_num_samples``). So the result for step ``N`` is a pure function of the parameters at
step ``N`` and ``N``.

Never training progress: an evaluation runs forward only, without gradients, with the model in eval mode and
put back in train mode after (dropout off; no training RNG is drawn), and changes no engine state (step, data
position, learning rate, optimizer). A fault during an evaluation after step ``N`` (the last step's included)
is recovered as any fault after step ``N``'s optimizer step: the snapshot of ``S(N)`` starts only with
iteration ``N+1``, so the recoverable step is below ``N``, step ``N`` is trained again and its evaluations
redone.
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


def final_eval_position(last_step: int, interval: int, iters: int, global_batch_size: int) -> int:
    """The validation part's global sample position of the first sample the evaluation after the job's last
    step ``last_step`` reads: ``(last_step // interval) x iters x global_batch_size``, the batches after those
    of the periodic evaluations before it (module doc). Pure.

    Raises:
        ValueError: ``last_step`` is below 1."""
    if last_step < 1:
        raise ValueError(f"the last step {last_step} is not a step (allowed: >= 1)")
    return (last_step // interval) * iters * global_batch_size


def evaluations_after(step: int, interval: int | None, iters: int, global_batch_size: int,
                      last_step: int | None) -> list[tuple[int, bool]]:
    """The evaluations that follow optimizer step ``step``, in order, as ``(validation position, final)``: the
    periodic one when :func:`eval_due`, then, when ``step`` is the job's ``last_step``, the one after training
    (``final``; module doc). None without ``interval``; ``last_step`` None: no evaluation after training (a
    caller that trains part of a job). Pure."""
    if interval is None:
        return []
    out = [(eval_position(step, interval, iters, global_batch_size), False)] if eval_due(step, interval) else []
    if last_step is not None and step == last_step:
        out.append((final_eval_position(last_step, interval, iters, global_batch_size), True))
    return out


@dataclass(frozen=True)
class EvalRecord:
    """One evaluation: after optimizer step ``step``, the mean loss (nats/token) over ``iters`` global
    batches of the validation part (None except on the last pipeline stage), starting at validation position
    ``position``; ``eval_time_ms``: its wall time; ``final``: the evaluation after the job's last step
    (Megatron-LM's after training), not a periodic one."""

    step: int
    loss: float | None
    iters: int
    position: int
    eval_time_ms: float
    final: bool = False

    def as_dict(self) -> dict:
        return asdict(self)


class Evaluator:
    """What :func:`phoenix_hpc.launch.loop.train` calls after each step: evaluates as
    :func:`evaluations_after` says.

    Args:
        interval, iters, global_batch_size: ``training.eval_interval``, ``eval_iters``, ``global_batch_size``.
        on_eval: gets each finished evaluation's record (an interrupted one is not reported).
        clock: seconds, monotonic (injectable for tests).
        last_step: the job's last step (``training.steps``), followed by the evaluation after training; None:
            none (a caller that trains only part of a job).
    """

    def __init__(self, interval: int | None, iters: int, global_batch_size: int,
                 on_eval: Callable[[EvalRecord], None] | None = None,
                 clock: Callable[[], float] = time.perf_counter, last_step: int | None = None):
        self.interval = interval
        self.iters = iters
        self.global_batch_size = global_batch_size
        self.on_eval = on_eval
        self.clock = clock
        self.last_step = last_step

    def _after(self, step: int) -> list[tuple[int, bool]]:
        return evaluations_after(step, self.interval, self.iters, self.global_batch_size, self.last_step)

    def due(self, step: int) -> bool:
        return bool(self._after(step))

    def run(self, engine) -> list[EvalRecord]:
        """Run the evaluations due after ``engine``'s current step, in order
        (:meth:`phoenix_hpc.engines.base.Engine.evaluate`); returns their records. Errors of the engine
        propagate unchanged (the caller recovers, and the step's evaluations are run again)."""
        step = int(engine.step)
        records = []
        for pos, final in self._after(step):
            t0 = self.clock()
            loss = engine.evaluate(pos, self.iters)
            rec = EvalRecord(step=step, loss=loss, iters=self.iters, position=pos,
                             eval_time_ms=(self.clock() - t0) * 1e3, final=final)
            if self.on_eval is not None:
                self.on_eval(rec)
            records.append(rec)
        return records


def evaluator_of(cfg, on_eval: Callable[[EvalRecord], None] | None = None) -> Evaluator | None:
    """The job's :class:`Evaluator` (periodic evaluations and the one after ``training.steps``), or None
    without ``training.eval_interval``."""
    t = cfg.training
    if t.eval_interval is None:
        return None
    return Evaluator(t.eval_interval, t.eval_batches, t.global_batch_size, on_eval, last_step=t.steps)
