"""The rules of the reports a member sends while it trains, as pure functions: a ``fault`` from inside a
step, and ``done`` at the end of the training.

- :func:`fault_report`: the journal's ``fault`` record of a report, and the fault to queue for arbitration
  (:mod:`phoenix_hpc.control.arbitration`), or none when the report is *superseded*: an error of an older
  generation's collectives, or of the collectives a stop (a planned end, an external signal such as
  scancel's SIGTERM) or the job's end broke off is a consequence, not a fault.
- :func:`all_done` and :func:`job_done`: the job is done once every member of the rank map reported
  ``done`` while it runs (or replays the last recovery's steps); the final hash is SHA-256 over the members'
  state hashes in logical-rank order.
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping

from phoenix_hpc.control import events as E
from phoenix_hpc.control.classify import Fault, FaultKind, kind_from_exception
from phoenix_hpc.control.states import JobState, RecoveryPhase


def fault_report(body: Mapping[str, Any], *, world_rank: int, node: str, slot_generation: int, generation: int,
                 stopping: bool) -> tuple[E.Fault, Fault | None]:
    """The ``fault`` record of a member's report ``body`` and the fault to queue (None: superseded).
    ``slot_generation``: the generation of the reporting slot (a report without one is of it);
    ``generation``: the job's; ``stopping``: a planned end or a stop is under way, or the job ended. The
    fault's kind is the report's ``kind`` when known, else read from its exception
    (:func:`phoenix_hpc.control.classify.kind_from_exception`). A ``silent_corruption`` report's
    ``corrupt_step`` (and ``agreed_step``, below it) become the fault's ``bad_step`` (``agreed_step``):
    a step that is not a non-negative integer is ignored, and so is an agreed step not below the bad one.
    Pure.

    Raises:
        TypeError, ValueError: a generation that is not an integer (the caller rejects the message).
    """
    kind_s = body.get("kind")
    kind = FaultKind(kind_s) if kind_s in FaultKind._value2member_map_ else kind_from_exception(
        str(body.get("exc_type", "")), str(body.get("message", "")))
    g = int(body.get("generation", slot_generation))
    superseded = g < generation or stopping or bool(body.get("signalled"))
    record = E.Fault(world_rank=world_rank, node=node, generation=g, step=body.get("step"),
                     phase=body.get("phase"), kind=kind.value, exc_type=body.get("exc_type"),
                     message=str(body.get("message", ""))[:500], superseded=superseded)
    if superseded:
        return record, None
    detail = f"{body.get('exc_type', '')}: {body.get('message', '')}"[:300]
    bad, agreed = _step_or_none(body.get("corrupt_step")), _step_or_none(body.get("agreed_step"))
    if kind is not FaultKind.SILENT_CORRUPTION or (agreed is not None and (bad is None or agreed >= bad)):
        bad = agreed = None  # only a disagreement names a step to roll back before, and agrees before it
    return record, Fault(kind, (world_rank,), (node,), False, detail, bad_step=bad, agreed_step=agreed)


def _step_or_none(v: Any) -> int | None:
    """A step of a report: a non-negative int, else None (ignored)."""
    return v if type(v) is int and v >= 0 else None


def all_done(done: Mapping[int, Any], *, members: int, grid: Any, job_state: JobState,
             phase: RecoveryPhase | str | None) -> bool:
    """Whether the training is over: every one of the ``members`` logical ranks reported ``done`` (``done``:
    logical rank -> its report), the grid is known, the job runs, and no recovery is in progress except one
    replaying its steps (``phase``: the recovery's phase, None when there is none). Pure."""
    return bool(grid) and len(done) == members and job_state is JobState.RUNNING and (
        phase is None or phase == RecoveryPhase.REPLAY)


def job_done(done: Mapping[int, Mapping[str, Any]], *, grid: Any, generation: int) -> E.JobDone:
    """The ``job_done`` record: the final hash (SHA-256 over the members' ``state_hash`` in logical-rank
    order), the newest step, whether every member ended at the same step, and the rank hashes. Pure."""
    steps = {d["step"] for d in done.values()}
    h = hashlib.sha256()
    for r in sorted(done):
        h.update(done[r]["state_hash"].encode())
    return E.JobDone(final_hash=h.hexdigest(), step=max(steps), grid=list(grid), steps_agree=len(steps) == 1,
                     generation=generation, rank_hashes=[done[r]["state_hash"] for r in sorted(done)])
