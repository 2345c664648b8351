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

from typing import Any, Iterable, Mapping

from phoenix_hpc.slurm.client import ACTIVE_JOB_STATES
from phoenix_hpc.faults.kinds import KIND_OF_WIRE, PHASE_OF_WIRE
from phoenix_hpc.status.model import (
    FaultStatus,
    HolderStatus,
    DrainStatus,
    InjectionStatus,
    JobInfo,
    NodeStatus,
    RecoveryStatus,
    ReplicaStatus,
    RunFiles,
    SlotStatus,
    SlurmInfo,
    Status,
    StatusWarning,
)
from phoenix_hpc.status.text import fault_cause, shorten

TERMINAL_STATES = frozenset({"done", "failed", "stopped", "ended"})
SLURM_ACTIVE_STATES = ACTIVE_JOB_STATES
_END_EVENTS = {"job_done": "done", "clean_stop": "failed", "fallback": "failed", "coordinator_stopped": "stopped"}
LIVE_SLOT_STATES = frozenset({"active", "standby", "joining", "quiesced"})


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
    """``opt/pp{pp}/tp{tp}/dp{dp}`` of logical rank ``r`` in a ``(tp, pp, dp)`` grid."""
    pp, dp, tp = _coord(r, grid)
    return f"opt/pp{pp}/tp{tp}/dp{dp}"


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


class _State:
    """Mutable accumulator while the records are replayed in order."""

    def __init__(self) -> None:
        self.slots: dict[int, dict[str, Any]] = {}
        self.rank_map: dict[int, int] = {}
        self.rank_map0: dict[int, int] = {}
        self.generation = 0
        self.job_state = "starting"
        self.grid: tuple[int, int, int] | None = None
        self.started_at: float | None = None
        self.ended_at: float | None = None
        self.end_event: str | None = None
        self.end_reason: str | None = None
        self.final_hash: str | None = None
        self.end_step: int | None = None
        self.max_step: int | None = None  # newest step ever finished (a rollback does not lower it)
        self.live: int | None = None  # current live step (see module doc)
        self.heartbeat_progress = True  # heartbeat_summary's max_step counts (no progress records)
        self.recoverable_step: int | None = None
        self.protect_every = 1
        self.checkpoint_step: int | None = None
        self.checkpoint_pending: int | None = None  # reported, not yet covered by the committed step
        self.end_signal: str | None = None
        self.progress: list[list[float]] = []
        self.commits: list[list[float]] = []
        self.last_commit_at: float | None = None
        self.shard_steps: dict[str, dict[int, int]] = {}
        self.shard_bytes: dict[str, int] = {}
        self.shard_commit_at: dict[str, float] = {}
        self.placement: dict[str, list[int]] = {}
        self.recoveries: list[RecoveryStatus] = []
        self.faults: list[FaultStatus] = []
        self.injections: dict[str, InjectionStatus] = {}
        self.drains: dict[str, DrainStatus] = {}
        self.shrinks: list[dict[str, Any]] = []  # journal ``shrink`` records, oldest first
        self.pending_reason: str | None = None
        self.pending_action: str | None = None
        self.test_env: dict[str, str] = {}  # journal ``test_env``: active test-only variables
        self.live_at: float | None = None  # when a record last said the live step (its freshness)
        self.replaced: set[int] = set()  # world ranks an earlier recovery already replaced or removed
        self.rejected: list[dict[str, Any]] = []  # journal ``replica_rejected``: copies a recovery refused
        self.restarts: list[float] = []  # ts of every ``recovery_start`` (a copy counted on by a recovery)

    def step_seen(self, ts: float, step: Any, rollback: bool = False) -> None:
        """The live step is at least ``step`` at ``ts`` (``rollback``: it *is* ``step``, the job rolled back)."""
        if step is None:
            return
        step = int(step)
        if not rollback and self.live is not None:
            step = max(step, self.live)
        if self.recoverable_step is not None:
            step = max(step, self.recoverable_step)
        self.max_step = step if self.max_step is None else max(self.max_step, step)
        if step != self.live or not self.progress:
            self.progress.append([float(ts), float(step)])
        self.live = step
        self.live_at = float(ts)

    def committed(self, ts: float, step: Any) -> None:
        """The committed (recoverable) step is ``step`` from ``ts`` on; a checkpoint it now covers is shown."""
        step = int(step)
        if self.recoverable_step != step:
            self.commits.append([float(ts), float(step)])
        self.recoverable_step = step
        if self.checkpoint_pending is not None and self.checkpoint_pending <= step:
            self.checkpoint_step = max(self.checkpoint_pending, self.checkpoint_step or self.checkpoint_pending)
            self.checkpoint_pending = None

    def checkpoint(self, ts: float, step: int) -> None:
        """A persistent checkpoint of ``step`` was written: step ``step`` is finished. It is shown once the
        committed step reaches it (or the job ended), so the status never shows checkpoint > committed."""
        self.step_seen(ts, step)
        if self.recoverable_step is not None and step <= self.recoverable_step:
            self.checkpoint_step = max(step, self.checkpoint_step or step)
        else:
            self.checkpoint_pending = max(step, self.checkpoint_pending or step)

    def current_recovery(self) -> RecoveryStatus | None:
        r = self.recoveries[-1] if self.recoveries else None
        return r if r is not None and r.state == "in_progress" else None


