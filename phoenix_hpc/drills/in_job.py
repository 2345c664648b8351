"""Drills of the in-job checkpoint-restart baseline (``resilience.mode: checkpoint-restart`` with
``resilience.checkpoint.restart: in-job``), so a user can compare it with the hot swap on their own site
with the same ``phoenix drill``.

In that mode every fault ends the srun step: the coordinator journals ``restart_in_job {dead_nodes,
checkpoint_step}`` and exits, the batch script starts a new srun step (and a new coordinator, whose
``coordinator_started`` opens the step's records) on the allocation's nodes without the dead ones, and
every rank restores the newest persistent checkpoint (:mod:`phoenix_hpc.control.in_job`). A fault therefore
costs one whole node of the allocation (the dead slot's node leaves the job even when only the process
died), and the steps since the checkpoint are trained again. All functions here are pure.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from phoenix_hpc.control import events as E
from phoenix_hpc.errors import FaultError

IN_JOB_KINDS: tuple[str, ...] = ("crash", "kill-node", "hang")
"""Kinds an in-job drill draws and accepts: each one makes the coordinator declare a slot dead, which ends
the srun step. ``transient``, ``link-down`` and ``gpu-error`` are refused: their slot's node stays in the job
(it reported the error itself), so they would test nothing that a crash does not; ``corrupt-replica``
needs in-memory replicas, which this mode does not keep."""

IN_JOB_PHASES: tuple[str, ...] = ("forward", "optimizer")
"""Phases an in-job drill draws: those of every training step in this mode. ``d2h`` and ``h2h`` are the
in-memory protection's, which this mode does not run; ``recovery`` is never drawn by a drill."""

ACTION = "in_job_restart"  # the recovery action of every fault in this mode (the coordinator's end reason)

PHASES = ("detect", "teardown", "relaunch", "replay")
"""The phases an in-job drill reports, in seconds: *detect* the fault landed -> the coordinator's first record
of it (``slots_dead``/``fault``/``decision``); *teardown* -> the old srun step ended and the next step's
nodes were chosen (``RUN_DIR/in_job_restarts.jsonl``); *relaunch* -> the new step's coordinator started;
*replay* -> the new step's ranks (restore of the checkpoint included) reported a step at or past the fault's
step (``progress``/``commit`` records, so to within ``progress_interval_s``)."""

_DETECTION = (E.SlotsDead.NAME, E.Fault.NAME, E.Decision.NAME)


def drill_mode(enabled: bool, mode: str, restart: str) -> str:
    """Which drill a config allows: ``"phoenix"`` (hot swap) or ``"in-job"`` (the in-job baseline).

    Raises:
        FaultError: resilience off, or ``mode: checkpoint-restart`` with ``checkpoint.restart: requeue`` (a
            requeue ends the Slurm job: there is no job left to inject the next fault into); the message
            names the fields, their values and what is allowed.
    """
    if enabled and mode == "phoenix":
        return "phoenix"
    if enabled and mode == "checkpoint-restart" and restart == "in-job":
        return "in-job"
    raise FaultError("resilience: a drill needs resilience.enabled = true and either resilience.mode = phoenix, or "
                     "resilience.mode = checkpoint-restart with resilience.checkpoint.restart = in-job (got "
                     f"enabled={enabled}, mode={mode!r}, checkpoint.restart={restart!r})")


def check_kinds(kinds: Sequence[str]) -> None:
    """Raises FaultError naming a kind an in-job drill does not accept (or that is no fault kind at all),
    and the allowed ones."""
    from phoenix_hpc.faults.kinds import KINDS

    for k in kinds:
        if k not in KINDS:
            raise FaultError(f"--kinds: {k!r} is not a fault kind; allowed with resilience.checkpoint.restart = "
                             f"in-job: {', '.join(IN_JOB_KINDS)}")
        if k not in IN_JOB_KINDS:
            raise FaultError(f"--kinds: {k!r} is not allowed with resilience.checkpoint.restart = in-job; allowed: "
                             f"{', '.join(IN_JOB_KINDS)}")


def _new_step_at(records: Sequence[Mapping[str, Any]], after: float) -> int | None:
    """Index of the first ``coordinator_started`` of a new srun step (not a restarted coordinator) at or
    after ``after``."""
    return next((i for i, r in enumerate(records) if r.get("event") == E.CoordinatorStarted.NAME
                 and not r.get("restart") and float(r["ts"]) >= after), None)


