"""``derive_status``: a job's status from its journal records, Slurm's view and the run files. Pure.

Journal events read (written by :mod:`phoenix_hpc.control.coordinator`; unknown events are ignored, so an
older or newer coordinator still gives a status):

================== ====================================================================================
event              used for
================== ====================================================================================
coordinator_started start time, grid; a resumed run has one per job, and only the newest job's records
                   are read (:func:`current_job_records`)
test_env           ``variables {name: value}``: test-only variables the coordinator saw set
                   (:mod:`phoenix_hpc.test_env`): ``JobInfo.test_env`` and a ``test_env`` warning
registered         slots: world rank, pid, node, role, logical rank (generation 0)
job_running        rank map and standby slots at generation 0; job RUNNING
heartbeat_summary  generation, job state, active/standby/dead world ranks; ``max_step`` feeds the live step
                   only in journals without ``progress`` records (older coordinators)
progress           ``step``: the newest step the ACTIVE slots reported (live progress, at most every ~1 s)
commit             ``recoverable_step`` (committed progress); optional per-shard detail:
                   ``shard_steps {shard id: {logical rank: committed step}}``, ``shard_bytes {shard id:
                   bytes}``, ``placement {shard id: [holder logical ranks]}``
placement          ``replicas [[shard id, owner, holder], ...]`` (logical ranks): the replica placement
fault, slots_dead  faults reported by ranks / detected by the coordinator; dead slots (a ``fault`` journalled
                   ``superseded``, an error of collectives a recovery or a stop had broken off, is no fault)
replica_rejected   a recovery refused a holder's copy: a ``corrupt-replica`` injection was caught
decision           action and reason of the next recovery (``fallback``: memory could not cover a loss)
recovery_start     a recovery of generation g begins (survivors, dead: an older coordinator also listed slots an
                   earlier recovery replaced, which are left out)
recovery_plan      new rank map, joins (spare -> logical rank), steps replayed; ``recoverable_step``: the
                   step the recovery resumes from, the committed step from then on
recovery_restored  generation g restored: members ACTIVE at g
recovery_done      ``total_s``, ``phases {detect, reconfigure, params, optimizer, replay}``, ``steps_replayed``;
                   ``RecoveryStatus.quiesce_s`` comes from the journal: ``recovery_start`` ->
                   ``recovery_plan`` (survivors leaving the step they were in), and ``other_s`` is what no
                   phase accounts for, so phases + quiesce + other add up to ``total_s``
recovery_aborted   a recovery cut short by a second fault
inject_forwarded   an injection request sent to its targets (wire kind/phase names)
inject_armed       every target armed it {armed_steps [[world rank, step]]}
inject_refused     a target refused it (already in the step) or did not confirm {reason}
inject_missed      an armed target was lost, or the job ended, before its step {world_rank, at_step, reason}
drain_requested,   a planned drain: requested {target, targets, nodes, at_step}, armed by every member, started
drain_armed,       (the drained slots leave: state ``drained``; ``recovery_start.drain`` names the hot swap
drain_start,       that carries it out, shown with action ``drain``), done {steps_replayed, moved, generation},
drain_done,        refused or missed {reason}; ``drain_rearmed`` {at_step}: a member had started the iteration
drain_refused,
drain_missed
inject_landed      where an injected fault landed (also ``inject_fired`` from ``RUN_DIR/faults/fired-*.json``)
checkpoint         newest persistent checkpoint step (written after that step finished: a lower bound on the
                   live step); shown once the committed step covers it, so the status always reads
                   checkpoint <= committed <= live. At the end of the job (no commit follows) a newer
                   checkpoint is shown and counts as committed: a resubmitted job resumes from it; the newest complete
                   checkpoint on disk (``RunFiles.checkpoints``) counts too: a job killed before it journalled it
job_done, clean_stop, fallback, coordinator_stopped, coordinator_exit: the end of the job
                   (``coordinator_stopped.signal``: the external signal that ended it; standby slots stay
                   standby at ``job_done``: the spares left at the end)
================== ====================================================================================

The live step (``JobInfo.step``, ``Status.progress``) is the newest step the job's active slots have finished;
``JobInfo.step_at`` is when the record that gave it was written (its age is shown). While the job runs, the
newest line of the ranks' step logs (``RunFiles.rank_newest``) written after the last rollback is a fresher
source than the journal.
Every source is a lower bound on it, so within a generation it never decreases: ``progress`` records,
``heartbeat_summary`` (older journals), ``commit`` (a committed step is finished), a ``fault`` or an injected
fault that landed in step ``s`` (step ``s - 1`` was finished), ``job_done``. It moves down only where the
job really rolls back: ``recovery_restored`` sets it to the recoverable step the members resume from. It
is never below the committed (recoverable) step.

When the journal does not name the replica holders, the placement is computed the way docs/design.md section 5
defines it (:func:`phoenix_hpc.topology.generation_placement` over the generation-0 node of every logical rank,
with the config's ``k`` and ``placement_levels``; holders are logical ranks, so the placement survives
renumbering) and marked ``source="planned"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from phoenix_hpc.slurm.client import ACTIVE_JOB_STATES
from phoenix_hpc.control import events as E
from phoenix_hpc.control.view import LIVE_SLOT_STATES, TERMINAL_STATES, JobView, fold, job_segments
from phoenix_hpc.recovery.plan import shard_id_of
from phoenix_hpc.status.metrics_sinks import metrics_sinks
from phoenix_hpc.status.model import (
    HolderStatus,
    InjectionStatus,
    JobInfo,
    NodeStatus,
    ReplicaStatus,
    RunFiles,
    SlotStatus,
    SlurmInfo,
    Status,
    StatusWarning,
)

SLURM_ACTIVE_STATES = ACTIVE_JOB_STATES
Grid = tuple[int, int, int]  # (tp, pp, dp)


def node_is_down(slurm_state: str | None) -> bool:
    """Whether an ``scontrol show node`` State (``IDLE``, ``DOWN*``, ``MIXED+DRAIN``, ``IDLE*``...) means the
    node is lost: DOWN, FAIL, or not responding (``*`` suffix / ``NOT_RESPONDING`` flag; scontrol(1))."""
    if not slurm_state:
        return False
    s = slurm_state.upper()
    return "DOWN" in s or "FAIL" in s or s.endswith("*") or "NOT_RESPONDING" in s


# Slurm's pending reasons (squeue(1) "JOB REASON CODES") that a user can act on, with what to do
_PENDING_HINTS = {
    "ReqNodeNotAvail": "a node the job needs is DOWN, DRAINED or reserved: it waits until enough nodes are up "
                       "(`sinfo -R` lists why nodes are down; on the local cluster `phoenix cluster revive NODE`)",
    "Resources": "waiting for free nodes",
    "Priority": "jobs of higher priority are ahead in the queue",
    "PartitionNodeLimit": "the job asks for more nodes than the partition allows: it will never start",
    "PartitionTimeLimit": "the time limit exceeds the partition's: it will never start",
    "QOSMaxNodePerJobLimit": "the job asks for more nodes than its QOS allows: it will never start",
    "BadConstraints": "no node satisfies the job's constraints: it will never start",
}


def pending_hint(reason: str | None) -> str | None:
    """What a Slurm pending ``Reason`` (``ReqNodeNotAvail,_UnavailableNodes:nid00002``) means for the user,
    or None for reasons that need no action (``None``, ``BeginTime``, ...). Source: squeue(1)."""
    if not reason or reason == "None":
        return None
    return _PENDING_HINTS.get(reason.split(",")[0].split("(")[0].strip())


def _expand(nodelist: str | None) -> list[str]:
    if not nodelist or nodelist in ("(null)", "None"):
        return []
    from phoenix_hpc.hostlist import expand

    return expand(nodelist)


def _get(d: Mapping[str, Any] | None, *path: str, default: Any = None) -> Any:
    for p in path:
        if not isinstance(d, Mapping) or p not in d:
            return default
        d = d[p]
    return d


def _coord(r: int, grid: tuple[int, int, int]) -> list[int]:
    tp, pp, dp = grid
    return [r // (tp * dp), (r // tp) % dp, r % tp]


def shard_id(r: int, grid: tuple[int, int, int]) -> str:
    """``opt/pp{pp}/tp{tp}/dp{dp}`` of logical rank ``r`` in a ``(tp, pp, dp)`` grid: the id the recovery
    plan names (:func:`phoenix_hpc.recovery.plan.shard_id_of`).

    Raises:
        ValueError: ``r`` is outside the grid.
    """
    return shard_id_of(r, *grid)


def _domain(node: str | None, domains: Mapping[str, Mapping[str, str]], levels: list[str]) -> str | None:
    if node is None:
        return None
    for lv in reversed(levels):
        if lv == "node":
            return node
        name = _get(domains, node, lv)
        if name:
            return f"{lv}:{name}" if lv != "node" else name
    return node


def corrupt_replica_outcome(inj: InjectionStatus, records: Iterable[Mapping[str, Any]]) -> str | None:
    """What became of the copies a landed ``corrupt-replica`` corrupted (the holder's two buffers of the
    shard's replica, holding the committed steps before the landing step ``s``). Pure. In record order, the
    first of:

    - ``caught``: a recovery refused the holder's copy (journal ``replica_rejected`` of that slot);
    - ``overwritten``: the committed step reached ``s + 2`` before any recovery started: both buffers were
      written again with verified copies (the replicas of ``s + 1`` and ``s + 2``, docs/design.md section 6),
      so no corrupted byte was ever read: harmless;
    - ``held``: neither yet (a recovery before the overwrite verifies the copy and refuses it).

    None when it has not landed."""
    if not inj.fired:
        return None
    land = min(inj.fired, key=lambda f: float(f["ts"]))
    t, s = float(land["ts"]), int(land["step"])
    holders = {int(f["world_rank"]) for f in inj.fired}
    started = None
    for r in records:
        ts = float(r["ts"])
        if ts < t:
            continue
        ev = r["event"]
        if ev == E.ReplicaRejected.NAME and r.get("world_rank") in holders:
            return (f"caught: recovery of generation {r.get('generation')} refused the corrupted copy of step "
                    f"{r.get('step')}")
        if ev == E.RecoveryStart.NAME and started is None:
            started = r.get("generation")
        if ev == E.Commit.NAME and started is None and int(r.get("recoverable_step") or 0) >= s + 2:
            return (f"overwritten (harmless): the commit of step {r['recoverable_step']} replaced both corrupted "
                    "copies before any recovery needed them")
    if started is not None:
        return f"held: the recovery of generation {started} started before the copies were overwritten"
    return "held: not overwritten yet; a recovery now verifies the copy and refuses it"


def _run_jobs(job: Mapping[str, Any] | None) -> list[str]:
    jobs = [str(j["job_id"]) for j in (job or {}).get("jobs") or [] if isinstance(j, dict) and "job_id" in j]
    return jobs or ([str(job["job_id"])] if job and job.get("job_id") is not None else [])


def _config_int(config: Mapping[str, Any] | None, *path: str) -> int | None:
    """The integer >= 0 at ``path`` of config.yaml, or None when it is not there or not such an integer (a
    hand-edited config is not re-validated: read as not given). Pure."""
    v = _get(config, *path)
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _config_levels(config: Mapping[str, Any] | None) -> list[str]:
    """config.yaml's ``resilience.placement_levels`` (default, and when it is not a non-empty list of
    strings: ``["node"]``). Pure."""
    v = _get(config, "resilience", "placement_levels")
    return list(v) if isinstance(v, list) and v and all(isinstance(x, str) for x in v) else ["node"]


def _config_grid(config: Mapping[str, Any] | None) -> tuple[int, int, int] | None:
    """``(tp, pp, dp)`` of config.yaml's ``parallelism`` (tp, pp default 1), or None when it gives no dp or a
    size that is not an integer >= 1 (a hand-edited config is not re-validated: read as not given). Pure."""
    sizes = tuple(_get(config, "parallelism", k, default=1 if k != "dp" else None) for k in ("tp", "pp", "dp"))
    if all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in sizes):
        return sizes
    return None


def _planned_placement(grid: tuple[int, int, int], k: int, levels: list[str], node_of: dict[int, str],
                       domains: Mapping[str, Mapping[str, str]]) -> tuple[dict[str, list[int]], list[str]]:
    """The docs/design.md section 5 placement for the generation-0 nodes; (placement, notes)."""
    from phoenix_hpc.errors import ReplicationError
    from phoenix_hpc.topology import covered_levels, generation_placement

    tp, pp, dp = grid
    n = tp * pp * dp
    if sorted(node_of) != list(range(n)):
        return {}, []
    nodes = [node_of[r] for r in range(n)]
    usable = list(covered_levels(levels, nodes, domains))
    notes = []
    if usable != list(levels):
        notes.append(f"failure domains {sorted(set(levels) - set(usable))} unknown to Slurm here; replica "
                     "placement shown at the levels " + ", ".join(usable))
    try:
        pl = generation_placement(grid, k, nodes, domains, levels)
    except ReplicationError as exc:
        return {}, notes + [f"no replica placement possible: {exc}"]
    return pl.holders_by_shard(), notes + list(pl.warnings)


def current_job_records(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The records of the run's newest job: from its last ``coordinator_started`` on (a resumed run's
    journal holds one such record per job, ``phoenix submit --resume``; a coordinator restarted within the
    job, ``restart`` set, continues its job's records). Pure."""
    segs = job_segments(records)  # control/view.py: the one rule a journal is cut into jobs by
    return segs[-1] if segs else []


