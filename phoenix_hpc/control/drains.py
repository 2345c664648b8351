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

:class:`DrainBook` owns the newest drain and moves it through that lifecycle: each of its methods takes one
input (the request, an ack, a member at the fence, the recovery's end, the clock, whatever came first) and
returns the journal events and commands (:mod:`phoenix_hpc.control.commands`) it calls for; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from phoenix_hpc.control import events as E
from phoenix_hpc.control.classify import Action, Decision
from phoenix_hpc.control.commands import CountRejected, Hold, Outcome, Reject, Release, Send
from phoenix_hpc.control.injects import confirm_within
from phoenix_hpc.control.states import JobState, SlotState

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


ACTIVE_STATES = ("confirming", "armed", "moving")  # a drain in these states is not finished


class DrainBook:
    """The newest planned drain (``current``; one at a time) and the rules that move it (module docstring).
    Every method returns an :class:`~phoenix_hpc.control.commands.Outcome`, except where said."""

    def __init__(self) -> None:
        self.current: PendingDrain | None = None

    def request(self, body: dict[str, Any], *, slots: Mapping[int, Any], rank_map: Mapping[int, int],
                grid: tuple[int, int, int] | None, job_state: JobState, recovering: bool, shrink_capable: bool,
                k: int, now: float, new_id: Callable[[], str]) -> Outcome:
        """A ``drain`` request: refused (naming why and what is allowed), or recorded, journalled and sent
        to every member to arm, its answer held until they did. ``k``: replicas per shard (a shrink needs a
        holder of every lost shard); ``now``: coordinator clock, seconds.

        Raises:
            ValueError, TypeError: a target rank or coordinate that is not an integer (refused by the caller).
        """
        from phoenix_hpc.control.targets import resolve_target, step_count_refusal
        from phoenix_hpc.recovery.shrink import shrink_refusal

        def refuse(why: str) -> Outcome:
            return Outcome([], [Reject(f"drain: {why}", body)])

        targets, why = resolve_target(body.get("target"), slots, rank_map, grid)
        if not targets:
            return refuse(why)
        nodes = target_nodes_of(slots, targets)
        standby_off = sum(1 for s in slots.values() if s.state is SlotState.STANDBY and s.node not in nodes)
        pending = self.current is not None and self.current.state in ACTIVE_STATES
        shrink = None
        if body.get("shrink"):
            w2l = {w: r for r, w in rank_map.items()}
            shrink = ("" if shrink_capable else "the job's engine cannot shrink (engine torch can; "
                      "resilience.spares_exhausted: stop or another engine)")
            if not shrink and grid:
                shrink = shrink_refusal(tuple(grid), [w2l[w] for w in targets if w in w2l],
                                        {r: slots[w].node for r, w in rank_map.items()}, k) or ""
        why = drain_refusal(job_state=job_state.value, recovering=recovering, pending=pending,
                            targets={w: slots[w].state.value for w in targets},
                            standby_off_target=standby_off, target_nodes=nodes, shrink=shrink)
        if why:
            return refuse(why)
        rid = str(body.get("request_id") or new_id())
        members = sorted(rank_map.values())
        ahead = body.get("steps_ahead", STEPS_AHEAD)
        if why := step_count_refusal("steps_ahead", ahead):
            return refuse(why)
        at_step = max(slots[w].step for w in members) + ahead
        exact = body.get("at_step")
        if exact is not None:  # obeyed exactly or refused (by the slots, if one already started it)
            if why := step_count_refusal("at_step", exact):
                return refuse(why)
            at_step = exact
        d = self.current = PendingDrain(rid, sorted(targets), members, at_step, body,
                                        deadline=now + confirm_within(body), target=dict(body["target"]))
        return Outcome([E.DrainRequested(request_id=rid, target=body.get("target"), targets=sorted(targets),
                                         nodes=sorted(nodes), at_step=at_step)],
                       [Hold(body), *self._arm(d)])

    @staticmethod
    def _arm(d: PendingDrain) -> list[Send]:
        d.acks = {}
        return [Send(w, {"type": "drain", "request_id": d.request_id, "at_step": d.at_step, "attempt": d.attempt})
                for w in d.members]

    def ack(self, world_rank: int, body: dict[str, Any], *, live: Callable[[int], bool]) -> Outcome:
        """A member's ``drain_ack`` of the current attempt: armed by all -> accepted; refused only as too
        late -> re-armed at a later step (not for an exact ``at_step``); any other refusal -> refused."""
        d = self.current
        if d is None or str(body.get("request_id")) != d.request_id or d.state != "confirming":
            return Outcome.none()
        if int(body.get("attempt", 0)) != d.attempt or world_rank not in d.members:
            return Outcome.none()
        d.acks[world_rank] = body
        v = drain_verdict(d)
        if v == "retry" and d.request.get("at_step") is not None:  # an exact iteration is never moved later
            v = "refused"
        if v == "retry":
            undrain = self._undrain(d, live)
            d.at_step = retry_step(d)
            d.attempt += 1
            return Outcome([E.DrainRearmed(request_id=d.request_id, at_step=d.at_step, attempt=d.attempt)],
                           [*undrain, *self._arm(d)])
        if v == "refused":
            why = "; ".join(f"world rank {w}: {a.get('reason') or 'refused'}" for w, a in sorted(d.acks.items())
                            if not a.get("armed"))
            return self._refuse(d, why, live)
        if v == "armed":
            d.state = "armed"
            return Outcome([E.DrainArmed(request_id=d.request_id, at_step=d.at_step, members=d.members)],
                           [Release(d.request, {"type": "accepted", "request_id": d.request_id,
                                                "targets": d.targets, "at_step": d.at_step})])
        return Outcome.none()

    def reached(self, world_rank: int, body: dict[str, Any]) -> bool:
        """A member paused at the commit fence of the drain's iteration. Returns whether every member has."""
        d = self.current
        if d is None or str(body.get("request_id")) != d.request_id or d.state != "armed":
            return False
        d.reached.add(world_rank)
        return set(d.reached) >= set(d.members)

    def start(self, slots: Mapping[int, Any]) -> tuple[Outcome, Decision, list[str]]:
        """Every member paused: the drain moves. Returns the journal record and the drained slots' ``stop``,
        the hot swap's decision, and the drained nodes (the caller marks the slots DONE before the stops go
        and starts the recovery)."""
        d = self.current
        d.state = "moving"
        nodes = sorted(target_nodes_of(slots, d.targets))
        how = "leaves with its DP replica (shrink)" if d.request.get("shrink") else "moves to a spare"
        stops = [Send(w, {"type": "stop", "drained": True, "job_state": "drained",
                          "reason": f"drained: logical rank {slots[w].logical_rank} {how}"}) for w in d.targets]
        decision = Decision(Action.HOT_SWAP, f"planned drain of {', '.join(nodes)} (request {d.request_id})"
                                             f"{' by a shrink' if d.request.get('shrink') else ''}")
        return (Outcome([E.DrainStart(request_id=d.request_id, targets=d.targets, nodes=nodes,
                                      live_step=d.at_step - 1)], stops), decision, nodes)

    def finished(self, rec: Any, now: float, *, standby: Callable[[int], bool]) -> Outcome:
        """The drain's hot swap (recovery ``rec``) is done. ``standby``: whether a world rank's slot is a
        spare now (a shrink's freed slots)."""
        d = self.current
        if d is None or rec.drain is not d:
            return Outcome.none()
        d.state = "done"
        moved = [[j.replaces_world_rank, j.world_rank, j.logical_rank] for j in rec.plan.joins]
        shrunk = ({"dp": rec.plan.grid[2], "freed": [w for w in rec.plan.leavers if standby(w)]}
                  if rec.plan.action == "shrink" else {})
        return Outcome([E.DrainDone(request_id=d.request_id, generation=rec.generation,
                                    steps_replayed=rec.plan.steps_replayed,
                                    recoverable_step=rec.plan.recoverable_step, moved=moved,
                                    total_s=round(now - rec.t_start, 3), **shrunk)], [])

    def missed(self, reason: str, *, live: Callable[[int], bool]) -> Outcome:
        """Something came first (a fault, a lost slot, the end of the job): a drain being confirmed is
        refused, an armed or moving one is journalled missed; every live member is disarmed."""
        d = self.current
        if d is None or d.state not in ACTIVE_STATES:
            return Outcome.none()
        if d.state == "confirming":
            return self._refuse(d, reason, live)
        if d.state == "moving":  # the drained slots have left; the recovery that follows replaces them
            reason = f"the drain's hot swap was cut short, its slots are replaced by the next recovery ({reason})"
        d.state = "missed"
        return Outcome([E.DrainMissed(request_id=d.request_id, at_step=d.at_step, targets=d.targets,
                                      reason=reason)], self._undrain(d, live))

    def tick(self, now: float, *, live: Callable[[int], bool]) -> Outcome:
        """A drain whose members did not all confirm in time is refused."""
        d = self.current
        if d is not None and d.state == "confirming" and now > d.deadline:
            silent = sorted(set(d.members) - set(d.acks))
            return self._refuse(d, f"world rank(s) {silent} did not confirm within {confirm_within(d.request):g} s",
                                live)
        return Outcome.none()

    @staticmethod
    def _undrain(d: PendingDrain, live: Callable[[int], bool]) -> list[Send]:
        return [Send(w, {"type": "undrain", "request_id": d.request_id}) for w in d.members if live(w)]

    def _refuse(self, d: PendingDrain, reason: str, live: Callable[[int], bool]) -> Outcome:
        d.state = "refused"
        return Outcome([E.DrainRefused(request_id=d.request_id, reason=reason, targets=d.targets)],
                       [*self._undrain(d, live), CountRejected(),
                        Release(d.request, {"type": "rejected", "reason": f"drain: {reason}"})])
