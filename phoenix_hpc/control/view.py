"""The job's state as one fold of its journal: ``view = apply(view, event)`` for every event, in order.

API (the running coordinator, which applies each record as it journals it (control/recorder.py), its
restart and ``phoenix status`` use the same names; what the running coordinator reads from it:
docs/design.md section 7)::

    view = JobView()                     # an empty job; JobView(heartbeat_progress=True) for old journals
    view = apply(view, event)            # one typed event (control/events.py); returns the view
    view = fold(records)                 # every record of a journal (dicts or events), bad ones skipped

:func:`apply` reads nothing and writes nothing but the view it is given (no I/O, no clock: every time is the
event's ``ts``); it updates that view in place and returns it (no copy per record: a 16k-rank job's journal
holds tens of thousands of records, and the running coordinator applies every record it journals), so a
caller that needs the state before an event keeps a :func:`copy.deepcopy`.

A record is applied whole or not at all. Each handler reads, converts and checks everything it needs of its
record (the fields it turns into numbers or grids, every pair of a rank map, every join of a plan, the slot,
request or recovery the record names) before its first change to the view; what it cannot take it refuses
there, by raising or as out of order (below), and the view is as it was. The rule rests on the order of
each handler's statements (a new handler keeps it: reads first, writes after), not on a copy.
tests/unit/test_view_all_or_nothing.py applies, for every event, records that do not fit to views folded from
real journals and checks that a skipped one changed nothing. What the view holds:

- slots (:class:`SlotView`: world rank, node, pid, role, state, logical rank, generation, failure domain) and
  the rank map of every generation (``rank_maps``), the grid and the generation each grid starts at
  (``grid_since``: a shrink changes it), the registration's placement inputs;
- progress: the live step and its history, the committed (recoverable) step and its history, per-shard
  committed steps, the replica placement the commits name, the newest persistent checkpoint;
- recoveries (:class:`RecoveryStatus`, one per generation) and the one in progress (:class:`InProgress`
  with its :class:`~phoenix_hpc.control.events.RecoveryPhase`), faults (:class:`FaultStatus`), injected
  faults (:class:`InjectionStatus`), planned drains (:class:`DrainStatus`), shrinks;
- the job's state and its end (which event ended it, why, the final hash);
- ``skipped``: every record the fold could not take, with the reason (see below).

Records of an earlier job of the same run (a resumed run appends to one journal) are dropped: a
``coordinator_started`` that is not a restart starts the view again.

Bad input never stops the fold: a record that is not an event, an event name no class declares
(a newer writer), an event whose fields are not of their declared types (a ``world_rank`` that is no
integer: :meth:`~phoenix_hpc.control.events.Event.from_record`), an event whose fields are of their types
but do not fit together (a grid of two numbers, a rank map entry that is no pair, a join with no logical
rank), an event out of order (it names a slot never registered, a request never made, a recovery never
started, a difference at no step) or one without ``ts`` (every time the view holds is a record's; the journal
stamps every record) is skipped, changing nothing, and named in ``view.skipped`` by its journal line
(``"PATH:12 (recovery_plan): ..."``, given :func:`fold`'s ``where``; ``"record 12 (...)"`` without one). A
torn last line never reaches the fold (the journal reader drops it).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

from phoenix_hpc.control import events as E
from phoenix_hpc.control import view_repairs
from phoenix_hpc.control.events import RecoveryPhase
from phoenix_hpc.control.fault_text import fault_cause, shorten
from phoenix_hpc.control.view_records import (  # noqa: F401 - the view and its records, re-exported
    LIVE_SLOT_STATES, TERMINAL_STATES, AgreementRepair, DrainStatus, FaultStatus, InjectionStatus, InProgress, JobView,
    RecoveryStatus, SlotView)
from phoenix_hpc.faults.kinds import KIND_OF_WIRE, PHASE_OF_WIRE

Grid = tuple[int, int, int]  # (tp, pp, dp)


def _v(x: Any) -> Any:
    """None for a field the record left out (:data:`~phoenix_hpc.control.events.OMIT`)."""
    return None if x is E.OMIT else x


def _out_of_order(v: JobView, ev: E.Event, why: str) -> None:
    """An event that names what the view does not hold (a request never made, a slot never registered):
    it changes nothing and is named in ``view.skipped`` (:func:`fold` puts its position in front)."""
    v.skipped.append(f"out of order at ts {ev.ts}: {why}: skipped")


def _field(ev: E.Event, name: str) -> Any:
    """A field of ``ev``, declared or in its ``extra`` (None when neither has it)."""
    return _v(getattr(ev, name, ev.extra.get(name)))


def _grid(g: Any) -> Grid:
    """``(tp, pp, dp)`` of a journal grid: ``[tp, pp, dp]`` or ``{"tp", "pp", "dp"}``."""
    if isinstance(g, Mapping):
        return int(g["tp"]), int(g["pp"]), int(g["dp"])
    tp, pp, dp = (int(x) for x in g)
    return tp, pp, dp


# --- the job and its slots ---------------------------------------------------------------------------------


def starts_job(record: Mapping[str, Any]) -> bool:
    """Whether a journal ``record`` starts a job: a ``coordinator_started`` that is not a restart within the
    job (``restart`` unset). A resumed run's journal holds one per job (``phoenix submit --resume``); what
    came before it belongs to an earlier job of the run. The one rule the fold, ``phoenix status`` and its
    job list cut a journal by. Pure."""
    return record.get("event") == E.CoordinatorStarted.NAME and not record.get("restart")


def job_segments(records: Iterable[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """``records`` cut before every record that :func:`starts_job`, in order; records before the first such
    record (a journal that begins with a restart) form the first segment. Empty for no records. Pure."""
    out: list[list[Mapping[str, Any]]] = []
    for r in records:
        if starts_job(r) or not out:
            out.append([r])
        else:
            out[-1].append(r)
    return out


def _started(v: JobView, ev: E.CoordinatorStarted) -> JobView:
    new_job = starts_job({"event": ev.NAME, "restart": ev.restart})
    grid = _grid(ev.grid) if ev.grid and (new_job or v.grid is None) else None  # read before any change
    if new_job:  # what came before belongs to an earlier job
        v = JobView(heartbeat_progress=v.heartbeat_progress, skipped=v.skipped)
    else:
        v.restarts += 1
    v.started_at = v.started_at or ev.ts
    if grid is not None and v.grid is None:
        v.grid = grid
    return v


def _test_env(v: JobView, ev: E.TestEnv) -> None:
    v.test_env = {str(k): str(x) for k, x in dict(ev.variables or {}).items()}


def _registered(v: JobView, ev: E.Registered) -> None:
    w = int(ev.world_rank)
    role = str(ev.role or "active")
    lr = None if ev.logical_rank is None else int(ev.logical_rank)
    pi = _v(ev.placement_inputs) or {}
    domain = dict(pi["domain"]) if pi.get("domain") else None
    inputs = {"k": int(pi["k"]), "levels": list(pi["levels"])} if pi and v.placement_inputs is None else None
    v.slots[w] = SlotView(w, str(ev.node if ev.node is not None else "?"), ev.pid,
                          "active" if role == "active" else "standby", lr, 0 if role == "active" else None,
                          role=role, domain=domain)
    if inputs is not None:
        v.placement_inputs = inputs
    if lr is not None:
        v.rank_map[lr] = w
        v.rank_map0[lr] = w


def _pairs(rank_map: Any) -> list[tuple[int, int]]:
    """``[(logical rank, world rank), ...]`` of a journal rank map ``[[logical, world], ...]``.

    Raises:
        ValueError: an entry is not a pair.
    """
    return [(int(lr), int(w)) for lr, w in rank_map or []]


def _job_running(v: JobView, ev: E.JobRunning) -> None:
    grid, pairs = _grid(ev.grid) if ev.grid else None, _pairs(ev.rank_map)
    v.job_state, v.running = "running", True
    if grid is not None:
        v.grid = grid
    for lr, w in pairs:
        v.rank_map[lr] = w
        v.rank_map0.setdefault(lr, w)
    v.rank_maps[0] = dict(v.rank_map)


def _heartbeat_summary(v: JobView, ev: E.HeartbeatSummary) -> None:
    v.generation = max(v.generation, int(ev.generation or 0))
    if ev.job_state and v.job_state not in TERMINAL_STATES:
        v.job_state = str(ev.job_state)
    for w in ev.dead or []:
        s = v.slots.get(int(w))
        if s is not None:
            s.state = "dead"
    if v.heartbeat_progress:
        v.step_seen(ev.ts, ev.max_step)


def _slots_dead(v: JobView, ev: E.SlotsDead) -> None:
    for w in ev.slots or []:
        s = v.slots.get(int(w))
        if s is not None:
            s.state = "dead"
            s.note = shorten(fault_cause("", str(ev.reason or "")), 120)
    nodes = ev.nodes or []
    v.faults.append(FaultStatus(ev.ts, str(ev.kind or "unknown"), None, ",".join(nodes) or None, None, None,
                                f"slots {list(ev.slots or [])}: {fault_cause('', ev.reason)}", "detected"))


def _fault(v: JobView, ev: E.Fault) -> None:
    if ev.superseded:
        return  # an error of collectives a recovery or a planned end had already broken off: no fault of its own
    g = int(ev.generation) if ev.generation is not None else v.generation
    if ev.step is not None and g == v.generation:
        v.step_seen(ev.ts, int(ev.step) - 1)  # the step the fault interrupted: the one before was finished
    v.faults.append(FaultStatus(ev.ts, str(ev.kind or "unknown"), ev.world_rank, ev.node, ev.step, ev.phase,
                                fault_cause(ev.exc_type, ev.message), "reported"))


def _rejoined(v: JobView, ev: E.Rejoined) -> None:
    s = v.slots.get(int(ev.world_rank))
    if s is None:
        return _out_of_order(v, ev, f"world rank {ev.world_rank} never registered")
    s.step = int(ev.step or 0)


# --- progress ------------------------------------------------------------------------------------------------


def _progress(v: JobView, ev: E.Progress | E.StepSeen) -> None:
    v.step_seen(ev.ts, ev.step)


def _commit(v: JobView, ev: E.Commit) -> None:
    shard_steps = {str(sid): {int(k): int(x) for k, x in dict(copies).items()}
                   for sid, copies in (ev.shard_steps or {}).items()}
    if ev.recoverable_step is not None:
        v.committed(ev.ts, ev.recoverable_step)
        v.last_commit_at = ev.ts
        v.step_seen(ev.ts, ev.recoverable_step)
    for sid, copies in shard_steps.items():
        v.shard_steps[sid] = copies
        v.shard_commit_at[sid] = ev.ts
    for sid, n in (_v(ev.shard_bytes) or {}).items():
        v.shard_bytes[str(sid)] = int(n)
    for sid, holders in (_v(ev.placement) or {}).items():
        v.placement[str(sid)] = [int(h) for h in holders]
    if _v(ev.agreement):
        v.agreement.update({k: ev.agreement.get(k) for k in ("checked", "disagreed", "last_step")})


def _protect_interval(v: JobView, ev: E.ProtectInterval) -> None:
    v.protect_every = int(ev.interval if ev.interval is not None else 1)


def _placement(v: JobView, ev: E.Placement) -> None:
    placement: dict[str, list[int]] = {}
    for sid, _owner, holder in ev.replicas or []:
        placement.setdefault(str(sid), []).append(int(holder))
    v.placement = placement


def _checkpoint(v: JobView, ev: E.Checkpoint) -> None:
    if ev.step is not None:
        v.checkpoint(ev.ts, int(ev.step))


# --- the end -------------------------------------------------------------------------------------------------


def _job_end(v: JobView, ev: E.JobEnd) -> None:
    if v.job_state not in TERMINAL_STATES:
        v.job_state = ev.JOB_STATE
        v.end_event = v.job_end = ev.NAME
        v.end_reason = _v(ev.message) or _v(ev.reason)
        v.ended_at = ev.ts
        v.end_signal = _field(ev, "signal")
    if isinstance(ev, E.JobDone):
        v.final_hash = ev.final_hash
        v.end_step = ev.step
        v.step_seen(ev.ts, ev.step)
        for s in v.slots.values():  # spares never used stay spares: the pool as it was at the end
            if s.state in LIVE_SLOT_STATES and s.state != "standby":
                s.state = "done"
    cur = v.current_recovery()
    if cur is not None and not isinstance(ev, E.JobDone):
        cur.state, cur.finished_at = ("fallback" if isinstance(ev, E.Fallback) else "aborted"), ev.ts
    view_repairs.job_ended(v, ev.NAME, _field(ev, "checkpoint_step"), _v(ev.message), _v(ev.reason))


def _coordinator_exit(v: JobView, ev: E.CoordinatorExit) -> None:
    if v.job_state not in TERMINAL_STATES and ev.job_state in TERMINAL_STATES:
        v.job_state = str(ev.job_state)
    v.ended_at = v.ended_at or ev.ts
    v.end_event = v.end_event or ev.NAME


# --- recoveries ----------------------------------------------------------------------------------------------


def _silent_corruption(v: JobView, ev: E.SilentCorruption) -> None:
    """DP replicas whose parameter digests differ: a fault the coordinator detected, on the first suspect."""
    if ev.step is None:
        return _out_of_order(v, ev, "a difference at no step")
    suspects = [int(x) for x in ev.suspects or []]
    w = v.rank_map.get(suspects[0]) if suspects else None
    s = v.slots.get(w) if w is not None else None
    maj = _v(ev.majority)
    who = (f"logical rank(s) {suspects} differ from the majority {list(maj)}" if maj
           else f"logical ranks {suspects} differ, no majority")
    v.faults.append(FaultStatus(ev.ts, E.SilentCorruption.NAME, w, s.node if s else None, ev.step, None,
                                f"parameters at pp={ev.pp}, tp={ev.tp}: {who} (replica agreement)", "detected"))
    v.agreement["disagreed"] = max(int(v.agreement.get("disagreed") or 0), 1)
    view_repairs.difference(v, ev.ts, ev.generation, ev.step, ev.pp, ev.tp, ev.members, ev.suspects, maj)


def _agreement_undetectable(v: JobView, ev: E.AgreementUndetectable) -> None:
    v.agreement["undetectable"] = str(ev.reason or "")


def _agreement_off(v: JobView, ev: E.AgreementOff) -> None:
    v.agreement["off"] = str(ev.reason or "")
    v.agreement["off_generation"] = int(ev.generation) if ev.generation is not None else v.generation


def _agreement_rejected(v: JobView, ev: E.AgreementRejected) -> None:
    v.agreement["rejected"] = int(v.agreement.get("rejected") or 0) + 1


def _replica_rejected(v: JobView, ev: E.ReplicaRejected) -> None:
    v.rejected.append({"ts": ev.ts, **ev.to_record()})


def _decision(v: JobView, ev: E.Decision) -> None:
    v.pending_action, v.pending_reason = ev.action, ev.reason
    view_repairs.decided(v, ev.ts, ev.action, ev.reason, _v(ev.faults))
    if ev.action == E.Fallback.NAME:
        cur = v.current_recovery()
        if cur is not None:
            cur.state, cur.action, cur.finished_at = "fallback", "fallback", ev.ts
            cur.reason = ev.reason or cur.reason
        v.job_state = "fallback"


def _recovery_start(v: JobView, ev: E.RecoveryStart) -> None:
    g = int(ev.generation) if ev.generation is not None else v.generation + 1
    v.generation = max(v.generation, g)
    cur = v.current_recovery()
    if cur is not None:  # a new start without an abort record: the old one was superseded
        cur.state, cur.finished_at = "aborted", ev.ts
    v.recovery_starts.append(ev.ts)
    survivors, dead = [int(w) for w in ev.survivors or []], [int(w) for w in ev.dead or []]
    v.recovery = InProgress(g, survivors, dead)
    # the slots this recovery lost: not those an earlier recovery replaced or removed already (an older
    # coordinator listed every dead slot of the job)
    drain = _v(ev.drain)
    v.recoveries.append(RecoveryStatus(
        generation=g, action="drain" if drain else ev.action or v.pending_action, state="in_progress",
        started_at=ev.ts, finished_at=None, reason=f"planned drain {drain}" if drain else v.pending_reason,
        dead_slots=[w for w in dead if w not in v.replaced], joins=[], detect_s=ev.detect_s, total_s=None,
        phases={}, steps_replayed=None, recoverable_step=None))
    view_repairs.recovery_started(v, g, ev.action or v.pending_action)
    if v.job_state not in TERMINAL_STATES:
        v.job_state = "recovering"
    for w in survivors:
        s = v.slots.get(w)
        if s is not None and s.state == "active":
            s.state = "quiesced"


def _shrink_plan(v: JobView, ev: E.RecoveryPlanned, g: int, pairs: list[tuple[int, int]]) -> None:
    """A shrink renumbers the members of a smaller grid (the grid changes from generation ``g`` on); ``pairs``:
    the plan's rank map (:func:`_pairs`). Reads every field before it changes the view.

    Raises:
        KeyError, TypeError, ValueError: the shrink's ``old_grid``, the plan's ``grid`` or the ``leavers`` are
            not what a plan writes (nothing changed).
    """
    old = ((ev.shrink or {}).get("old_grid") or {}) if ev.grid else {}
    old_grid, new_grid = _grid(old) if old else None, _grid(ev.grid) if ev.grid else None
    leavers = {int(x) for x in ev.shrink.get("leavers") or []}
    v.rank_map.clear()
    for s in v.slots.values():  # a slot keeps the coordinates of the grid it was numbered in
        if s.logical_rank is not None and s.grid is None:
            s.grid = v.grid
    if new_grid is not None:
        if old_grid is not None:
            v.grid_since.setdefault(0, old_grid)
        v.grid = new_grid
        v.grid_since[g] = v.grid
    for w, s in v.slots.items():
        if s.state != "dead" and w in leavers:
            v.note(w, "DP replica removed (shrink)")
    for lr, w in pairs:  # the kept slots are renumbered in the smaller grid
        if w in v.slots:
            v.slots[w].logical_rank = lr
            v.slots[w].grid = v.grid
    v.shard_steps.clear()  # a shrink renumbers every rank and shard


def _recovery_plan(v: JobView, ev: E.RecoveryPlanned) -> None:
    cur = v.current_recovery()
    g = int(ev.generation) if ev.generation is not None else v.generation
    # every join and pair is read before the view changes: a plan is applied whole or not at all
    pairs = _pairs(ev.rank_map)
    joins = [(j, int(j["world_rank"]), int(j["logical_rank"]), int(j.get("replaces_world_rank", -1)))
             for j in ev.joins or []]
    if ev.shrink:
        _shrink_plan(v, ev, g, pairs)
    for lr, w in pairs:
        v.rank_map[lr] = w
    if ev.rank_map:
        v.rank_maps[g] = dict(v.rank_map)
    # the copies a logical rank held went with the slot that held it: a spare that takes the rank holds
    # none of them until its generation's first commit says so
    for j, jw, jlr, replaces in joins:
        for copies in v.shard_steps.values():
            copies.pop(jlr, None)
        s = v.slots.get(jw)
        if s is not None and s.state != "dead":
            s.state, s.role, s.logical_rank = "joining", "active", jlr
            s.grid = v.grid if ev.shrink else s.grid
            s.note = f"replaces world rank {j.get('replaces_world_rank')}"
        old = v.slots.get(replaces)
        if old is not None:  # world ranks never change; the logical rank is the one of this generation
            v.note(old.world_rank, f"replaced by world rank {j['world_rank']} (logical rank {j['logical_rank']} "
                                   f"of generation {g})")
            v.replaced.add(replaces)
    for w in ev.dead_world or []:
        s = v.slots.get(int(w))
        if s is not None and s.state != "drained":  # a drained slot is replaced like a dead one
            s.state = "dead"
    pending_replaced = {int(w) for w in ev.dead_world or []} - set(v.rank_map.values())
    if cur is not None:
        cur.action = cur.action if cur.action == "drain" else ev.action or cur.action
        cur.joins = [dict(j) for j in ev.joins or []]
        cur.steps_replayed, cur.recoverable_step = ev.steps_replayed, ev.recoverable_step
        cur.planned_at, cur.quiesce_s = ev.ts, round(ev.ts - cur.started_at, 3)
    if ev.recoverable_step is not None:  # the step this recovery resumes from: committed from now on
        v.committed(ev.ts, ev.recoverable_step)
        v.step_seen(ev.ts, ev.recoverable_step)
        if cur is not None:
            cur.dead_slots = sorted(set(cur.dead_slots) | {int(w) for w in ev.dead_world or []
                                                           if int(w) not in v.replaced})
    v.replaced |= pending_replaced
    view_repairs.recovery_planned(v, g, ev.recoverable_step, ev.steps_replayed)
    if v.recovery is not None:
        v.recovery.phase = RecoveryPhase.RESTORE


def _recovery_restored(v: JobView, ev: E.RecoveryRestored) -> None:
    g = int(ev.generation) if ev.generation is not None else v.generation
    members = set(v.rank_map.values())
    for w, s in v.slots.items():
        if w in members and s.state in ("joining", "quiesced", "active"):
            s.state, s.generation = "active", g
    if v.job_state not in TERMINAL_STATES:
        v.job_state = "running"
    if ev.recoverable_step is not None:  # the members resume from it: now the committed and the live step
        v.committed(ev.ts, ev.recoverable_step)
        v.step_seen(ev.ts, ev.recoverable_step, rollback=True)
    if v.recovery is not None:
        v.recovery.phase = RecoveryPhase.REPLAY


def _recovery_done(v: JobView, ev: E.RecoveryDone) -> None:
    cur = v.current_recovery() or next((r for r in reversed(v.recoveries) if r.generation == ev.generation), None)
    if cur is None:
        return _out_of_order(v, ev, f"no recovery of generation {ev.generation} started")
    cur.state, cur.finished_at = "done", ev.ts
    cur.total_s = ev.total_s
    cur.phases = {k: float(x) for k, x in (ev.phases or {}).items()}
    cur.steps_replayed = ev.steps_replayed
    cur.recoverable_step = ev.recoverable_step
    cur.action = "drain" if ev.drain else ev.action or cur.action
    if ev.generation is not None:
        view_repairs.recovery_planned(v, int(ev.generation), ev.recoverable_step, ev.steps_replayed, done=True)
    v.recovery = None


def _recovery_aborted(v: JobView, ev: E.RecoveryAborted) -> None:
    cur = v.current_recovery()
    if cur is not None:
        cur.state, cur.finished_at = "aborted", ev.ts
        cur.reason = f"{cur.reason or ''} (aborted: {ev.reason or ''})".strip()
    if v.recovery is not None:
        v.recovery.phase = RecoveryPhase.ABORTED


def _shrink(v: JobView, ev: E.Shrink) -> None:
    v.shrinks.append({"ts": ev.ts, "generation": ev.generation, "dp_from": ev.dp_from, "dp_to": ev.dp_to,
                      "recoverable_step": ev.recoverable_step, "freed": list(ev.freed or []),
                      "lost": list(ev.lost or []), "drain": _v(ev.drain)})
    for w in ev.freed or []:  # the slots of the removed replicas went back to standby
        s = v.slots.get(int(w))
        if s is not None:
            s.state, s.role, s.logical_rank, s.generation = "standby", "standby", None, None


# --- planned drains and injected faults ----------------------------------------------------------------------

_DRAIN_STATE = {E.DrainArmed: "armed", E.DrainStart: "moving", E.DrainDone: "done", E.DrainRefused: "refused",
                E.DrainMissed: "missed"}


def _drain_requested(v: JobView, ev: E.DrainRequested) -> None:
    rid = str(ev.request_id or f"t{ev.ts}")
    v.drains[rid] = DrainStatus(rid, ev.ts, dict(ev.target or {}), [int(w) for w in ev.targets or []],
                                [str(n) for n in ev.nodes or []], ev.at_step)


def _drain_step(v: JobView, ev: E.Event) -> None:
    d = v.drains.get(str(_field(ev, "request_id")))
    if d is None:
        return _out_of_order(v, ev, f"drain request {_field(ev, 'request_id')!r} never requested")
    if hasattr(ev, "at_step") or "at_step" in ev.extra:
        d.at_step = _field(ev, "at_step")
    d.state = _DRAIN_STATE.get(type(ev), d.state)
    if isinstance(ev, E.DrainDone):
        d.steps_replayed, d.generation = ev.steps_replayed, ev.generation
        d.moved = [[int(x) for x in m] for m in ev.moved or []]
    elif isinstance(ev, (E.DrainRefused, E.DrainMissed)):
        d.reason = str(ev.reason if ev.reason is not None else "")
    elif isinstance(ev, E.DrainStart):
        for w in d.targets:
            s = v.slots.get(w)
            if s is not None:
                s.state = "drained"
                v.note(w, f"drained ({d.request_id})")


def _wire(table: Mapping[str, str], name: Any) -> str:
    return table.get(str(name), str(name))


def _inject_forwarded(v: JobView, ev: E.InjectForwarded) -> None:
    rid = str(ev.request_id or f"t{ev.ts}")
    v.injections[rid] = InjectionStatus(
        request_id=rid, ts=ev.ts, kind=_wire(KIND_OF_WIRE, ev.kind), phase=_wire(PHASE_OF_WIRE, ev.phase),
        at_step=ev.at_step, targets=[int(w) for w in ev.targets or []], fired=[])


def _inject_answer(v: JobView, ev: E.InjectArmed | E.InjectRefused | E.InjectMissed) -> None:
    inj = v.injections.get(str(ev.request_id))
    if inj is None:
        return _out_of_order(v, ev, f"inject request {ev.request_id!r} never forwarded")
    if isinstance(ev, E.InjectArmed):
        inj.armed_steps = {int(w): int(x) for w, x in ev.armed_steps or []}
        inj.at_step = max(inj.armed_steps.values(), default=inj.at_step)
    elif isinstance(ev, E.InjectRefused):
        inj.reason = str(ev.reason if ev.reason is not None else "")
    else:
        inj.missed.append({"world_rank": ev.world_rank, "at_step": ev.at_step,
                           "reason": str(ev.reason if ev.reason is not None else "")})
    inj.settle()


def _inject_landed(v: JobView, ev: E.InjectLanded | E.InjectFired) -> None:
    rid = str(ev.request_id or "")
    inj = v.injections.get(rid)
    if inj is None:
        inj = v.injections[rid or f"t{ev.ts}"] = InjectionStatus(
            rid, ev.ts, _wire(KIND_OF_WIRE, _field(ev, "kind")), _wire(PHASE_OF_WIRE, ev.phase), ev.at_step, [], [])
    landed = {"world_rank": ev.world_rank, "step": ev.step, "phase": PHASE_OF_WIRE.get(str(ev.phase), ev.phase),
              "ts": ev.ts}
    # the landing file and the coordinator's record of the same landing count once
    if not any((f["world_rank"], f["step"], f["phase"]) == (landed["world_rank"], landed["step"], landed["phase"])
               for f in inj.fired):
        inj.fired.append(landed)
    inj.settle()
    if ev.step is not None:
        v.step_seen(ev.ts, int(ev.step) - 1)


# Every event the view depends on, with what it does to the view.
Handler = Callable[[JobView, Any], "JobView | None"]
HANDLERS: dict[type[E.Event], Handler] = {
    E.CoordinatorStarted: _started, E.TestEnv: _test_env, E.Registered: _registered,
    E.JobRunning: _job_running, E.HeartbeatSummary: _heartbeat_summary, E.SlotsDead: _slots_dead,
    E.Fault: _fault, E.Rejoined: _rejoined, E.Progress: _progress, E.StepSeen: _progress, E.Commit: _commit,
    E.ProtectInterval: _protect_interval, E.Placement: _placement, E.Checkpoint: _checkpoint,
    E.JobDone: _job_end, E.CleanStop: _job_end, E.Fallback: _job_end, E.CoordinatorStopped: _job_end,
    E.CoordinatorExit: _coordinator_exit, E.ReplicaRejected: _replica_rejected, E.Decision: _decision,
    E.SilentCorruption: _silent_corruption, E.AgreementUndetectable: _agreement_undetectable,
    E.AgreementRejected: _agreement_rejected, E.AgreementOff: _agreement_off,
    E.RecoveryStart: _recovery_start, E.RecoveryPlanned: _recovery_plan, E.RecoveryRestored: _recovery_restored,
    E.RecoveryDone: _recovery_done, E.RecoveryAborted: _recovery_aborted, E.Shrink: _shrink,
    E.DrainRequested: _drain_requested, E.DrainArmed: _drain_step, E.DrainRearmed: _drain_step,
    E.DrainStart: _drain_step, E.DrainDone: _drain_step, E.DrainRefused: _drain_step, E.DrainMissed: _drain_step,
    E.InjectForwarded: _inject_forwarded, E.InjectArmed: _inject_answer, E.InjectRefused: _inject_answer,
    E.InjectMissed: _inject_answer, E.InjectLanded: _inject_landed, E.InjectFired: _inject_landed,
}


def apply(view: JobView, event: E.Event) -> JobView:
    """The view after ``event`` (see the module docstring). Events the view does not depend on (``rejected``,
    ``signal``, ``recovery_plan_sent``...) leave it as it is.

    Raises:
        KeyError, TypeError, ValueError: a field of ``event`` cannot be read (raised before the view changed:
            :func:`fold` skips such an event and names it in ``view.skipped``).
    """
    handler = HANDLERS.get(type(event))
    if handler is None:
        if isinstance(event, E.UnknownEvent):
            view.skipped.append(f"{event.name}: no such journal event (a newer writer?): skipped")
        return view
    if event.ts is None:  # every time the view holds is a record's ts (the journal stamps every record)
        _out_of_order(view, event, "no ts")
        return view
    out = handler(view, event)
    return view if out is None else out


def fold(records: Iterable[Mapping[str, Any] | E.Event], view: JobView | None = None, start: int = 1,
         where: Callable[[int, Any], str] | None = None) -> JobView:
    """``apply`` every record in order, from ``view`` (an empty :class:`JobView` by default). A record that is
    not an event, whose fields are not of their types (:meth:`~phoenix_hpc.control.events.Event.from_record`),
    or whose event cannot be applied or names what the view does not hold, is skipped and named in
    ``view.skipped`` (the view as it was before it: :func:`apply` applies a record whole or not at all):