def _back_at(records: Iterable[Mapping[str, Any]], step: int) -> float | None:
    """When the records first show the job at or past ``step`` (``progress``, ``commit``) or finished."""
    return next((float(r["ts"]) for r in records if (
        (r.get("event") == E.Progress.NAME and int(r.get("step") or 0) >= step)
        or (r.get("event") == E.Commit.NAME and int(r.get("recoverable_step") or 0) >= step)
        or r.get("event") == E.JobDone.NAME)), None)


def match_in_job(out, records: Sequence[Mapping[str, Any]], fired: Iterable[Mapping[str, Any]],
                 restarts: Sequence[Mapping[str, Any]], before_ts: float | None = None):
    """Fill a :class:`phoenix_hpc.drills.drill.DrillOutcome` of an in-job drill from the whole journal of the
    Slurm job (every srun step's records, oldest first), the landing records (``faults/fired-*.json``) and
    ``in_job_restarts.jsonl``: the first ``restart_in_job`` at or after the fault landed (and before
    ``before_ts``, the next fault's landing) is the restart it caused; :data:`PHASES` are measured as
    documented there, each as far as the records reach. ``steps_replayed``: the completed steps trained
    again, ``landed step - 1 - checkpoint step`` (the step the fault hit was not completed; no checkpoint:
    from step 0). ``recovery_state`` is ``restarting`` from the restart request on and ``done`` once the new
    step is back at the fault's step. Returns ``out``."""
    from phoenix_hpc.faults.kinds import PHASE_OF_WIRE  # the landing records name the wire phase

    out.action = out.recovery_state = out.total_s = out.steps_replayed = out.detect_s = None
    out.phases = {}
    out.landed = [{"world_rank": int(f["world_rank"]), "step": f.get("step"),
                   "phase": PHASE_OF_WIRE.get(str(f.get("phase")), f.get("phase")), "ts": float(f["ts"])}
                  for f in fired if f.get("request_id") == out.request_id and f.get("world_rank") is not None]
    if not out.landed:
        return out
    t_landed = min(f["ts"] for f in out.landed)
    step = max((f["step"] for f in out.landed if isinstance(f["step"], int)), default=None)
    req = next((r for r in records if r.get("event") == E.RestartInJob.NAME and float(r["ts"]) >= t_landed
                and (before_ts is None or float(r["ts"]) < before_ts)), None)
    if req is None:
        return out
    out.action, out.recovery_state = ACTION, "restarting"
    if step is not None:
        out.steps_replayed = max(0, step - 1 - int(req.get("checkpoint_step") or 0))
    seen = [float(r["ts"]) for r in records if r.get("event") in _DETECTION and float(r["ts"]) >= t_landed]
    marks = [t_landed, min(seen, default=float(req["ts"]))]  # the ends of PHASES in order, as far as known
    t_end = next((float(x["ts"]) for x in restarts if float(x["ts"]) >= float(req["ts"])), None)
    i = _new_step_at(records, t_end) if t_end is not None else None
    if i is not None:
        marks += [t_end, float(records[i]["ts"])]
        back = _back_at(records[i:], step or 0)
        if back is not None:
            marks.append(back)
            out.recovery_state, out.total_s = "done", round(back - t_landed, 3)
    elif t_end is not None:
        marks.append(t_end)
    out.phases = {p: round(b - a, 3) for p, a, b in zip(PHASES, marks, marks[1:])}
    out.detect_s = out.phases["detect"]
    return out


def restarting(records: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the newest srun step's records (:func:`phoenix_hpc.status.derive.current_job_records`) hold
    an in-job restart request: its coordinator's end is then the step's, not the job's (the batch script is
    starting the next step). :attr:`phoenix_hpc.status.model.JobInfo.in_job_restart` says the same of the
    records a status was derived from."""
    from phoenix_hpc.status.derive import current_job_records, restart_requested

    return restart_requested(current_job_records(records))


def run_over(finished: bool, slurm_state: str | None, restart: bool) -> bool:
    """Whether an in-job drill's job is over: the status of its newest srun step says it ended and that end
    was not an in-job restart (``restart``: that status's ``job.in_job_restart``, or :func:`restarting` of the
    records it was derived from; never of records read at another moment, which may already belong to the
    next step while the status still shows the last one's end), or Slurm no longer runs the job (not one of
    :data:`phoenix_hpc.slurm.client.ACTIVE_JOB_STATES`; e.g. too few nodes left for another step)."""
    from phoenix_hpc.slurm.client import ACTIVE_JOB_STATES

    if slurm_state is not None and slurm_state not in ACTIVE_JOB_STATES:
        return True
    return finished and not restart
