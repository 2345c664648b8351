"""The training loop of one active rank.

Per step (docs/design.md section 4)::

    protector.start_snapshot(engine)   # only with a protector: D2H of S(k-1) + H2H in the background
    loss = engine.forward_backward()
    engine.reduce_gradients()
    protector.wait_commit()            # only with a protector: S(k-1) committed locally and on the peers
    engine.optimizer_step()            # -> S(k)

With a protection interval m > 1 (runtime/interval.py; a protector with ``due``/``commit_due``/
``wait_local``) the snapshot is started only when it is due (every m-th step); in the steps of its interval
the loop waits before ``optimizer_step`` only for its local copy (``wait_local``, the live state is read) and
commits it (``wait_commit``) before the optimizer step of the interval's last step.

With ``protector=None`` (resilience disabled) the loop makes no call besides the three engine calls.
The time spent inside ``wait_commit`` is the *exposed wait* of the step and is logged.

With a ``phase_hook`` the loop also calls ``phase_hook(s, phase)`` before each phase of iteration ``s``
(``s = engine.step + 1``): ``forward_backward`` (before ``start_snapshot``), ``reduce_gradients``,
``wait_commit`` and ``optimizer_step``. The resilient driver (:mod:`phoenix_hpc.launch.execute`) uses it
to poll the coordinator, fire injected faults at their phase, and know in which phase an error arose.

With an ``evaluator`` (:class:`phoenix_hpc.launch.evaluate.Evaluator`) a step ``N`` it says is due (a multiple
of the interval, or the job's last step) is followed, after its optimizer step, by ``phase_hook(N, "evaluate")``
and its evaluations, before its record goes to ``on_step`` (so a persistent checkpoint of ``N`` is written after
them); the step's time and tokens/s do not count them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Protocol

from phoenix_hpc.engines.base import Engine


class Protector(Protocol):
    """What the loop calls on the runtime's protector (phoenix_hpc.runtime) when resilience is enabled."""

    def start_snapshot(self, engine: Engine) -> None:
        """Begin D2H of the engine's current state S(step) into staging, then H2H of its optimizer part;
        returns at once (the copies run in the background)."""

    def wait_commit(self) -> None:
        """Block until the snapshot started by the last :meth:`start_snapshot` is committed locally and
        acknowledged by every replica holder; raise if that failed."""


@dataclass(frozen=True)
class StepRecord:
    """One finished step. ``loss`` is None except on the last pipeline stage; times in milliseconds;
    ``tokens_per_s`` counts the whole job's tokens of the step (global batch x seq length); ``lr``: the
    learning rate the step's update used (``engine.last_lr``, :func:`phoenix_hpc.engines.schedule.lr_for` of
    the step; Megatron-LM's log line of an iteration prints the next iteration's); ``ts``: wall clock (unix
    seconds, ``time.time()``) when the step finished."""

    step: int
    loss: float | None
    step_time_ms: float
    tokens_per_s: float
    exposed_wait_ms: float
    lr: float
    grad_norm: float
    ts: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class StepTotals:
    """What a rank's summary reports of its steps, summed as they finish: ``steps`` recorded (replayed steps
    count again), their ``time_ms`` (sum of :attr:`StepRecord.step_time_ms`), the first and the newest
    loss (None until a step reports one)."""

    steps: int = 0
    time_ms: float = 0.0
    first_loss: float | None = None
    last_loss: float | None = None

    def add(self, rec: StepRecord) -> None:
        self.steps += 1
        self.time_ms += rec.step_time_ms
        if rec.loss is not None:
            if self.first_loss is None:
                self.first_loss = rec.loss
            self.last_loss = rec.loss


def train(
    engine: Engine,
    until_step: int,
    tokens_per_step: int,
    protector: Protector | None = None,
    on_step: Callable[[StepRecord], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    phase_hook: Callable[[int, str], None] | None = None,
    keep: bool = True,
    evaluator=None,
) -> list[StepRecord]:
    """Run steps ``engine.step + 1 .. until_step``; return their records (also passed to ``on_step``), or
    with ``keep=False`` an empty list: a long job logs each record from ``on_step`` and sums them in a
    :class:`StepTotals`, since a list of every step's record would grow for the whole job.

    Exceptions from the engine, the protector or ``phase_hook`` propagate unchanged (the caller classifies
    them); a step interrupted that way is not recorded.
    """
    records: list[StepRecord] = []
    adaptive = protector is not None and hasattr(protector, "due")  # a protector with an interval (once)
    while engine.step < until_step:
        t0 = clock()
        s = engine.step + 1
        if phase_hook is not None:
            phase_hook(s, "forward_backward")
        if protector is not None and (not adaptive or protector.due(engine.step)):
            protector.start_snapshot(engine)
        loss = engine.forward_backward()
        if phase_hook is not None:
            phase_hook(s, "reduce_gradients")
        engine.reduce_gradients()
        wait = 0.0
        if protector is not None and (not adaptive or protector.pending()):
            if phase_hook is not None:
                phase_hook(s, "wait_commit")
            tw = clock()
            if not adaptive or protector.commit_due(engine.step):
                protector.wait_commit()
            else:
                protector.wait_local()
            wait = clock() - tw
        if phase_hook is not None:
            phase_hook(s, "optimizer_step")
        engine.optimizer_step()
        dt = clock() - t0
        rec = StepRecord(
            step=engine.step,
            loss=loss,
            step_time_ms=dt * 1e3,
            tokens_per_s=tokens_per_step / dt if dt > 0 else 0.0,
            exposed_wait_ms=wait * 1e3,
            lr=float(getattr(engine, "last_lr", 0.0)),
            grad_norm=float(getattr(engine, "last_grad_norm", 0.0)),
            ts=time.time(),
        )
        if evaluator is not None and evaluator.due(engine.step):
            if phase_hook is not None:
                phase_hook(engine.step, "evaluate")
            evaluator.run(engine)
        if keep:
            records.append(rec)
        if on_step is not None:
            on_step(rec)
    return records