def _apply(st: _State, rec: Mapping[str, Any]) -> None:  # noqa: C901 - one branch per event, kept flat
    ev, ts = rec["event"], float(rec["ts"])
    if ev == "test_env":
        st.test_env = {str(k): str(v) for k, v in dict(rec.get("variables") or {}).items()}
    elif ev == "coordinator_started":
        st.started_at = st.started_at or ts
        g = rec.get("grid")
        if g and st.grid is None:
            st.grid = tuple(int(x) for x in g)  # type: ignore[assignment]
    elif ev == "registered":
        w = int(rec["world_rank"])
        role = str(rec.get("role", "active"))
        lr = rec.get("logical_rank")
        st.slots[w] = {"world_rank": w, "node": str(rec.get("node", "?")), "pid": rec.get("pid"),
                       "state": "active" if role == "active" else "standby",
                       "logical_rank": None if lr is None else int(lr),
                       "generation": 0 if role == "active" else None, "note": "", "grid": None}
        if lr is not None:
            st.rank_map[int(lr)] = w
            st.rank_map0[int(lr)] = w
    elif ev == "job_running":
        st.job_state = "running"
        if rec.get("grid"):
            st.grid = tuple(int(x) for x in rec["grid"])  # type: ignore[assignment]
        for lr, w in rec.get("rank_map") or []:
            st.rank_map[int(lr)] = int(w)
            st.rank_map0.setdefault(int(lr), int(w))
    elif ev == "heartbeat_summary":
        st.generation = max(st.generation, int(rec.get("generation", 0)))
        js = rec.get("job_state")
        if js and st.job_state not in TERMINAL_STATES:
            st.job_state = str(js)
        for w in rec.get("dead") or []:
            s = st.slots.get(int(w))
            if s is not None and s["state"] != "dead":
                s["state"] = "dead"
        if st.heartbeat_progress:
            st.step_seen(ts, rec.get("max_step"))
    elif ev in ("progress", "step"):
        st.step_seen(ts, rec.get("step"))
    elif ev == "commit":
        rs = rec.get("recoverable_step")
        if rs is not None:
            st.committed(ts, rs)
            st.last_commit_at = ts
            st.step_seen(ts, rs)
        for sid, copies in (rec.get("shard_steps") or {}).items():
            st.shard_steps[str(sid)] = {int(k): int(v) for k, v in dict(copies).items()}
            st.shard_commit_at[str(sid)] = ts
        for sid, n in (rec.get("shard_bytes") or {}).items():
            st.shard_bytes[str(sid)] = int(n)
        for sid, holders in (rec.get("placement") or {}).items():
            st.placement[str(sid)] = [int(h) for h in holders]
    elif ev == "protect_interval":
        st.protect_every = int(rec.get("interval", 1))
    elif ev == "placement":
        st.placement = {}
        for sid, _owner, holder in rec.get("replicas") or []:
            st.placement.setdefault(str(sid), []).append(int(holder))
    elif ev == "checkpoint":
        if rec.get("step") is not None:
            st.checkpoint(ts, int(rec["step"]))
    elif ev == "fault" and rec.get("superseded"):
        pass  # an error of collectives a recovery or a planned end had already broken off: no fault of its own
    elif ev == "replica_rejected":
        st.rejected.append(dict(rec))
    elif ev == "fault":
        if rec.get("step") is not None and int(rec.get("generation", st.generation)) == st.generation:
            st.step_seen(ts, int(rec["step"]) - 1)  # the step the fault interrupted: the one before was finished
        st.faults.append(FaultStatus(ts, str(rec.get("kind", "unknown")), rec.get("world_rank"), rec.get("node"),
                                     rec.get("step"), rec.get("phase"),
                                     fault_cause(rec.get("exc_type"), rec.get("message")),
                                     "reported"))
    elif ev == "slots_dead":
        for w in rec.get("slots") or []:
            s = st.slots.get(int(w))
            if s is not None:
                s["state"] = "dead"
                s["note"] = shorten(fault_cause("", str(rec.get("reason", ""))), 120)
        nodes = rec.get("nodes") or []
        st.faults.append(FaultStatus(ts, str(rec.get("kind", "unknown")), None, ",".join(nodes) or None,
                                     None, None,
                                     f"slots {list(rec.get('slots') or [])}: {fault_cause('', rec.get('reason'))}",
                                     "detected"))
    elif ev == "decision":
        st.pending_action = rec.get("action")
        st.pending_reason = rec.get("reason")
        if rec.get("action") == "fallback":
            cur = st.current_recovery()
            if cur is not None:
                cur.state, cur.action, cur.finished_at = "fallback", "fallback", ts
                cur.reason = rec.get("reason") or cur.reason
            st.job_state = "fallback"
    elif ev == "recovery_start":
        g = int(rec.get("generation", st.generation + 1))
        st.generation = max(st.generation, g)
        cur = st.current_recovery()
        if cur is not None:  # a new start without an abort record: the old one was superseded
            cur.state, cur.finished_at = "aborted", ts
        st.restarts.append(ts)
        # the slots this recovery lost: not those an earlier recovery replaced or removed already (an older
        # coordinator listed every dead slot of the job)
        dead_now = [int(w) for w in rec.get("dead") or [] if int(w) not in st.replaced]
        st.recoveries.append(RecoveryStatus(
            generation=g, action="drain" if rec.get("drain") else rec.get("action") or st.pending_action,
            state="in_progress", started_at=ts, finished_at=None,
            reason=f"planned drain {rec['drain']}" if rec.get("drain") else st.pending_reason, dead_slots=dead_now,
            joins=[], detect_s=rec.get("detect_s"), total_s=None, phases={}, steps_replayed=None,
            recoverable_step=None))
        if st.job_state not in TERMINAL_STATES:
            st.job_state = "recovering"
        for w in rec.get("survivors") or []:
            s = st.slots.get(int(w))
            if s is not None and s["state"] == "active":
                s["state"] = "quiesced"
    elif ev == "recovery_plan":
        cur = st.current_recovery()
        if rec.get("shrink"):  # a shrink renumbers the members of a smaller grid
            st.rank_map.clear()
            for s in st.slots.values():  # a slot keeps the coordinates of the grid it was numbered in
                if s["logical_rank"] is not None and s["grid"] is None:
                    s["grid"] = st.grid
            g = rec.get("grid") or {}
            if g:
                st.grid = (int(g["tp"]), int(g["pp"]), int(g["dp"]))  # type: ignore[assignment]
            leavers = {int(x) for x in rec["shrink"].get("leavers") or []}
            for w, s in st.slots.items():
                if s["state"] != "dead" and w in leavers:
                    s["note"] = (s["note"] + "; " if s["note"] else "") + "DP replica removed (shrink)"
            for lr, w in rec.get("rank_map") or []:  # the kept slots are renumbered in the smaller grid
                if int(w) in st.slots:
                    st.slots[int(w)]["logical_rank"] = int(lr)
                    st.slots[int(w)]["grid"] = st.grid
        for lr, w in rec.get("rank_map") or []:
            st.rank_map[int(lr)] = int(w)
        # the copies a logical rank held went with the slot that held it: a spare that takes the rank holds
        # none of them until its generation's first commit says so (a shrink renumbers every rank and shard)
        if rec.get("shrink"):
            st.shard_steps.clear()
        for j in rec.get("joins") or []:
            for copies in st.shard_steps.values():
                copies.pop(int(j["logical_rank"]), None)
            s = st.slots.get(int(j["world_rank"]))
            if s is not None:
                s["state"], s["logical_rank"] = "joining", int(j["logical_rank"])
                s["grid"] = st.grid if rec.get("shrink") else s["grid"]
                s["note"] = f"replaces world rank {j.get('replaces_world_rank')}"
            old = st.slots.get(int(j.get("replaces_world_rank", -1)))
            if old is not None:  # world ranks never change; the logical rank is the one of this generation
                gen = rec.get("generation", st.generation)
                old["note"] = (old["note"] + "; " if old["note"] else "") + (
                    f"replaced by world rank {j['world_rank']} (logical rank {j['logical_rank']} of generation {gen})")
                st.replaced.add(int(j["replaces_world_rank"]))
        for w in rec.get("dead_world") or []:
            s = st.slots.get(int(w))
            if s is not None and s["state"] != "drained":  # a drained slot is replaced like a dead one
                s["state"] = "dead"
        pending_replaced = {int(w) for w in rec.get("dead_world") or []} - set(st.rank_map.values())
        if cur is not None:
            cur.action = cur.action if cur.action == "drain" else rec.get("action") or cur.action
            cur.joins = [dict(j) for j in rec.get("joins") or []]
            cur.steps_replayed = rec.get("steps_replayed")
            cur.recoverable_step = rec.get("recoverable_step")
            cur.planned_at = ts
            cur.quiesce_s = round(ts - cur.started_at, 3)
        if rec.get("recoverable_step") is not None:  # the step this recovery resumes from: committed from now on
            st.committed(ts, rec["recoverable_step"])
            st.step_seen(ts, rec["recoverable_step"])
            if cur is not None:
                cur.dead_slots = sorted(set(cur.dead_slots) | {int(w) for w in rec.get("dead_world") or []
                                                               if int(w) not in st.replaced})
        st.replaced |= pending_replaced
    elif ev == "recovery_restored":
        g = int(rec.get("generation", st.generation))
        members = set(st.rank_map.values())
        for w, s in st.slots.items():
            if w in members and s["state"] in ("joining", "quiesced", "active"):
                s["state"], s["generation"] = "active", g
        if st.job_state not in TERMINAL_STATES:
            st.job_state = "running"
        rs = rec.get("recoverable_step")
        if rs is not None:  # the members resume from rs: that is now the committed and the live step
            st.committed(ts, rs)
            st.step_seen(ts, rs, rollback=True)
    elif ev == "recovery_done":
        cur = st.current_recovery() or next((r for r in reversed(st.recoveries)
                                             if r.generation == rec.get("generation")), None)
        if cur is not None:
            cur.state, cur.finished_at = "done", ts
            cur.total_s = rec.get("total_s")
            cur.phases = {k: float(v) for k, v in (rec.get("phases") or {}).items()}
            cur.steps_replayed = rec.get("steps_replayed", cur.steps_replayed)
            cur.recoverable_step = rec.get("recoverable_step", cur.recoverable_step)
            cur.action = "drain" if rec.get("drain") else rec.get("action") or cur.action
    elif ev == "recovery_aborted":
        cur = st.current_recovery()
        if cur is not None:
            cur.state, cur.finished_at = "aborted", ts
            cur.reason = f"{cur.reason or ''} (aborted: {rec.get('reason', '')})".strip()
    elif ev == "shrink":
        st.shrinks.append({"ts": ts, "generation": rec.get("generation"), "dp_from": rec.get("dp_from"),
                           "dp_to": rec.get("dp_to"), "recoverable_step": rec.get("recoverable_step"),
                           "freed": list(rec.get("freed") or []), "lost": list(rec.get("lost") or []),
                           "drain": rec.get("drain")})
        for w in rec.get("freed") or []:
            s = st.slots.get(int(w))
            if s is not None:
                s["state"], s["logical_rank"], s["generation"] = "standby", None, None
    elif ev == "drain_requested":
        rid = str(rec.get("request_id") or f"t{ts}")
        st.drains[rid] = DrainStatus(rid, ts, dict(rec.get("target") or {}), [int(w) for w in rec.get("targets") or []],
                                     [str(n) for n in rec.get("nodes") or []], rec.get("at_step"))
    elif ev in ("drain_armed", "drain_rearmed", "drain_start", "drain_done", "drain_refused", "drain_missed"):
        d = st.drains.get(str(rec.get("request_id")))
        if d is not None:
            d.at_step = rec.get("at_step", d.at_step)
            d.state = {"drain_armed": "armed", "drain_rearmed": d.state, "drain_start": "moving",
                       "drain_done": "done", "drain_refused": "refused", "drain_missed": "missed"}[ev]
            if ev == "drain_done":
                d.steps_replayed, d.generation = rec.get("steps_replayed"), rec.get("generation")
                d.moved = [[int(x) for x in m] for m in rec.get("moved") or []]
            elif ev in ("drain_refused", "drain_missed"):
                d.reason = str(rec.get("reason", ""))
            elif ev == "drain_start":
                for w in d.targets:
                    s = st.slots.get(w)
                    if s is not None:
                        s["state"] = "drained"
                        s["note"] = (s["note"] + "; " if s["note"] else "") + f"drained ({d.request_id})"
    elif ev == "inject_forwarded":
        rid = str(rec.get("request_id") or f"t{ts}")
        st.injections[rid] = InjectionStatus(
            request_id=rid, ts=ts, kind=KIND_OF_WIRE.get(str(rec.get("kind")), str(rec.get("kind"))),
            phase=PHASE_OF_WIRE.get(str(rec.get("phase")), str(rec.get("phase"))), at_step=rec.get("at_step"),
            targets=[int(w) for w in rec.get("targets") or []], fired=[])
    elif ev in ("inject_armed", "inject_refused", "inject_missed"):
        inj = st.injections.get(str(rec.get("request_id")))
        if inj is not None:
            if ev == "inject_armed":
                inj.armed_steps = {int(w): int(x) for w, x in rec.get("armed_steps") or []}
                inj.at_step = max(inj.armed_steps.values(), default=inj.at_step)
            elif ev == "inject_refused":
                inj.reason = str(rec.get("reason", ""))
            else:
                inj.missed.append({"world_rank": rec.get("world_rank"), "at_step": rec.get("at_step"),
                                   "reason": str(rec.get("reason", ""))})
            _injection_state(inj)
    elif ev in ("inject_fired", "inject_landed"):
        rid = str(rec.get("request_id") or "")
        inj = st.injections.get(rid)
        if inj is None:
            inj = st.injections[rid or f"t{ts}"] = InjectionStatus(
                rid, ts, KIND_OF_WIRE.get(str(rec.get("kind")), str(rec.get("kind"))),
                PHASE_OF_WIRE.get(str(rec.get("phase")), str(rec.get("phase"))), rec.get("at_step"), [], [])
        landed = {"world_rank": rec.get("world_rank"), "step": rec.get("step"),
                  "phase": PHASE_OF_WIRE.get(str(rec.get("phase")), rec.get("phase")), "ts": ts}
        # the landing file and the coordinator's record of the same landing count once
        if not any((f["world_rank"], f["step"], f["phase"]) == (landed["world_rank"], landed["step"], landed["phase"])
                   for f in inj.fired):
            inj.fired.append(landed)
        _injection_state(inj)
        if rec.get("step") is not None:
            st.step_seen(ts, int(rec["step"]) - 1)
    elif ev in _END_EVENTS:
        if st.job_state not in TERMINAL_STATES:
            st.job_state = _END_EVENTS[ev]
            st.end_event = ev
            st.end_reason = rec.get("message") or rec.get("reason")
            st.ended_at = ts
            st.end_signal = rec.get("signal")
        if ev == "job_done":
            st.final_hash = rec.get("final_hash")
            st.end_step = rec.get("step")
            st.step_seen(ts, rec.get("step"))
            for s in st.slots.values():  # spares never used stay spares: the pool as it was at the end
                if s["state"] in LIVE_SLOT_STATES and s["state"] != "standby":
                    s["state"] = "done"
        cur = st.current_recovery()
        if cur is not None and ev != "job_done":
            cur.state, cur.finished_at = ("fallback" if ev == "fallback" else "aborted"), ts
    elif ev == "coordinator_exit":
        js = rec.get("job_state")
        if st.job_state not in TERMINAL_STATES and js in TERMINAL_STATES:
            st.job_state = str(js)
            st.ended_at = st.ended_at or ts
        st.ended_at = st.ended_at or ts
        st.end_event = st.end_event or ev


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
        if ev == "replica_rejected" and r.get("world_rank") in holders:
            return (f"caught: recovery of generation {r.get('generation')} refused the corrupted copy of step "
                    f"{r.get('step')}")
        if ev == "recovery_start" and started is None:
            started = r.get("generation")
        if ev == "commit" and started is None and int(r.get("recoverable_step") or 0) >= s + 2:
            return (f"overwritten (harmless): the commit of step {r['recoverable_step']} replaced both corrupted "
                    "copies before any recovery needed them")
    if started is not None:
        return f"held: the recovery of generation {started} started before the copies were overwritten"
    return "held: not overwritten yet; a recovery now verifies the copy and refuses it"