def restart_requested(records: Iterable[Mapping[str, Any]]) -> bool:
    """Whether one srun step's records (:func:`current_job_records`) hold an in-job restart request
    (``restart_in_job``): that step's coordinator's end is then the step's, not the job's. Pure."""
    return any(r.get("event") == E.RestartInJob.NAME for r in records)


def no_spare_left(cfg: Mapping[str, Any]) -> str:
    """The ``no_spares`` warning: what the next node loss does now that no spare is left, by the job's config
    (``resilience.spares_exhausted``, ``engine``, ``resilience.recovery_source``; a key the config lacks has
    the schema's default). Pure.

    A shrink (the coordinator's policy, :func:`phoenix_hpc.recovery.shrink.shrinks_when_spares_run_out`)
    depends on which node is lost (a whole replica and k + 1 nodes must remain), so it is stated with its
    alternative; otherwise the memory replicas have no slot to restore into and the job stops, naming the
    newest persistent checkpoint to resubmit from (a restart from it inside the job needs spares too)."""
    from phoenix_hpc.recovery.shrink import shrinks_when_spares_run_out

    engine = _get(cfg, "engine", default="torch")
    policy = _get(cfg, "resilience", "spares_exhausted", default="auto")
    enabled = _get(cfg, "resilience", "enabled", default=True)
    mode = _get(cfg, "resilience", "mode", default="phoenix")
    stops = "the job stops, naming the newest persistent checkpoint to resubmit from"
    if not (enabled and mode == "phoenix"):
        return "no spare left: the next node loss cannot be hot-swapped and falls back to the persistent checkpoint"
    if _get(cfg, "resilience", "recovery_source", default="memory") == "checkpoint":
        why = "resilience.recovery_source: checkpoint never shrinks"
    elif shrinks_when_spares_run_out(enabled=enabled, mode=mode, spares_exhausted=policy, engine=engine):
        return (f"no spare left: the next node loss shrinks the job (resilience.spares_exhausted: {policy}"
                f"{' with engine torch' if policy == 'auto' else ''}): the DP replica of the lost node's slots is "
                "removed (dp - 1) and training goes on, if the grid allows (at least one whole model replica and "
                f"k + 1 nodes must remain); else {stops}")
    elif policy == "stop":
        why = "resilience.spares_exhausted: stop"
    else:
        why = f"resilience.spares_exhausted: {policy} with engine {engine!r}, which cannot shrink"
    return f"no spare left: the next node loss cannot be hot-swapped ({why}): {stops}"


