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

The book is plain data plus pure transitions; the coordinator does the sending, replying and journalling.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


def unfired(req: PendingInject, run_dir: str | Path, worlds: list[int] | None = None) -> list[int]:
    """Targets of an armed request (of ``worlds`` if given) that have not fired and are not already missed."""
    cand = req.targets if worlds is None else [w for w in req.targets if w in worlds]
    return [w for w in cand if w not in req.missed and w not in req.fired
            and not fired_path(run_dir, req.request_id, w).exists()]
