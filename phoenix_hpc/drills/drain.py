"""Build, validate and send a planned-drain request (``phoenix drain``), then follow it until it was done or
missed.

:func:`build_drain` checks the request against the job's current :class:`~phoenix_hpc.status.model.Status`
(pure; a refusal is a :class:`~phoenix_hpc.errors.FaultError`, exit code 2, and nothing is sent). The
coordinator checks it again on its own view (a spare left on another node, no recovery or other drain in
progress) and arms every active slot (:mod:`phoenix_hpc.control.drains`); its answer comes once they all
armed. :func:`wait_drain` then follows the journal until ``drain_done`` or ``drain_missed``.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from phoenix_hpc.control import events as E
from phoenix_hpc.drills.inject import resolve_target
from phoenix_hpc.errors import ControlError, FaultError, FaultMissed
from phoenix_hpc.status.model import Status


@dataclass(frozen=True)
class DrainRequest:
    """A validated drain. ``target``: the wire target (``{"logical_rank": r}``, ``{"node": name}`` or
    ``{"coord": [pp, dp, tp]}``); ``slots``: the world ranks it names now."""

    target: dict[str, Any]
    slots: tuple[int, ...]
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    shrink: bool = False  # remove the target's DP replica (dp - 1) instead of moving it onto spares
    at_step: int | None = None  # pause at the commit fence of exactly this iteration (else the coordinator picks)

    def body(self) -> dict[str, Any]:
        """The ``drain`` message body of the control protocol."""
        return {"type": "drain", "target": dict(self.target), "request_id": self.request_id,
                **({"shrink": True} if self.shrink else {}),
                **({"at_step": int(self.at_step)} if self.at_step is not None else {})}


def build_drain(st: Status, *, rank: int | None = None, node: str | None = None,
                coord: str | None = None, shrink: bool = False, at_step: int | None = None) -> DrainRequest:
    """Validate a drain against the job's status and resolve its target. Pure.

    ``shrink``: remove the DP replica(s) of the target instead of moving it onto spares (docs/design.md
    section 6, "Shrink"; the coordinator refuses one that would leave dp < 1 or an engine that cannot);
    ``at_step``: the iteration at whose commit fence every member pauses (recoverable step ``at_step - 1``);
    refused by the coordinator when a member already started it (never moved to a later one).

    Raises:
        FaultError: not exactly one target; a finished job or one not training yet; a rank, coordinate or
            node outside the job or without a live slot; a node (or rank) that holds only standby spares;
            no spare left on another node without ``shrink``; ``at_step`` below 1 or past the last step.
    """
    job = st.job
    if st.finished or job.state == "ended":
        raise FaultError(f"job {job.job_id or job.run_dir} is {job.state}"
                         f"{' (Slurm: ' + job.slurm_state + ')' if job.slurm_state else ''}: "
                         "nothing to drain; nothing was sent")
    if not st.slots or job.coordinator is None or job.state in ("pending", "starting"):
        raise FaultError(f"job {job.job_id or job.run_dir} has not started training yet (state {job.state}); "
                         "drain once `phoenix status` shows it running; nothing was sent")
    targets, target, live = resolve_target(st, rank=rank, node=node, coord=coord,
                                           node_gone="lost, released or drained")
    spares = [s for s in targets if s.state == "standby"]
    if spares:
        raise FaultError(f"--node: {node} holds standby spares (world ranks {[s.world_rank for s in spares]}), "
                         "which hold no logical rank: a drain moves active slots; nothing was sent")
    if at_step is not None and (at_step < 1 or (st.job.steps_total is not None and at_step > st.job.steps_total)):
        raise FaultError(f"--at-step: {at_step} is not an iteration of this job (allowed: 1 .. "
                         f"{st.job.steps_total if st.job.steps_total is not None else 'its last step'}); nothing was sent")
    nodes = {s.node for s in targets}
    left = [s for s in live if s.state == "standby" and s.node not in nodes]
    if not shrink and len(left) < len(targets):
        raise FaultError(f"drain: {len(targets)} slot(s) to move but {len(left)} spare slot(s) left on other "
                         "nodes: the drain needs a spare, or --shrink to remove the slot's DP replica instead "
                         "(dp - 1); nothing was sent")
    return DrainRequest(target=target, slots=tuple(s.world_rank for s in targets), shrink=shrink, at_step=at_step)


CONFIRM_MARGIN_S = 3.0


def send_drain(run_dir: Path, req: DrainRequest, timeout_s: float = 30.0) -> dict[str, Any]:
    """Send ``req`` through the coordinator's operator channel and wait for its answer (every active slot
    armed the pause). Returns the ``accepted`` reply {request_id, targets, at_step}.

    Raises:
        FaultError: the coordinator refused the drain (the reason is in the message; nothing is armed).
        ControlError: no coordinator to reach, or no answer within ``timeout_s``.
    """
    from phoenix_hpc.control import protocol as P
    from phoenix_hpc.control.operator import operator_request

    info = P.read_coordinator_file(run_dir)
    if not info or not info.get("operator_port"):
        raise ControlError(f"{run_dir}/{P.COORDINATOR_FILE} names no coordinator operator port; nothing was sent")
    body = {**req.body(), "confirm_within_s": max(1.0, timeout_s - CONFIRM_MARGIN_S)}
    reply = operator_request(str(info["host"]), int(info["operator_port"]), body, P.read_secret(run_dir), timeout_s)
    if reply.get("type") != "accepted":
        raise FaultError(f"the coordinator refused the drain: {reply.get('reason', reply)}; nothing was changed")
    return reply


def drain_outcome(request_id: str, records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The journal's ``drain_done`` or ``drain_missed`` record of ``request_id``, or None. Pure."""
    for r in records:
        if r.get("request_id") == request_id and r.get("event") in (E.DrainDone.NAME, E.DrainMissed.NAME):
            return r
    return None


def wait_drain(run_dir: Path, request_id: str, *, job_over: Callable[[], str | None], timeout_s: float = 600.0,
               poll_s: float = 0.2, clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Wait for the drain's outcome record; returns it.

    Raises:
        FaultMissed: the drain was missed (the record's reason), the job ended without an outcome, or none
            came within ``timeout_s``.
    """
    from phoenix_hpc.control.journal import read_journal

    t0 = clock()
    while True:
        rec = drain_outcome(request_id, read_journal(run_dir))
        if rec is not None:
            if rec["event"] == E.DrainMissed.NAME:
                raise FaultMissed(f"drain {request_id} was armed but missed: {rec.get('reason')}", rec)
            return rec
        why = job_over()
        if why is not None or clock() - t0 > timeout_s:
            raise FaultMissed(f"drain {request_id}: {why or f'no outcome within {timeout_s:g} s'}",
                              {"request_id": request_id})
        sleep(poll_s)