def journal_view(records: list[Mapping[str, Any]], run: RunFiles, now: float,
                 journal_skipped: Sequence[str] = (), where: Callable[[int, Any], str] | None = None
                 ) -> tuple[JobView, list]:
    """The fold of one job's ``records`` (:func:`current_job_records`) with its landing files, and what the
    ranks' own step logs add; ``journal_skipped``: the journal lines the reader skipped, named first in the
    view's ``skipped``; ``where``: how the fold names a record it skips (its file line:
    :func:`phoenix_hpc.control.journal.line_namer`). Returns (view, the records folded, landings merged in).
    Pure."""
    heartbeat_progress = not any(r.get("event") == E.Progress.NAME for r in records)
    # the landing records of this job's injections (an earlier job of a resumed run left its own)
    since = float(records[0]["ts"]) if records and records[0].get("event") == E.CoordinatorStarted.NAME else None
    fired = [{**f, "event": E.InjectFired.NAME} for f in run.fired if since is None or float(f["ts"]) >= since]
    merged = sorted(list(records) + fired, key=lambda r: float(r["ts"])) if fired else records
    st = fold(merged, JobView(heartbeat_progress=heartbeat_progress, skipped=list(journal_skipped)), where=where)
    for inj in st.injections.values():
        if inj.kind == "corrupt-replica":
            inj.outcome = corrupt_replica_outcome(inj, merged)
    if st.job_state not in TERMINAL_STATES:
        # the ranks' own step logs are fresher than the journal: their newest line since the last rollback
        after = max([since or 0.0] + [float(r["ts"]) for r in merged if r["event"] == E.RecoveryRestored.NAME])
        newer = [(ts, step) for ts, step in run.rank_newest if ts > after and ts > (st.live_at or 0.0)]
        if newer:
            ts, step = max(newer, key=lambda x: x[1])
            if st.live is None or step >= st.live:
                st.step_seen(ts, step)

    if st.checkpoint_pending is not None and st.job_state in TERMINAL_STATES:
        # nothing more will commit: the complete checkpoint is the newest step a resubmitted job resumes from
        st.committed(st.ended_at or now, st.checkpoint_pending)
    return st, merged