def _run_jobs(job: Mapping[str, Any] | None) -> list[str]:
    jobs = [str(j["job_id"]) for j in (job or {}).get("jobs") or [] if isinstance(j, dict) and "job_id" in j]
    return jobs or ([str(job["job_id"])] if job and job.get("job_id") is not None else [])


def _config_grid(config: Mapping[str, Any] | None) -> tuple[int, int, int] | None:
    par = _get(config, "parallelism") or {}
    if par.get("dp"):
        return int(par.get("tp", 1)), int(par.get("pp", 1)), int(par["dp"])
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
    records = list(records)
    starts = [i for i, r in enumerate(records) if r.get("event") == "coordinator_started" and not r.get("restart")]
    return records[starts[-1]:] if starts else records


def _injection_state(inj: InjectionStatus) -> None:
    """``refused`` / ``missed`` (a target lost or the job over before its step) / ``landed`` (every target
    fired) / ``armed`` / ``forwarded``, from what the journal and the landing records said so far."""
    if inj.reason is not None:
        inj.state = "refused"
    elif inj.missed:
        inj.state = "missed"
    elif inj.fired and {f["world_rank"] for f in inj.fired} >= set(inj.targets):
        inj.state = "landed"
    elif inj.armed_steps:
        inj.state = "armed"


