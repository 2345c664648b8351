"""The coordinator's book of fault-injection requests: confirmed by their targets, then landed or missed.

An ``inject`` request is not accepted on the coordinator's view of the job (its live step lags the slots
by up to a heartbeat interval and a step). It is forwarded to every target slot, and each target decides
(:func:`phoenix_hpc.faults.trigger.arm_decision`): it *arms* the fault when it has not started the step
yet, or *refuses* it, and answers ``inject_ack`` {request_id, armed, at_step, started_step, reason}. The
coordinator answers the request once every target answered:

- all armed: ``accepted`` {at_step, armed_steps {world rank: step}}; journal ``inject_armed``;
- any refused, or no answer within the request's ``confirm_within_s``, or a target lost or the job ended
  first: ``rejected`` {reason}; journal ``inject_refused``; every live target is sent ``disarm`` (an
  instruction queue is read in order at the start of every iteration, before any phase of it, so a target
  that has not read the inject yet arms and disarms it in one read, and a disarm sent before the target
  started the armed step always wins).

An armed request that can no longer land is *missed*: its target slot was declared dead before it fired, or
the job ended first. The coordinator journals ``inject_missed`` {request_id, world_rank, at_step, reason}
(``phoenix status`` shows it; ``phoenix inject-fault`` exits 1). Whether a target fired is read from its
landing record ``RUN_DIR/faults/fired-<request_id>-w<world_rank>.json``, which the slot writes and fsyncs
before the effect (:class:`phoenix_hpc.faults.trigger.FiredFile`), so it exists even when the effect is a
SIGKILL.

The book (:class:`InjectBook`) owns the requests; each of its methods takes one input (a request, an ack, a
landing, lost slots, the clock, the job's end) and returns the journal events and the commands
(:mod:`phoenix_hpc.control.commands`) it calls for. It does no I/O: whether a target fired is asked through
``has_fired`` (the landing file), the coordinator does the sending, replying and journalling.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from phoenix_hpc.control import events as E
from phoenix_hpc.control import protocol as P
from phoenix_hpc.control.commands import CountRejected, Hold, Outcome, Reject, Release, Send
from phoenix_hpc.control.records import Slot
from phoenix_hpc.control.states import TERMINAL_JOB_STATES, JobState
from phoenix_hpc.control.targets import resolve_target, step_count_refusal

CONFIRM_DEFAULT_S = 20.0  # how long targets have to confirm a request whose sender gave no confirm_within_s
CONFIRM_RANGE_S = (1.0, 600.0)


@dataclass
class PendingInject:
    """One request. ``acks``: world rank -> its ``inject_ack`` body; ``state``: confirming | armed | refused
    | done (every target fired or missed)."""

    request_id: str
    kind: str
    phase: str
    at_step: int
    targets: list[int]
    request: dict[str, Any]  # the request body (its reply_to / nonce for the answer)
    deadline: float
    acks: dict[int, dict[str, Any]] = field(default_factory=dict)
    state: str = "confirming"
    missed: set[int] = field(default_factory=set)
    fired: set[int] = field(default_factory=set)  # targets whose inject_fired arrived

    def armed_steps(self) -> dict[int, int]:
        """World rank -> step it armed the fault at."""
        return {w: int(a["at_step"]) for w, a in self.acks.items() if a.get("armed")}

    def refusals(self) -> list[str]:
        return [f"world rank {w}: {a.get('reason') or 'refused'}" for w, a in sorted(self.acks.items())
                if not a.get("armed")]


def confirm_within(body: dict[str, Any]) -> float:
    """The request's ``confirm_within_s`` clamped to :data:`CONFIRM_RANGE_S` (default :data:`CONFIRM_DEFAULT_S`)."""
    v = body.get("confirm_within_s")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
        return CONFIRM_DEFAULT_S
    return min(max(float(v), CONFIRM_RANGE_S[0]), CONFIRM_RANGE_S[1])


def fired_path(run_dir: str | Path, request_id: str, world_rank: int) -> Path:
    """Where :class:`phoenix_hpc.faults.trigger.FiredFile` records that ``world_rank`` fired ``request_id``."""
    from phoenix_hpc.faults.trigger import FAULTS_DIR, fired_name

    return Path(run_dir) / FAULTS_DIR / fired_name(request_id, world_rank)


