"""The Slurm jobs of one run (a run resumed with ``phoenix submit --resume``, or chained with
``resources.chain``), each with where it started, how far it got, how it ended and the steps its end lost.

Per job, from ``job.json``'s ``jobs`` list, the journal (records from each job's ``coordinator_started``,
which names its ``job_id``, to the next one) and Slurm's record of the job, when Slurm still has one:

- ``resume_step``: the complete checkpoint it started from (None: the training started at step 0);
- ``last_step``: the newest step it is known to have finished (journal ``progress``, ``commit``,
  ``checkpoint`` and ``job_done``, and the steps its ranks logged between its ``started_at`` and the next
  job's: the journal lags the ranks, and a job whose coordinator died journals nothing more);
- ``end``: the final journal record (``job_done``, ``coordinator_stopped``, ``clean_stop``, ``fallback``),
  else ``none`` (its coordinator was killed: no final record), ``running`` or ``queued``;
- ``cause``: what ended it: ``finished``, ``time limit`` (SIGUSR1), ``SIGTERM``, ``stop requested``,
  ``failure`` (clean stop, fallback), ``batch-host loss`` (no final record, and Slurm ended the job as
  NODE_FAIL, removed the batch host from the job's node list, as it does for a ``--no-kill`` job, or shows
  it down), ``coordinator loss`` (no final record otherwise);
- ``committed_step``: the newest step it committed (journal ``commit``, ``checkpoint``, ``job_done``);
- ``lost_steps``: for a job that another job continued, ``last_step - next resume_step`` (steps finished
  and trained again), or ``last_step`` when the next job started over; ``committed_lost_steps`` the same
  for ``committed_step`` (0 after a planned end: its final checkpoint holds the committed step).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from phoenix_hpc.control import events as E
from phoenix_hpc.control.view import job_segments
from phoenix_hpc.slurm.client import ACTIVE_JOB_STATES
from phoenix_hpc.status.model import RunJobStatus

_END_EVENTS = E.JOB_END_EVENTS
_ACTIVE = ACTIVE_JOB_STATES
_DOWN = ("DOWN", "FAIL", "NOT_RESPONDING")


def _segments(records: list[Mapping[str, Any]]) -> list[tuple[str | None, list[Mapping[str, Any]]]]:
    """The journal cut into its jobs (:func:`phoenix_hpc.control.view.job_segments`): (its job_id, its
    records) for each segment that begins with a ``coordinator_started``."""
    return [(str(seg[0]["job_id"]) if seg[0].get("job_id") is not None else None, seg)
            for seg in job_segments(records) if seg[0].get("event") == E.CoordinatorStarted.NAME]


def _last_step(seg: list[Mapping[str, Any]]) -> int | None:
    steps: list[int] = []
    for r in seg:
        ev = r.get("event")
        for key in {E.Progress.NAME: ("step",), E.Commit.NAME: ("recoverable_step",), E.Checkpoint.NAME: ("step",),
                    E.JobDone.NAME: ("step",)}.get(ev, ()):
            if isinstance(r.get(key), int):
                steps.append(int(r[key]))
    return max(steps) if steps else None


def _newest(*steps: int | None) -> int | None:
    return max((s for s in steps if s is not None), default=None)


def _committed(seg: list[Mapping[str, Any]]) -> int | None:
    steps = [int(r["recoverable_step"]) for r in seg if r.get("event") == E.Commit.NAME
             and isinstance(r.get("recoverable_step"), int)]
    steps += [int(r["step"]) for r in seg if r.get("event") in (E.Checkpoint.NAME, E.JobDone.NAME) and isinstance(r.get("step"), int)]
    return max(steps) if steps else None


def _cause(end: Mapping[str, Any] | None, slurm_job: Mapping[str, str] | None,
           node_states: Mapping[str, str | None]) -> str | None:
    """What ended a job (module doc). Without a final journal record, Slurm's record decides: a job it shows
    CANCELLED was cancelled (``scancel``: SIGTERM, then SIGKILL after KillWait, scancel(1)), whatever its
    coordinator managed to write."""
    if end is not None:
        ev = end.get("event")
        if ev == E.JobDone.NAME:
            return "finished"
        if ev == E.CoordinatorStopped.NAME:
            sig = end.get("signal")
            return {"USR1": "time limit", "TERM": "SIGTERM"}.get(sig, f"SIG{sig}" if sig else "stop requested")
        return "failure"
    sj = slurm_job or {}
    state = sj.get("JobState")
    host = sj.get("BatchHost")
    host_state = str(node_states.get(host) or "") if host else ""
    from phoenix_hpc.hostlist import expand

    nodes = sj.get("NodeList")
    try:
        excised = bool(host and nodes and nodes != "(null)" and host not in expand(nodes))
    except Exception:  # noqa: BLE001 -- an unreadable node list proves nothing
        excised = False
    if state == "NODE_FAIL" or excised or any(d in host_state.upper() for d in _DOWN):
        return "batch-host loss"
    if str(state or "").startswith("CANCELLED"):
        return "scancel"
    return "coordinator loss"


def _logged_step(rank_steps: Iterable[tuple[float, int]], start: Any, end: Any) -> int | None:
    """The newest step the ranks logged at ``start <= ts < end`` (None bounds: open); None without a start."""
    if not isinstance(start, (int, float)):
        return None
    hi = float(end) if isinstance(end, (int, float)) else float("inf")
    return max((s for ts, s in rank_steps if start <= ts < hi), default=None)


def run_jobs(entries: Iterable[Mapping[str, Any]], records: Iterable[Mapping[str, Any]],
             slurm_jobs: Mapping[str, Mapping[str, str]], node_states: Mapping[str, str | None],
             rank_steps: Iterable[tuple[float, int]] = (), slurm_unreachable: bool = False) -> list[RunJobStatus]:
    """The run's jobs, oldest first. Pure.

    Args:
        entries: ``job.json``'s ``jobs`` (job_id, resume_step, chain_index, after).
        records: the whole journal, in file order.
        slurm_jobs: ``scontrol show job`` records by job id (jobs Slurm forgot are absent).
        node_states: Slurm's state per node name (for the batch hosts).
        rank_steps: ``(ts, step)`` the ranks logged (``ranks/rank*.steps.jsonl``), seconds since the epoch.
        slurm_unreachable: no Slurm controller could be asked: the newest job without a final record is
            ``unknown`` (it may be running), not ended by a coordinator loss.
    """
    entries = [dict(e) for e in entries if "job_id" in e]
    rank_steps = list(rank_steps)
    segs = _segments(list(records))
    by_id = {jid: seg for jid, seg in segs if jid is not None}
    anonymous = [seg for jid, seg in segs if jid is None]
    out: list[RunJobStatus] = []
    for i, e in enumerate(entries):
        jid = str(e["job_id"])
        seg = by_id.get(jid) or (anonymous[i] if i < len(anonymous) else None)
        sj = slurm_jobs.get(jid)
        state = (sj or {}).get("JobState")
        end = next((r for r in reversed(seg or []) if r.get("event") in _END_EVENTS), None)
        if end is not None:
            end_name, cause = str(end["event"]), _cause(end, sj, node_states)
        elif seg is None:
            end_name, cause = ("queued" if state in (None, "PENDING") else "not started"), None
        elif state in _ACTIVE:
            end_name, cause = "running", None
        elif sj is None and slurm_unreachable and i == len(entries) - 1:
            end_name, cause = "unknown", None  # Slurm could not be asked: it may still be running
        else:
            end_name, cause = "none", _cause(None, sj, node_states)
        out.append(RunJobStatus(job_id=jid, chain_index=int(e.get("chain_index") or 0), after=e.get("after"),
                                resume_step=e.get("resume_step"),
                                last_step=_newest(_last_step(seg or []), _logged_step(
                                    rank_steps, e.get("started_at"),
                                    entries[i + 1].get("started_at") if i + 1 < len(entries) else None)),
                                committed_step=_committed(seg or []),
                                slurm_state=state, batch_host=(sj or {}).get("BatchHost"), end=end_name,
                                cause=cause, signal=end.get("signal") if end else None, lost_steps=None))
    for a, b in zip(out, out[1:]):
        if b.end in ("queued", "not started") or a.last_step is None:
            continue
        a.lost_steps = max(0, a.last_step - (b.resume_step or 0))
        if a.committed_step is not None:
            a.committed_lost_steps = max(0, a.committed_step - (b.resume_step or 0))
    return out
