"""The coordinator's book of planned drains: the pure rules (docs/design.md section 6, "Planned drain").

A planned drain moves the active slots of a node (or one logical rank) onto standby slots without a fault
and without replaying a step. Every active slot is armed to pause at the *commit fence* of one iteration
``S``: after ``wait_commit`` (its snapshot ``S(S-1)`` is committed locally and acknowledged by its ``k``
replica holders) and before ``optimizer_step``. A slot that paused there has live step ``S - 1`` equal to
its committed step, so once every member paused, the recoverable step is ``R = S - 1`` for every shard,
including the drained slots' shards (their replicas on the holders are committed at ``S - 1``), and the
hot swap that follows replays ``newest live step - R = 0`` steps. Only the partial iteration ``S``
(forward, backward and gradient reduction, no update) is computed again.

Lifecycle of a :class:`PendingDrain` (``state``):

- ``confirming``: ``drain`` {request_id, at_step} went to every active slot; each answers ``drain_ack``
  {armed, at_step, started_step, reason} (it arms only if it has not started iteration ``at_step``);
- a refusal because a slot already started that iteration re-arms every slot at a later step
  (:func:`retry_step`, at most :data:`MAX_ATTEMPTS` attempts); any other refusal, no answer in time, or
  too many attempts: ``refused`` (the request is answered ``rejected``; every slot is sent ``undrain``);
- ``armed``: the request is answered ``accepted`` {at_step}; each slot reports ``drain_reached`` when it
  paused at the fence;
- ``moving``: every member paused; the drained slots are told to stop (state DONE) and the hot swap runs;
- ``done`` once the recovery is done (journal ``drain_done`` {steps_replayed}); ``missed`` when a fault, a
  lost slot or the end of the job came first (journal ``drain_missed`` {reason}); never dropped silently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

STEPS_AHEAD = 2  # the drain pauses this many iterations after the newest live step the coordinator knows
MAX_ATTEMPTS = 3  # arming attempts before a drain is refused (a slot kept running past the chosen step)


@dataclass
class PendingDrain:
    """One drain request. ``targets``: world ranks to move off; ``members``: the active world ranks that
    must pause (every member of the generation); ``acks``: world rank -> its ``drain_ack`` of the current
    attempt; ``reached``: members paused at the fence."""

    request_id: str
    targets: list[int]
    members: list[int]
    at_step: int
    request: dict[str, Any]
    deadline: float
    target: dict[str, Any] = field(default_factory=dict)
    attempt: int = 1
    acks: dict[int, dict[str, Any]] = field(default_factory=dict)
    reached: set[int] = field(default_factory=set)
    state: str = "confirming"
    generation: int | None = None  # the generation of the hot swap, once moving


def drain_refusal(*, job_state: str, recovering: bool, pending: bool, targets: dict[int, str],
                  standby_off_target: int, target_nodes: set[str], shrink: str | None = None) -> str | None:
    """Why a drain must be refused now, or None. Pure.

    Args:
        job_state: the coordinator's job state value (``running`` is required).
        recovering: a recovery is in progress.
        pending: another drain is not finished yet.
        targets: the slots the target names, world rank -> slot state value.
        standby_off_target: standby slots on nodes other than the drained ones.
        target_nodes: the nodes of the targets.
        shrink: None for a drain onto spares; for ``--shrink``, ``""`` when the shrink is possible, else why not
            (:func:`phoenix_hpc.recovery.shrink.shrink_refusal`, or an engine that cannot shrink).
    """
    if job_state in ("done", "failed", "stopped"):
        return f"the job is {job_state}: nothing to drain"
    if job_state != "running" or recovering:
        return (f"the job is {'recovering' if recovering else job_state}; a drain starts only while it trains "
                "(retry once `phoenix status` says running)")
    if pending:
        return "another drain is in progress; one drain at a time"
    spares = sorted(w for w, s in targets.items() if s == "standby")
    if spares:
        return (f"world rank(s) {spares} on {', '.join(sorted(target_nodes))} are standby spares, which hold no "
                "logical rank; drain moves active slots (name a node or rank in training)")
    idle = sorted(f"{w} ({s})" for w, s in targets.items() if s != "active")
    if idle:
        return f"world rank(s) {', '.join(idle)} are not active"
    if shrink:
        return f"--shrink: {shrink}"
    if shrink is None and standby_off_target < len(targets):
        return (f"{len(targets)} slot(s) to move but {standby_off_target} spare slot(s) left on other nodes: the "
                "drain needs a spare, or --shrink to remove the slot's DP replica instead (dp - 1)")
    return None


def drain_verdict(d: PendingDrain) -> str | None:
    """``armed`` once every member armed the current attempt, ``retry`` when one refused only because it
    already started the iteration (and attempts are left), ``refused`` for any other refusal; None while
    waiting. Pure."""
    refused = {w: a for w, a in d.acks.items() if not a.get("armed")}
    if refused:
        late = all(a.get("late") for a in refused.values())
        return "retry" if late and d.attempt < MAX_ATTEMPTS else "refused"
    if set(d.acks) >= set(d.members):
        return "armed"
    return None


def retry_step(d: PendingDrain, ahead: int = STEPS_AHEAD) -> int:
    """The iteration of the next attempt: ``ahead`` after the newest iteration any member said it started
    (or the current attempt's step + ``ahead``). Pure."""
    started = [int(a.get("started_step") or 0) for a in d.acks.values()]
    return max([d.at_step] + started) + ahead


def arm_drain(at_step: int, started_step: int, last_step: int | None) -> tuple[bool, bool, str]:
    """A slot's answer to ``drain`` at ``at_step``: ``(armed, late, reason)``. It arms when it has not
    started iteration ``at_step`` yet and the job has that iteration; ``late``: refused only because it
    already started it. Pure."""
    if at_step <= started_step:
        return False, True, f"already started iteration {started_step} (drain asked for {at_step})"
    if last_step is not None and at_step > last_step:
        return False, False, f"the job ends at step {last_step}, before iteration {at_step} of the drain"
    return True, False, ""


def target_nodes_of(slots: dict[int, Any], targets: list[int]) -> set[str]:
    """The nodes of ``targets`` (``slots``: world rank -> object with ``node``). Pure."""
    return {str(slots[w].node) for w in targets}