def verdict(req: PendingInject) -> str | None:
    """``armed`` / ``refused`` once every target answered (refused as soon as one refused); None while
    waiting. Pure."""
    if any(not a.get("armed") for a in req.acks.values()):
        return "refused"
    if set(req.acks) >= set(req.targets):
        return "armed"
    return None


# (world rank, shard id) of a live holder of the shard the first of the given owners holds, or (None, why)
HolderOf = Callable[[list[int]], "tuple[tuple[int, str] | None, str]"]
HasFired = Callable[[str, int], bool]  # (request id, world rank) -> its landing record exists


class InjectBook:
    """The coordinator's fault-injection requests by request id (``requests``), and the rules that move
    them (module docstring). Every method returns an :class:`~phoenix_hpc.control.commands.Outcome`."""

    def __init__(self) -> None:
        self.requests: dict[str, PendingInject] = {}

    def request(self, body: dict[str, Any], *, slots: Mapping[int, Slot], rank_map: Mapping[int, int],
                grid: tuple[int, int, int] | None, job_state: JobState, holder_of: HolderOf, now: float,
                new_id: Callable[[], str]) -> Outcome:
        """An ``inject`` request: refused (naming the field, the value and what is allowed), or recorded
        and forwarded to its target slots, its answer held until they confirm. ``now``: coordinator clock,
        seconds; ``new_id``: a fresh request id when the request has none.

        Raises:
            ValueError, TypeError: a target rank or coordinate that is not an integer (refused by the caller).
        """
        kind, phase, at_step = body.get("kind"), body.get("phase"), body.get("at_step")

        def refuse(why: str) -> Outcome:
            return Outcome([], [Reject(f"inject: {why}", body)])

        if kind not in P.INJECT_KINDS:
            return refuse(f"kind {kind!r} not one of {', '.join(P.INJECT_KINDS)}")
        if phase not in P.INJECT_PHASES:
            return refuse(f"phase {phase!r} not one of {', '.join(P.INJECT_PHASES)}")
        if why := step_count_refusal("at_step", at_step):
            return refuse(why)
        if job_state in TERMINAL_JOB_STATES:
            return refuse(f"the job is {job_state.value}")
        targets, why = resolve_target(body.get("target"), slots, rank_map, grid)
        if not targets:
            return refuse(why)
        extra: dict[str, Any] = {}
        if kind == "corrupt_replica":  # the target names the shard (by its owner); one holder of it corrupts
            holder, why = holder_of(targets)
            if holder is None:
                return refuse(why)
            targets, extra = [holder[0]], {"shard_id": holder[1]}
        live_step = max((slots[w].step for w in targets), default=0)
        ahead = body.get("steps_ahead")
        if ahead is not None:
            if why := step_count_refusal("steps_ahead", ahead):
                return refuse(why)
            at_step = max(at_step, live_step + ahead)
        if at_step <= live_step:
            return refuse(f"step {at_step} already done by the target (at step {live_step})")
        rid = str(body.get("request_id") or new_id())
        if rid in self.requests:
            return refuse(f"request id {rid!r} was already used")
        # the targets decide (they know the step they are in); the answer waits for them
        self.requests[rid] = PendingInject(rid, kind, phase, at_step, targets, body,
                                           deadline=now + confirm_within(body))
        msg = {"type": "inject", "kind": kind, "at_step": at_step, "phase": phase, "request_id": rid, **extra}
        if ahead is not None:
            msg["steps_ahead"] = ahead
        return Outcome([E.InjectForwarded(kind=kind, phase=phase, at_step=at_step, targets=targets,
                                          target=body.get("target"), request_id=rid, **extra)],
                       [Hold(body), *(Send(w, msg) for w in targets)])

    def ack(self, world_rank: int, body: dict[str, Any], *, live: Callable[[int], bool]) -> Outcome:
        """A target armed or refused an injection (or answered a ``disarm``): once every target armed, the
        request is accepted; one refusal refuses it. ``live``: whether a world rank's slot is live."""
        req = self.requests.get(str(body.get("request_id")))
        if req is None or world_rank not in req.targets or req.state != "confirming":
            return Outcome.none()
        req.acks[world_rank] = body
        v = verdict(req)
        if v == "refused":
            return self._refuse(req, "; ".join(req.refusals()), live)
        if v != "armed":
            return Outcome.none()
        req.state = "armed"
        steps = req.armed_steps()
        return Outcome(
            [E.InjectArmed(request_id=req.request_id, armed_steps=sorted(steps.items()),
                           started_steps=sorted((w, a.get("started_step")) for w, a in req.acks.items()))],
            [Release(req.request, {"type": "accepted", "targets": req.targets, "request_id": req.request_id,
                                   "at_step": max(steps.values()), "armed_steps": sorted(steps.items())})])

    def fired(self, world_rank: int, body: dict[str, Any]) -> Outcome:
        """A target's injection fired (sent just before the effect; the landing file is written first)."""
        from phoenix_hpc.faults.trigger import landed_exactly

        req = self.requests.get(str(body.get("request_id")))
        if req is None:
            return Outcome.none()
        armed = req.armed_steps().get(world_rank)
        req.fired.add(world_rank)
        exact = armed is not None and landed_exactly(body.get("step"), body.get("phase"), armed, req.phase)
        return Outcome([E.InjectLanded(request_id=req.request_id, world_rank=world_rank, step=body.get("step"),
                                       phase=body.get("phase"), at_step=armed, exact=exact)], [])

    def lost(self, worlds: list[int], why: str, *, live: Callable[[int], bool], has_fired: HasFired) -> Outcome:
        """Slots ``worlds`` are gone: requests they still had to confirm are refused, armed ones they had not
        fired are missed."""
        out = Outcome.none()
        for req in list(self.requests.values()):
            hit = [w for w in worlds if w in req.targets]
            if not hit:
                continue
            if req.state == "confirming":
                out.add(self._refuse(req, f"world rank(s) {hit} lost before confirming ({why})", live))
            elif req.state == "armed":
                out.add(self._missed(req, hit, has_fired, lambda w, r=req: (
                    f"world rank {w} was lost before step {r.armed_steps().get(w)} ({why})")))
        return out

    def tick(self, now: float, *, live: Callable[[int], bool]) -> Outcome:
        """Requests whose targets did not all confirm within the request's time are refused."""
        out = Outcome.none()
        for req in list(self.requests.values()):
            if req.state == "confirming" and now > req.deadline:
                silent = sorted(set(req.targets) - set(req.acks))
                out.add(self._refuse(req, f"world rank(s) {silent} did not confirm within "
                                          f"{confirm_within(req.request):g} s (an active slot reads its "
                                          "instructions from its registration on, at least once per step: one "
                                          "that does not answer is hung or overloaded; allow a longer "
                                          "--timeout-s)", live))
        return out

    def at_end(self, state: JobState, *, live: Callable[[int], bool], has_fired: HasFired) -> Outcome:
        """The job ends (``state``): requests being confirmed are refused, armed ones that did not fire are
        missed."""
        out = Outcome.none()
        for req in list(self.requests.values()):
            if req.state == "confirming":
                out.add(self._refuse(req, f"the job ended ({state.value})", live))
            elif req.state == "armed":
                out.add(self._missed(req, req.targets, has_fired, lambda w, r=req: (
                    f"the job ended ({state.value}) before step {r.armed_steps().get(w)}, phase {r.phase}")))
        return out

    @staticmethod
    def _refuse(req: PendingInject, reason: str, live: Callable[[int], bool]) -> Outcome:
        """Refuse a request still being confirmed: disarm it where it may be armed (also at targets yet to
        answer: their queue holds the inject, then this disarm), journal, answer."""
        req.state = "refused"
        return Outcome([E.InjectRefused(request_id=req.request_id, reason=reason, targets=req.targets)],
                       [*(Send(w, {"type": "disarm", "request_id": req.request_id}) for w in req.targets if live(w)),
                        CountRejected(), Release(req.request, {"type": "rejected", "reason": f"inject: {reason}"})])

    @staticmethod
    def _missed(req: PendingInject, worlds: list[int], has_fired: HasFired,
                reason: Callable[[int], str]) -> Outcome:
        """Targets among ``worlds`` of an armed request that neither fired nor were missed already: missed."""
        events: list[E.Event] = []
        for w in [w for w in req.targets if w in worlds]:
            if w not in req.missed and w not in req.fired and not has_fired(req.request_id, w):
                req.missed.add(w)
                events.append(E.InjectMissed(request_id=req.request_id, world_rank=w,
                                             at_step=req.armed_steps().get(w), reason=reason(w)))
        return Outcome(events, [])