def restart_requested(records: Iterable[Mapping[str, Any]]) -> bool:
    """Whether one srun step's records (:func:`current_job_records`) hold an in-job restart request
    (``restart_in_job``): that step's coordinator's end is then the step's, not the job's. Pure."""
    return any(r.get("event") == "restart_in_job" for r in records)


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


def derive_status(records: Iterable[Mapping[str, Any]], slurm: SlurmInfo | None, now: float,
                  run: RunFiles | None = None) -> Status:
    """The job's :class:`Status` from its journal ``records`` (in file order), Slurm's view and the run files.

    Pure: reads nothing, changes nothing. ``now`` (unix seconds) is used for ages only.

    Raises:
        KeyError/ValueError: a record lacks ``ts``/``event`` (the journal reader already refuses those).
    """
    slurm = slurm or SlurmInfo()
    run = run or RunFiles(run_dir="")
    cfg = run.config or {}
    st = _State()
    all_records = list(records)
    records = current_job_records(all_records)
    st.heartbeat_progress = not any(r.get("event") == "progress" for r in records)
    # the landing records of this job's injections (an earlier job of a resumed run left its own)
    since = float(records[0]["ts"]) if records and records[0].get("event") == "coordinator_started" else None
    fired = [{**f, "event": "inject_fired"} for f in run.fired if since is None or float(f["ts"]) >= since]
    merged = sorted(list(records) + fired, key=lambda r: float(r["ts"])) if fired else records
    for rec in merged:
        _apply(st, rec)
    for inj in st.injections.values():
        if inj.kind == "corrupt-replica":
            inj.outcome = corrupt_replica_outcome(inj, merged)
    if st.job_state not in TERMINAL_STATES:
        # the ranks' own step logs are fresher than the journal: their newest line since the last rollback
        after = max([since or 0.0] + [float(r["ts"]) for r in merged if r["event"] == "recovery_restored"])
        newer = [(ts, step) for ts, step in run.rank_newest if ts > after and ts > (st.live_at or 0.0)]
        if newer:
            ts, step = max(newer, key=lambda x: x[1])
            if st.live is None or step >= st.live:
                st.step_seen(ts, step)

    if st.checkpoint_pending is not None and st.job_state in TERMINAL_STATES:
        # nothing more will commit: the complete checkpoint is the newest step a resubmitted job resumes from
        st.committed(st.ended_at or now, st.checkpoint_pending)
    grid = st.grid or _config_grid(cfg)
    k = _get(cfg, "resilience", "k")
    levels = list(_get(cfg, "resilience", "placement_levels", default=None) or ["node"])
    gpus = _get(cfg, "resources", "gpus_per_node")
    domains = slurm.domains or {}

    # --- Slurm's view --------------------------------------------------------------------------------------
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

    # --- job state -----------------------------------------------------------------------------------------
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
    job_id = str(_get(run.job, "job_id")) if _get(run.job, "job_id") is not None else (sj.get("JobId") or None)

    # --- slots and nodes -------------------------------------------------------------------------------------
    job_running = slurm_state in SLURM_ACTIVE_STATES if slurm_state else None
    slots: list[SlotStatus] = []
    for w in sorted(st.slots):
        s = st.slots[w]
        note = s["note"]
        node_down = node_is_down(node_state.get(s["node"]))
        removed = bool(live_nodes) and s["node"] not in live_nodes and job_running
        if s["state"] in LIVE_SLOT_STATES and (node_down or removed):
            note = (note + "; " if note else "") + ("node down" if node_down else "node removed from the job")
            s["state"] = "dead"
        lr = s["logical_rank"]
        in_grid = s["grid"] or grid  # the grid the slot was numbered in (a dead slot keeps its own)
        slots.append(SlotStatus(w, s["node"], s["pid"], s["state"], lr,
                                _coord(lr, in_grid) if (lr is not None and in_grid) else None,
                                s["generation"], note))
    by_world = {s.world_rank: s for s in slots}
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

    finished = state in TERMINAL_STATES
    standby = [s for s in slots if s.state == "standby"]
    spare_slots = len(standby) if st.slots else None
    spare_nodes = None
    if st.slots:
        spare_nodes = sum(1 for nd in nodes if nd.role == "spare")
    elif _get(cfg, "resources", "spares") is not None and not finished:
        spare_nodes = int(cfg["resources"]["spares"])
        spare_slots = spare_nodes * int(gpus) if gpus else None

    # --- replicas --------------------------------------------------------------------------------------------
    replicas: list[ReplicaStatus] = []
    source = "reported" if st.placement else "unknown"
    placement = dict(st.placement)
    if grid and not placement and k:
        node0 = {lr: st.slots[w]["node"] for lr, w in st.rank_map0.items() if w in st.slots}
        placement, notes = _planned_placement(grid, int(k), levels, node0, domains)
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
            if k and placement and have < int(k) and not finished:
                under.append(f"{sid} ({have}/{k})")

    # --- warnings ----------------------------------------------------------------------------------------------
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
    if st.test_env:
        from phoenix_hpc.test_env import describe

        warnings.append(StatusWarning(
            "test_env", "test-only variables acted in this job: " + describe(st.test_env)
                        + "; a production job must not carry them (sbatch --export=ALL passes the submitting "
                        "shell's environment)", action="unset " + " ".join(st.test_env) + " before phoenix submit"))

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
        step_at=st.live_at, slurm_unreachable=slurm.unreachable,
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
                  progress=st.progress, commits=st.commits, journal_records=len(records), run_jobs=jobs,
                  drains=list(st.drains.values()), shrinks=list(st.shrinks))
