"""The part of the journal fold (:mod:`phoenix_hpc.control.view`) that follows each difference replica
agreement found to its end (docs/design.md section 6, *Repair from memory*): found, repaired from memory by
the recovery that rolled every member back before it and replayed, or stopped.

The records it reads, in whatever order the coordinator wrote them (the ranks' commit fence usually reports a
difference before the heartbeats carry every peer's digest, so a ``decision`` may come before the
``silent_corruption`` record that names who differed):

- ``silent_corruption`` {generation, step, pp, tp, members, suspects, majority}: a difference, one
  :class:`~phoenix_hpc.control.view_records.AgreementRepair` per (step, pp, tp); the same stage and step again
  from a generation that a recovery for it already started is a *second* difference at that step;
- ``decision``: its faults' ``bad_step`` name the steps the action is for: a local recovery or hot swap
  repairs them, a clean stop stops them (``second`` when the step had been rolled back before);
- ``recovery_start`` / ``recovery_plan`` / ``recovery_done``: the recovery of each decided difference, the
  step it restored and the steps it replayed; a recovery that is superseded hands its differences on to the
  next ``recovery_start``;
- the job's end: ``clean_stop`` gives a stop its checkpoint and message, ``fallback`` ends a repair in the
  persistent checkpoint.

Functions of the view, called by the fold's handlers; no I/O, no clock.
"""

from __future__ import annotations

from typing import Any, Mapping

from phoenix_hpc.control.view_records import AgreementRepair, JobView

#: the decisions that roll every member back before a difference (docs/design.md section 6, Classification)
REPAIR_ACTIONS = ("local_recovery", "hot_swap")


def _int(x: Any) -> int | None:
    return x if type(x) is int else None


def bad_steps(faults: Any) -> list[int]:
    """The ``bad_step`` of every fault of a ``decision`` record that names one, sorted, once each. Pure."""
    return sorted({f["bad_step"] for f in faults or () if isinstance(f, Mapping) and _int(f.get("bad_step")) is not None})


def difference(v: JobView, ts: float, generation: Any, step: Any, pp: Any, tp: Any, members: Any, suspects: Any,
               majority: Any) -> None:
    """A ``silent_corruption`` record: a new difference, the same one again (the heartbeats and the ranks'
    reports both name it), the stage of one a decision named first, or a second difference at a step a
    recovery already rolled back before (its generation is that recovery's or later)."""
    step, pp, tp = int(step), _int(pp), _int(tp)
    g = _int(generation)
    sus = [int(x) for x in suspects or ()]
    maj = [int(x) for x in majority or ()]
    ranks = v.rank_maps.get(g, v.rank_map) if g is not None else v.rank_map
    named = {"members": {str(k): str(d) for k, d in dict(members or {}).items()}, "suspects": sus, "majority": maj,
             "suspect_world_ranks": [ranks[r] for r in sus if r in ranks]}
    same = [r for r in v.repairs if r.step == step and (r.pp, r.tp) in ((pp, tp), (None, None))]
    for r in same:
        if r.recovery_generation is not None and g is not None and g >= r.recovery_generation:
            r.second_generation = g if r.second_generation is None else r.second_generation
            return
    if same:
        r = same[0]
        r.pp, r.tp = pp, tp
        r.generation = r.generation if r.generation is not None else g
        if not r.members:
            for k, x in named.items():
                setattr(r, k, x)
        return
    v.repairs.append(AgreementRepair(step, pp, tp, g, float(ts), **named))


def decided(v: JobView, ts: float, action: Any, reason: Any, faults: Any) -> None:
    """A ``decision`` whose faults name ``bad_step``\\ s: a local recovery or a hot swap repairs them (their
    recovery is the next one to start), a clean stop stops them. A step no ``silent_corruption`` record named
    yet gets an entry of its own (its stage filled in when the record comes)."""
    steps = bad_steps(faults)
    if not steps or action not in (*REPAIR_ACTIONS, "clean_stop"):
        return
    for s in steps:
        mine = [r for r in v.repairs if r.step == s] or [_placeholder(v, s, ts)]
        for r in mine:
            if action == "clean_stop":
                again = r.recovery_generation is not None
                r.state = "stopped"
                r.stop = {"ts": float(ts), "reason": None if reason is None else str(reason), "second": again,
                          "checkpoint_step": None, "message": None}
            elif r.state == "found":
                r.state, r.action = "decided", str(action)


def _placeholder(v: JobView, step: int, ts: float) -> AgreementRepair:
    r = AgreementRepair(step, None, None, None, float(ts))
    v.repairs.append(r)
    return r


def recovery_started(v: JobView, generation: int, action: Any) -> None:
    """``recovery_start`` of ``generation``: it repairs the differences decided since the last one, and those
    whose recovery did not finish (superseded or aborted, then re-planned)."""
    for r in v.repairs:
        if r.state in ("decided", "repairing"):
            r.state, r.recovery_generation = "repairing", generation
            r.action = str(action) if action else r.action


def recovery_planned(v: JobView, generation: int, restored: Any, replayed: Any, done: bool = False) -> None:
    """``recovery_plan`` (``done`` False) or ``recovery_done`` of ``generation``: the step its differences
    are restored to and the steps replayed; done: repaired."""
    for r in v.repairs:
        if r.recovery_generation == generation and r.state == "repairing":
            r.restored_step = _int(restored) if restored is not None else r.restored_step
            r.steps_replayed = _int(replayed) if replayed is not None else r.steps_replayed
            if done:
                r.state = "repaired"


def job_ended(v: JobView, event: str, checkpoint_step: Any, message: Any, reason: Any) -> None:
    """The job's end: a ``clean_stop`` gives each stop its checkpoint to restart from and its message (and
    stops a repair still under way); a ``fallback`` ends a repair under way in the persistent checkpoint."""
    for r in v.repairs:
        if event == "clean_stop" and (r.state == "repairing" or (r.stop is not None and r.stop["message"] is None)):
            if r.stop is None:
                r.stop = {"ts": None, "reason": None if reason is None else str(reason), "second": False,
                          "checkpoint_step": None, "message": None}
            r.state = "stopped"
            r.stop["checkpoint_step"] = _int(checkpoint_step)
            r.stop["message"] = None if message is None else str(message)
        elif event == "fallback" and r.state == "repairing":
            r.state = "fallback"