@dataclass
class _Slurm:
    """Slurm's view of the job, as the status reads it."""

    job: Mapping[str, Any]
    state: str | None
    reason: str | None
    live_nodes: list[str]
    batch_host: str | None
    node_state: dict[str, Any]


def _slurm_view(slurm: SlurmInfo) -> _Slurm:
    sj = slurm.job or {}
    slurm_state = (sj.get("JobState") or _get(slurm.queue, "job_state") or None)
    if isinstance(slurm_state, list):  # newer squeue --json gives a list of flags
        slurm_state = slurm_state[0] if slurm_state else None
    slurm_state = str(slurm_state).upper() if slurm_state else None
    slurm_reason = None
    if slurm_state == "PENDING":
        slurm_reason = sj.get("Reason") or _get(slurm.queue, "state_reason") or None
        slurm_reason = None if slurm_reason in (None, "None") else str(slurm_reason)
    live_nodes = _expand(sj.get("NodeList")) if sj else []
    batch_host = sj.get("BatchHost") or None
    node_state = {n: r.get("State") for n, r in slurm.nodes.items()}

    return _Slurm(sj, slurm_state, slurm_reason, live_nodes, batch_host, node_state)


def _job_state(st: JobView, merged: list, sl: _Slurm, slurm: SlurmInfo) -> tuple[str, list[StatusWarning]]:
    """The job's state (the journal's, or what Slurm says of a job whose journal stopped) and its warning."""
    slurm_state = sl.state
    state = st.job_state
    warnings: list[StatusWarning] = []
    if not merged:
        state = "pending" if slurm_state == "PENDING" else ("starting" if slurm_state in SLURM_ACTIVE_STATES
                                                             else ("ended" if slurm_state else "unknown"))
    elif state not in TERMINAL_STATES and slurm_state and slurm_state not in SLURM_ACTIVE_STATES:
        why = ("it was cancelled (scancel) before its coordinator wrote one" if slurm_state.startswith("CANCELLED")
               else "the coordinator was killed or its node lost")
        warnings.append(StatusWarning(
            "coordinator_gone",
            f"Slurm reports the job {slurm_state} but the journal has no final record: {why}; the state below is "
            "the last one journalled"))
        state = "ended"
    elif state not in TERMINAL_STATES and slurm.no_record:
        warnings.append(StatusWarning(
            "coordinator_gone",
            "Slurm has no record of the job any more (it forgets ended jobs) and the journal has no final record: "
            "the coordinator was killed or its node lost; the state below is the last one journalled"))
        state = "ended"
    return state, warnings