``"POSITION (event): why: skipped"``, POSITION ``where(number, record)`` (the journal's
    ``PATH:LINE``: :func:`phoenix_hpc.control.journal.line_namer`), else ``record NUMBER`` counting from
    ``start`` (the live coordinator folds one record at a time, control/recorder.py). Pure."""
    v = view if view is not None else JobView()
    for i, rec in enumerate(records, start):
        n = len(v.skipped)
        try:
            ev = rec if isinstance(rec, E.Event) else E.from_record(rec)
            if isinstance(ev, E.UnknownEvent):
                why = "no such journal event (a newer writer?)"
            else:
                v = apply(v, ev)
                if len(v.skipped) == n:
                    continue
                why = "; ".join(s.removesuffix(": skipped") for s in v.skipped[n:])  # apply: out of order
                del v.skipped[n:]
        except (E.EventError, KeyError, TypeError, ValueError, AttributeError) as exc:
            why = f"{type(exc).__name__}: {exc}"
        if isinstance(rec, E.Event):
            name = rec.name if isinstance(rec, E.UnknownEvent) else rec.NAME
        else:
            name = rec.get("event") if isinstance(rec, Mapping) else "?"
        pos = where(i, rec) if where is not None else f"record {i}"
        v.skipped.append(f"{pos} ({name}): {why}: skipped")
    return v
