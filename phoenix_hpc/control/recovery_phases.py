"""The phase table of one recovery and the pure rule for what it does next (docs/design.md section 6).

::

    QUIESCE --every survivor answered quiesced; plan sent (memory, checkpoint restart or shrink)--> RESTORE
    RESTORE --every member answered recovered; evidence checked; resume sent----------------------> REPLAY
    REPLAY  --every member past the replayed steps (or a new fault cut the replay short)---------> done
    QUIESCE | RESTORE --a member lost, or silent past the deadline--> ABORTED (re-planned at once)

QUIESCE and RESTORE wait on an answer from every member under a deadline (:data:`ANSWERING`). The
coordinator asks :func:`on_tick` on every tick and :func:`on_answers` after a batch of messages; both are
pure functions of the :class:`~phoenix_hpc.control.records.Recovery` record, the dead slots, the members'
steps and the clock, and return a :class:`Next` the coordinator carries out (abort, plan, check and resume,
finish). :func:`check_move` guards every phase change against :data:`PHASE_TRANSITIONS`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping

from phoenix_hpc.control.states import IllegalTransition, RecoveryPhase

if TYPE_CHECKING:
    from phoenix_hpc.control.records import Recovery

Q, R, P, A = RecoveryPhase.QUIESCE, RecoveryPhase.RESTORE, RecoveryPhase.REPLAY, RecoveryPhase.ABORTED

PHASE_TRANSITIONS: Mapping[RecoveryPhase, frozenset[RecoveryPhase]] = {
    Q: frozenset({R, A}),
    R: frozenset({P, A}),
    P: frozenset(),  # the recovery ends (recovery_done)
    A: frozenset(),
}

# The phases that wait on an answer from every member, under the recovery's deadline.
ANSWERING = frozenset({Q, R})


def check_move(old: RecoveryPhase, new: RecoveryPhase) -> RecoveryPhase:
    """``new`` if :data:`PHASE_TRANSITIONS` allows ``old -> new``. Pure.

    Raises:
        IllegalTransition: the table does not allow it (a bug in the control plane).
    """
    if new not in PHASE_TRANSITIONS[RecoveryPhase(old)]:
        raise IllegalTransition(f"recovery: illegal phase transition {RecoveryPhase(old).value} -> "
                                f"{RecoveryPhase(new).value}")
    return RecoveryPhase(new)


class Step(enum.Enum):
    """What the recovery does next."""

    WAIT = "wait"
    ABORT = "abort"  # a member died in an answering phase
    TIMEOUT = "timeout"  # members silent past the deadline: declare them dead, then abort
    PLAN = "plan"  # every survivor quiesced: plan and send it
    CHECK = "check"  # every member recovered: check the evidence, resume
    FINISH = "finish"  # every member is past the replayed steps
    INTERRUPTED = "interrupted"  # a new fault arrived during the replay: end this recovery, handle the fault


@dataclass(frozen=True)
class Next:
    """:class:`Step` plus, for ABORT and TIMEOUT, the slots it names and the reasons to journal
    (``reason``: the abort's; ``dead_reason``: why the silent slots are declared dead)."""

    step: Step
    slots: tuple[int, ...] = ()
    reason: str = ""
    dead_reason: str = ""


WAIT = Next(Step.WAIT)


def members_of(rec: Recovery) -> set[int]:
    """The world ranks the recovery waits on: the survivors while quiescing, then the plan's members."""
    if rec.phase == Q:
        return set(rec.survivors)
    return {w for _, w in rec.plan.rank_map} if rec.plan else set()


def _answered(rec: Recovery) -> set[int]:
    return set(rec.quiesced if rec.phase == Q else rec.recovered)


def replay_over(rec: Recovery, step_of: Callable[[int], int]) -> bool:
    """Every member of the plan reported a step at or past the recovery's target step."""
    return all(step_of(w) >= rec.target_step for _, w in rec.plan.rank_map)


def on_tick(rec: Recovery, *, dead: Callable[[int], bool], step_of: Callable[[int], int], faults_pending: bool,
            now: float) -> Next:
    """The tick's rule. In an answering phase: a dead member aborts the recovery; past the deadline the
    silent members are declared dead and it aborts; once every member answered it moves on (PLAN, CHECK).
    In REPLAY: FINISH once every member passed the target step, INTERRUPTED if a fault is pending first.
    ``dead``: whether a world rank's slot is DEAD; ``step_of``: a world rank's newest reported step;
    ``now``: coordinator clock, seconds. Pure (O(members))."""
    phase = RecoveryPhase(rec.phase)
    members = members_of(rec)
    if phase in ANSWERING:
        lost = sorted(w for w in members if dead(w))
        if lost:
            return Next(Step.ABORT, tuple(lost), f"slot(s) {lost} died during the {phase.value} phase")
        if now > rec.deadline:
            silent = sorted(members - _answered(rec))
            return Next(Step.TIMEOUT, tuple(silent), f"slot(s) {silent} did not answer the {phase.value}",
                        f"no {phase.value} answer within {rec.deadline - rec.t_start:.0f}s")
        if _answered(rec) >= members:
            return Next(Step.PLAN if phase == Q else Step.CHECK)
        return WAIT
    if phase == P:
        if replay_over(rec, step_of):
            return Next(Step.FINISH)
        if faults_pending:
            return Next(Step.INTERRUPTED)
    return WAIT


def on_answers(rec: Recovery, *, dead: Callable[[int], bool], step_of: Callable[[int], int],
               faults_pending: bool, overdue: Callable[[], bool], now: float, tick_s: float) -> Next:
    """The rule after a batch of messages, so that a recovery does not wait up to a tick for its last
    answer: PLAN once every survivor quiesced, but no sooner than ``tick_s`` after the start, within the
    deadline, with no fault pending, no survivor dead and no slot ``overdue()`` (heartbeats the tick would
    judge dead first; asked last, it is the costly one); CHECK once every member recovered; FINISH once every
    member passed the replayed steps with no fault pending. A dead member waits for the tick, which aborts. Pure."""
    phase = RecoveryPhase(rec.phase)
    if phase == Q:
        if (set(rec.quiesced) >= set(rec.survivors) and not faults_pending and now <= rec.deadline
                and now - rec.t_start >= tick_s and not any(dead(w) for w in rec.survivors) and not overdue()):
            return Next(Step.PLAN)
        return WAIT
    if any(dead(w) for w in members_of(rec)):
        return WAIT
    if phase == R and set(rec.recovered) >= members_of(rec):
        return Next(Step.CHECK)
    if phase == P and not faults_pending and replay_over(rec, step_of):
        return Next(Step.FINISH)
    return WAIT