def _slots_and_nodes(st: JobView, grid: Grid | None, sl: _Slurm, domains: Mapping[str, Mapping[str, str]],
                     levels: list[str]) -> tuple[list[SlotStatus], list[NodeStatus]]:
    """Every slot and node: the journal's, with what Slurm says of the nodes (down, removed)."""
    slurm_state, node_state, live_nodes = sl.state, sl.node_state, sl.live_nodes
    job_running = slurm_state in SLURM_ACTIVE_STATES if slurm_state else None
    slots: list[SlotStatus] = []
    for w in sorted(st.slots):
        s = st.slots[w]
        note = s.note
        node_down = node_is_down(node_state.get(s.node))
        removed = bool(live_nodes) and s.node not in live_nodes and job_running
        if s.state in LIVE_SLOT_STATES and (node_down or removed):
            note = (note + "; " if note else "") + ("node down" if node_down else "node removed from the job")
            s.state = "dead"
        lr = s.logical_rank
        in_grid = s.grid or grid  # the grid the slot was numbered in (a dead slot keeps its own)
        slots.append(SlotStatus(w, s.node, s.pid, s.state, lr,
                                _coord(lr, in_grid) if (lr is not None and in_grid) else None,
                                s.generation, note))
    node_names = list(dict.fromkeys([s.node for s in slots] + live_nodes))
    nodes: list[NodeStatus] = []
    for n in node_names:
        mine = [s for s in slots if s.node == n]
        live = [s for s in mine if s.state in LIVE_SLOT_STATES or s.state == "done"]
        if mine and all(s.state == "drained" for s in mine):
            role = "drained"  # a planned drain moved its slots off (the node itself may be fine)
        elif node_is_down(node_state.get(n)) or (mine and not live):
            role = "lost"
        elif any(s.state != "standby" for s in live):
            role = "active"
        elif live:
            role = "spare"
        else:
            role = "idle" if n in live_nodes else "unknown"
        nodes.append(NodeStatus(n, node_state.get(n), role, _domain(n, domains, levels),
                                (n in live_nodes) if live_nodes else bool(live), [s.world_rank for s in mine]))

    return slots, nodes


def _replicas(st: JobView, grid: Grid | None, cfg: Mapping[str, Any], slots: list[SlotStatus],
              domains: Mapping[str, Mapping[str, str]], now: float, finished: bool,
              warnings: list[StatusWarning]) -> tuple[list[ReplicaStatus], list[str]]:
    """Every shard with its owner and replica holders; the under-replicated ones ``"sid (have/k)"``."""
    k = _config_int(cfg, "resilience", "k")
    levels = _config_levels(cfg)
    by_world = {s.world_rank: s for s in slots}
    replicas: list[ReplicaStatus] = []
    source = "reported" if st.placement else "unknown"
    placement = dict(st.placement)
    if grid and not placement and k:
        node0 = {lr: st.slots[w].node for lr, w in st.rank_map0.items() if w in st.slots}
        placement, notes = _planned_placement(grid, k, levels, node0, domains)
        source = "planned" if placement else "unknown"
        for msg in notes:
            warnings.append(StatusWarning("placement", msg))
    under: list[str] = []
    if grid:
        tp, pp, dp = grid
        for r in range(tp * pp * dp):
            sid = shard_id(r, grid)
            ow = st.rank_map.get(r)
            owner = by_world.get(ow) if ow is not None else None
            holders = []
            copies = st.shard_steps.get(sid, {})
            for h in placement.get(sid, []):
                hw = st.rank_map.get(h)
                hs = by_world.get(hw) if hw is not None else None
                alive = hs is not None and (hs.state in LIVE_SLOT_STATES or hs.state == "done")
                holders.append(HolderStatus(h, hw, hs.node if hs else None, _domain(hs.node if hs else None,
                                                                                      domains, levels),
                                            alive, copies.get(h)))
            live_h = sum(1 for h in holders if h.alive)
            verified = [h for h in holders if h.alive and h.step is not None]
            n_verified = len(verified) if st.shard_steps else None  # None: the journal names no copy yet
            if copies:
                committed = min(copies.values())
            else:
                committed = st.recoverable_step
            last = st.shard_commit_at.get(sid, st.last_commit_at)
            owner_alive = owner is not None and (owner.state in LIVE_SLOT_STATES or owner.state == "done")
            replicas.append(ReplicaStatus(
                sid, r, ow, owner.node if owner else None, _domain(owner.node if owner else None, domains, levels),
                owner_alive, holders, live_h, committed, st.shard_bytes.get(sid), last,
                None if last is None else max(0.0, now - last), source, n_verified,
                sorted({h.domain or h.node or "?" for h in verified})))
            have = live_h if n_verified is None else n_verified
            if k and placement and have < k and not finished:
                under.append(f"{sid} ({have}/{k})")

    return replicas, under


def _warnings(st: JobView, cfg: Mapping[str, Any], sl: _Slurm, slurm: SlurmInfo, spare_slots: int | None,
              under: list[str], finished: bool, job_id: str | None, run: RunFiles) -> list[StatusWarning]:
    """What the user should know beyond the state: no spare, under-replicated shards, a lost batch host..."""
    k, batch_host, slurm_state, node_state, slurm_reason = (_config_int(cfg, "resilience", "k"), sl.batch_host, sl.state,
                                                            sl.node_state, sl.reason)
    warnings: list[StatusWarning] = []
    if not finished and st.slots and spare_slots == 0:
        warnings.append(StatusWarning("no_spares", no_spare_left(cfg)))
    if under:
        warnings.append(StatusWarning(
            "under_replicated", f"{len(under)} shard(s) with fewer than k={k} verified replicas on live holders: "
                                + ", ".join(under[:6]) + (", ..." if len(under) > 6 else "")
                                + "; one more loss there is unrecoverable from memory"))
    if batch_host and slurm_state == "RUNNING" and node_is_down(node_state.get(batch_host)):
        warnings.append(StatusWarning(
            "batch_host_down", f"the batch host {batch_host} is {node_state.get(batch_host)}: the coordinator "
                               "and the batch script are gone; Slurm keeps the job RUNNING with orphaned steps "
                               "until its time limit",
            action=f"phoenix status {job_id or run.run_dir} --cancel"))
    if slurm_reason is not None:
        hint = pending_hint(slurm_reason)
        warnings.append(StatusWarning(
            "pending", f"Slurm keeps the job pending: {slurm_reason}" + (f" ({hint})" if hint else "")))
    if slurm.error:
        warnings.append(StatusWarning("slurm", slurm.error))
    if st.skipped:  # a newer coordinator's event, or a record the fold could not read: shown without it
        warnings.append(StatusWarning(
            "journal", f"{len(st.skipped)} journal record(s) not shown: " + "; ".join(st.skipped[:3])
                       + ("; ..." if len(st.skipped) > 3 else "")))
    if st.test_env:
        from phoenix_hpc.test_env import describe

        warnings.append(StatusWarning(
            "test_env", "test-only variables acted in this job: " + describe(st.test_env)
                        + "; a production job must not carry them (sbatch --export=ALL passes the submitting "
                        "shell's environment)", action="unset " + " ".join(st.test_env) + " before phoenix submit"))

    return warnings


def derive_status(records: Iterable[Mapping[str, Any]], slurm: SlurmInfo | None, now: float,
                  run: RunFiles | None = None, journal_skipped: Sequence[str] = (),
                  where: Callable[[int, Any], str] | None = None) -> Status:
    """The job's :class:`Status` from its journal ``records`` (in file order), Slurm's view and the run files.

    Pure: reads nothing, changes nothing. ``now`` (unix seconds) is used for ages only. The journal's part is
    the fold of :mod:`phoenix_hpc.control.view` (the one a restarted coordinator rebuilds from); this adds
    Slurm's view and presentation. ``journal_skipped``: the lines the journal reader skipped
    (:func:`phoenix_hpc.control.journal.read_journal_skipping`), shown with what the fold skipped in the
    ``journal`` warning and listed whole in ``Status.journal_skipped``; ``where``: how the fold names a record
    it skips (:func:`journal_view`).

    Raises:
        KeyError/ValueError: a record lacks ``ts``/``event`` (the journal reader skips those).
    """
    slurm = slurm or SlurmInfo()
    run = run or RunFiles(run_dir="")
    cfg = run.config or {}
    all_records = list(records)
    records = current_job_records(all_records)
    st, merged = journal_view(records, run, now, journal_skipped, where)
    grid = st.grid or _config_grid(cfg)
    levels = _config_levels(cfg)
    gpus = _config_int(cfg, "resources", "gpus_per_node")
    domains = slurm.domains or {}
    sl = _slurm_view(slurm)
    sj, slurm_state, slurm_reason, live_nodes, batch_host, node_state = (
        sl.job, sl.state, sl.reason, sl.live_nodes, sl.batch_host, sl.node_state)
    state, warnings = _job_state(st, merged, sl, slurm)
    job_id = str(_get(run.job, "job_id")) if _get(run.job, "job_id") is not None else (sj.get("JobId") or None)
    slots, nodes = _slots_and_nodes(st, grid, sl, domains, levels)
    finished = state in TERMINAL_STATES
    standby = [s for s in slots if s.state == "standby"]
    spare_slots = len(standby) if st.slots else None
    spare_nodes = None
    if st.slots:
        spare_nodes = sum(1 for nd in nodes if nd.role == "spare")
    elif _config_int(cfg, "resources", "spares") is not None and not finished:
        spare_nodes = _config_int(cfg, "resources", "spares")
        spare_slots = spare_nodes * gpus if gpus else None
    replicas, under = _replicas(st, grid, cfg, slots, domains, now, finished, warnings)
    warnings += _warnings(st, cfg, sl, slurm, spare_slots, under, finished, job_id, run)
    k = _config_int(cfg, "resilience", "k")
    # --- job summary -------------------------------------------------------------------------------------------
    steps_total = _get(cfg, "training", "steps")
    info = JobInfo(
        job_id=job_id, name=_get(cfg, "name") or sj.get("JobName"), run_dir=run.run_dir,
        site=_get(run.job, "site"), state=state, slurm_state=slurm_state, slurm_reason=slurm_reason,
        batch_host=batch_host,
        node_list=live_nodes or [n.name for n in nodes if n.slots],
        nodes=_get(cfg, "resources", "nodes"), spares=_get(cfg, "resources", "spares"), gpus_per_node=gpus,
        grid={"tp": grid[0], "pp": grid[1], "dp": grid[2]} if grid else None, k=k, generation=st.generation,
        step=st.live, steps_total=steps_total, recoverable_step=st.recoverable_step, protect_every=st.protect_every,
        # after the end, the newest complete checkpoint on disk too (a job killed before it journalled it)
        checkpoint_step=max([s for s in (st.checkpoint_step, *(run.checkpoints[-1:] if finished else ()))
                             if s is not None], default=None),
        started_at=st.started_at, ended_at=st.ended_at,
        end_event=st.end_event, end_reason=st.end_reason, final_hash=st.final_hash,
        coordinator={k_: run.coordinator.get(k_) for k_ in ("host", "port", "pid")} if run.coordinator else None,
        end_signal=st.end_signal, jobs=_run_jobs(run.job),
        in_job_restart=restart_requested(records),
        test_env=dict(st.test_env),
        step_at=st.live_at, slurm_unreachable=slurm.unreachable, metrics=metrics_sinks(cfg, run.run_dir),
    )
    from phoenix_hpc.control.run_jobs import job_entries
    from phoenix_hpc.status.jobs import run_jobs

    slurm_jobs = dict(slurm.run_jobs)
    if sj and job_id is not None:
        slurm_jobs[job_id] = sj
    jobs = run_jobs(job_entries(run.job or {}), all_records, slurm_jobs, node_state, run.rank_steps,
                    slurm_unreachable=slurm.unreachable)
    info.end_cause = next((j.cause for j in jobs if j.job_id == job_id), None)
    info.resume_step = next((j.resume_step for j in jobs if j.job_id == job_id), None)
    return Status(now=now, job=info, nodes=nodes, slots=slots, replicas=replicas,
                  spare_slots_left=spare_slots, spare_nodes_left=spare_nodes, recoveries=st.recoveries,
                  faults=st.faults, injections=list(st.injections.values()), warnings=warnings,
                  progress=st.progress, commits=st.commits, journal_records=len(records),
                  journal_skipped=list(st.skipped), run_jobs=jobs,
                  drains=list(st.drains.values()), shrinks=list(st.shrinks), agreement=dict(st.agreement),
                  repairs=list(st.repairs))
