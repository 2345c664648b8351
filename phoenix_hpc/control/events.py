"""Every record of the job's journal (``RUN_DIR/journal.jsonl``) as a typed, frozen event.

The one place that spells an event name. A writer hands an event to :meth:`~phoenix_hpc.control.journal.
Journal.append` (``journal.append(SlotsDead(slots=[3], ...))``); a reader turns a record back into one with
:func:`from_record`, or compares ``rec["event"]`` with a class's ``NAME``.

On disk nothing changed: one JSON object per line, ``{"ts": unix seconds, "event": NAME, **fields}``, so a
journal written before these classes existed reads the same. :meth:`Event.to_record` gives the fields (no
``ts``: the journal stamps it when it writes); :meth:`Event.from_record` takes a record back:

- a field the record lacks takes the class's default (every field has one: an older coordinator wrote fewer),
  but for the few a class lists in ``REQUIRED`` (a ``commit`` without ``recoverable_step`` says nothing);
- a field the record has must be of its annotated type (``Nat``: an integer >= 0; ``float``: a finite number;
  ``X | None``: null allowed; lists and objects of them; ``Any``: anything), and ``ts`` a finite number, or
  :meth:`Event.from_record` raises :class:`EventError` naming the field, the value and what is allowed (the
  fold skips and names such a record, so no reader after it sees a wrong type);
- a field written only sometimes (``restart`` of ``coordinator_started``, ``placement`` of ``commit``...)
  defaults to :data:`OMIT` and is left out of :meth:`Event.to_record` while it is;
- a field the class does not declare is kept in ``extra`` (a newer writer's field, the counters of
  ``heartbeat_summary``, the recovery plan's own fields), so for a record the coordinator wrote
  ``from_record(r).to_record()`` is ``r`` less ``ts``, key order aside;
- an event name no class declares gives an :class:`UnknownEvent` (the fold records it as skipped).

Units: ``*_s`` fields and ``ts`` (unix time) are seconds; steps are training iterations; ``world_rank`` is a
slot's fixed rank in the Slurm step, ``logical_rank`` its rank in its generation's grid (docs/design.md 2).
"""

from __future__ import annotations

from typing import Any, Mapping

from phoenix_hpc.control.event_base import (  # noqa: F401 - re-exported: the events' own machinery
    OMIT, REGISTRY, Event, EventError, Grid, JobEnd, Nat, RankMap, UnknownEvent, event as _ev,
    from_record, name_of, well_typed)
from phoenix_hpc.control.states import RecoveryPhase  # noqa: F401 - re-exported: the phase of recovery_aborted


# The timed phases of a finished recovery (``recovery_done.phases``: seconds each), in the order they happen.
TIMED_PHASES = ("detect", "reconfigure", "params", "optimizer", "replay")

# --- the coordinator process -----------------------------------------------------------------------------

@_ev("coordinator_started")
class CoordinatorStarted(Event):
    host: str | None = None
    port: Nat | None = None
    pid: Nat | None = None
    job_id: str | int | None = None
    next_job: str | int | None = None
    heartbeat_interval_s: float | None = None
    heartbeat_timeout_s: float | None = None
    grid: Grid | None = None  # [tp, pp, dp], or None before the job knows it
    restart: Nat | None = OMIT  # N: the N-th restart of this job's coordinator after a crash

@_ev("coordinator_restarted")
class CoordinatorRestarted(Event):
    restart: Nat | None = None
    generation: Nat | None = None
    job_state: str | None = None
    recoverable_step: Nat | None = None
    checkpoint_step: Nat | None = None
    slots: Nat | None = None
    dead: list[Nat] | None = None
    recovery_interrupted: bool | None = None
    pending_faults: Nat | None = None
    skipped: list[str] | None = OMIT  # journal lines the rebuild could not take, with the reason (the first 20)

@_ev("coordinator_exit")
class CoordinatorExit(Event):
    job_state: str | None = None

@_ev("coordinator_paused")
class CoordinatorPaused(Event):
    paused_s: float | None = None
    reason: str | None = None

@_ev("test_env")
class TestEnv(Event):
    variables: dict[str, Any] | None = None

@_ev("test_hold")
class TestHold(Event):
    after: str | None = None
    hold_s: float | None = None

@_ev("rejected")
class Rejected(Event):
    reason: str | None = None
    message_type: str | None = None
    world_rank: int | None = None

# --- membership and progress ------------------------------------------------------------------------------

@_ev("registered")
class Registered(Event):
    REQUIRED = ('world_rank',)
    world_rank: Nat = None
    pid: Nat | None = None
    node: str | None = None
    role: str | None = None
    logical_rank: Nat | None = None
    placement_inputs: dict[str, Any] | None = OMIT  # {"k", "levels", "domain"}

@_ev("job_running")
class JobRunning(Event):
    generation: Nat | None = None
    grid: Grid | None = None
    rank_map: RankMap | None = None  # [[logical rank, world rank], ...]
    standby: list[Nat] | None = None

@_ev("rejoined")
class Rejoined(Event):
    REQUIRED = ('world_rank',)
    world_rank: Nat = None
    pid: Nat | None = None
    node: str | None = None
    role: str | None = None
    generation: Nat | None = None
    step: Nat | None = None
    again: bool | None = None
    buffered: Nat | None = None
    dropped: Nat | None = None

@_ev("rejoin_refused")
class RejoinRefused(Event):
    world_rank: Nat | None = None
    pid: Nat | None = None
    reason: str | None = None

@_ev("progress")
class Progress(Event):
    REQUIRED = ('step',)
    step: Nat = None
    min_step: Nat | None = None
    generation: Nat | None = None

@_ev("step")
class StepSeen(Event):
    """Live progress as the oldest coordinators wrote it (read only)."""
    REQUIRED = ('step',)
    step: Nat = None

@_ev("heartbeat_summary")
class HeartbeatSummary(Event):
    generation: Nat | None = None
    job_state: str | None = None
    active: list[Nat] | None = None
    standby: list[Nat] | None = None
    dead: list[Nat] | None = None
    max_step: Nat | None = None
    accepted: Nat | None = None  # the coordinator's message counters
    rejected: Nat | None = None
    heartbeats: Nat | None = None
    heartbeat_messages: Nat | None = None
    heartbeat_age: dict[str, float] | None = None
    cpu_s: float | None = None

@_ev("protect_interval")
class ProtectInterval(Event):
    interval: Nat | None = None
    step: Nat | None = None
    generation: Nat | None = None
    lost_steps_at_most: Nat | None = None

@_ev("commit")
class Commit(Event):
    REQUIRED = ('recoverable_step',)
    recoverable_step: Nat = None
    protect_every: Nat | None = None
    shards: Nat | None = None
    replicas: Nat | None = None
    generation: Nat | None = None
    shard_steps: dict[str, dict[str, Nat]] | None = None  # {shard id: {logical rank: committed step}}
    placement: dict[str, list[Nat]] | None = OMIT  # {shard id: [holder logical ranks]}
    shard_bytes: dict[str, Nat] | None = OMIT  # {shard id: bytes}
    agreement: dict[str, Nat | None] | None = OMIT  # {"checked", "disagreed", "last_step"}: replica agreement (control/agreement.py)

@_ev("placement")
class Placement(Event):
    """The replica placement as older coordinators wrote it (read only)."""
    replicas: list[list[str | Nat]] | None = None  # [[shard id, owner, holder], ...] (logical ranks)

@_ev("checkpoint")
class Checkpoint(Event):
    step: Nat | None = None
    path: str | None = None
    world_rank: Nat | None = OMIT
    source: str | None = OMIT
    write_s: float | None = OMIT
    total_s: float | None = OMIT
    bytes: Nat | None = OMIT

@_ev("checkpoint_incomplete")
class CheckpointIncomplete(Event):
    step: Nat | None = None
    reasons: list[str] | None = None

@_ev("checkpoints_pruned")
class CheckpointsPruned(Event):
    steps: list[Nat] | None = None
    keep: Nat | None = None

# --- faults and decisions -------------------------------------------------------------------------------

@_ev("fault")
class Fault(Event):
    world_rank: Nat | None = None
    node: str | None = None
    generation: Nat | None = None
    step: Nat | None = None
    phase: str | None = None
    kind: str | None = None
    exc_type: str | None = None
    message: str | None = None
    superseded: bool | None = None

@_ev("slots_dead")
class SlotsDead(Event):
    slots: list[Nat] | None = None
    nodes: list[str] | None = None
    kind: str | None = None
    reason: str | None = None

@_ev("spare_lost")
class SpareLost(Event):
    slots: list[Nat] | None = None
    spares_left: Nat | None = None

@_ev("signal")
class SignalSeen(Event):
    signal: str | int | None = None
    world_rank: Nat | None = None
    node: str | None = None

@_ev("decision")
class Decision(Event):
    action: str | None = None
    reason: str | None = None
    faults: list[dict[str, Any]] | None = OMIT
    checkpoint_step: Nat | None = OMIT
    lost_steps: Nat | None = OMIT
    lost_shards: list[str] | None = OMIT

@_ev("replica_rejected")
class ReplicaRejected(Event):
    generation: Nat | None = None
    world_rank: Nat | None = None
    logical_rank: Nat | None = None
    node: str | None = None
    shard_id: str | None = None
    step: Nat | None = None
    reason: str | None = None

@_ev("silent_corruption")
class SilentCorruption(Event):
    """The DP replicas of one (pp, tp) reported different parameter digests with their commit of ``step``
    (control/agreement.py): ``members`` {logical rank: digest hex}; ``suspects`` the logical ranks outside
    the majority (all of them when there is none, dp = 2); ``majority`` the logical ranks of the strict
    majority (OMIT when there is none)."""
    generation: Nat | None = None
    step: Nat | None = None
    pp: Nat | None = None
    tp: Nat | None = None
    members: dict[str, str] | None = None
    suspects: list[Nat] | None = None
    majority: list[Nat] | None = OMIT

@_ev("agreement_rejected")
class AgreementRejected(Event):
    """A member's parameter digest that was not compared (wrong length, an old generation), and why."""
    world_rank: Nat | None = None
    logical_rank: Nat | None = None
    generation: Nat | None = None
    step: Nat | None = None
    reason: str | None = None

@_ev("agreement_undetectable")
class AgreementUndetectable(Event):
    """Stages whose parameters no peer can be compared with (dp = 1), journalled once per generation."""
    generation: Nat | None = None
    stages: list[list[Nat]] | None = None  # [[pp, tp], ...]
    reason: str | None = None

@_ev("agreement_off")
class AgreementOff(Event):
    """The DP replicas' parameters are not compared in generation ``generation``, ``reason`` says why:
    ``resilience.replica_agreement: false`` (no digest computed, none in the commit fence or the commit reports;
    journalled once per generation at its first commit report), or a job without in-memory protection (no
    snapshot at all; journalled once, at ``job_running``). A check not made is never silently skipped."""
    generation: Nat | None = None
    reason: str | None = None

# --- recoveries ---------------------------------------------------------------------------------------------

@_ev("recovery_start")
class RecoveryStart(Event):
    generation: Nat | None = None
    action: str | None = None
    survivors: list[Nat] | None = None
    dead: list[Nat] | None = None
    detect_s: float | None = None
    drain: str | None = OMIT  # the drain request this hot swap carries out
    drained: list[Nat] | None = OMIT

@_ev("recovery_plan")
class RecoveryPlanned(Event):
    """The plan of generation ``generation``: the declared fields are those the fold reads; the rest of
    :meth:`phoenix_hpc.recovery.plan.RecoveryPlan.to_json` travels in ``extra``."""
    generation: Nat | None = None
    action: str | None = None
    grid: Grid | None = None  # {"tp", "pp", "dp"}
    rank_map: RankMap | None = None
    dead_world: list[Nat] | None = None
    joins: list[dict[str, Any]] | None = None  # [{"world_rank", "node", "logical_rank", "coord", "replaces_world_rank"}]
    recoverable_step: Nat | None = None
    steps_replayed: Nat | None = None
    shrink: dict[str, Any] | None = OMIT  # {"old_grid", "leavers", "needs", "sources", "lost"}

@_ev("recovery_plan_sent")
class RecoveryPlanSent(Event):
    generation: Nat | None = None
    members: Nat | None = None
    plan_s: float | None = None
    send_s: float | None = None

@_ev("evidence_rejected")
class EvidenceRejected(Event):
    generation: Nat | None = None
    reasons: list[str] | None = None

@_ev("invariant_violation")
class InvariantViolation(Event):
    generation: Nat | None = None
    violations: list[Any] | None = None
    rejected: Any = None

@_ev("shrink")
class Shrink(Event):
    generation: Nat | None = None
    dp_from: Nat | None = None
    dp_to: Nat | None = None
    grid: Grid | None = None
    recoverable_step: Nat | None = None
    freed: list[Nat] | None = None
    lost: list[Nat] | None = None
    drain: str | None = OMIT

@_ev("recovery_restored")
class RecoveryRestored(Event):
    generation: Nat | None = None
    recoverable_step: Nat | None = None
    invariants: list[str] | None = None
    restore_s: float | None = None

@_ev("recovery_done")
class RecoveryDone(Event):
    generation: Nat | None = None
    action: str | None = None
    total_s: float | None = None
    phases: dict[str, float] | None = None  # {TIMED_PHASES name: seconds}
    steps_replayed: Nat | None = None
    recoverable_step: Nat | None = None
    replay_interrupted: bool | None = None
    drain: str | None = OMIT

@_ev("recovery_aborted")
class RecoveryAborted(Event):
    generation: Nat | None = None
    phase: str | None = None
    reason: str | None = None

@_ev("checkpoint_restart")
class CheckpointRestart(Event):
    generation: Nat | None = None
    reason: str | None = None
    lost_shards: list[str] | None = None
    checkpoint_step: Nat | None = None
    lost_steps: Nat | None = None
    checkpoint_path: str | None = None

@_ev("restart_in_job")
class RestartInJob(Event):
    dead_nodes: list[str] | None = None
    checkpoint_step: Nat | None = None
    reason: str | None = None

# --- injected faults and planned drains -------------------------------------------------------------------

@_ev("inject_forwarded")
class InjectForwarded(Event):
    kind: str | None = None
    phase: str | None = None
    at_step: Nat | None = None
    targets: list[Nat] | None = None
    target: dict[str, Any] | None = None
    request_id: str | None = None
    shard_id: str | None = OMIT  # corrupt-replica: the shard whose replica the target holds

@_ev("inject_armed")
class InjectArmed(Event):
    request_id: str | None = None
    armed_steps: list[list[Nat]] | None = None  # [[world rank, step], ...]
    started_steps: list[list[Nat]] | None = None

@_ev("inject_landed")
class InjectLanded(Event):
    request_id: str | None = None
    world_rank: Nat | None = None
    step: Nat | None = None
    phase: str | None = None
    at_step: Nat | None = None
    exact: bool | None = None

@_ev("inject_fired")
class InjectFired(Event):
    """A landing the slot wrote to ``RUN_DIR/faults/fired-*.json`` (status merges them with the journal)."""
    request_id: str | None = None
    world_rank: Nat | None = None
    step: Nat | None = None
    phase: str | None = None
    kind: str | None = None
    at_step: Nat | None = None

@_ev("inject_refused")
class InjectRefused(Event):
    request_id: str | None = None
    reason: str | None = None
    targets: list[Nat] | None = None

@_ev("inject_missed")
class InjectMissed(Event):
    request_id: str | None = None
    world_rank: Nat | None = None
    at_step: Nat | None = None
    reason: str | None = None

@_ev("drain_requested")
class DrainRequested(Event):
    request_id: str | None = None
    target: dict[str, Any] | None = None
    targets: list[Nat] | None = None
    nodes: list[str] | None = None
    at_step: Nat | None = None

@_ev("drain_rearmed")
class DrainRearmed(Event):
    request_id: str | None = None
    at_step: Nat | None = None
    attempt: Nat | None = None

@_ev("drain_armed")
class DrainArmed(Event):
    request_id: str | None = None
    at_step: Nat | None = None
    members: list[Nat] | None = None

@_ev("drain_start")
class DrainStart(Event):
    request_id: str | None = None
    targets: list[Nat] | None = None
    nodes: list[str] | None = None
    live_step: Nat | None = None

@_ev("drain_done")
class DrainDone(Event):
    request_id: str | None = None
    generation: Nat | None = None
    steps_replayed: Nat | None = None
    recoverable_step: Nat | None = None
    moved: list[list[Nat]] | None = None
    total_s: float | None = None
    dp: Nat | None = OMIT  # a drain carried out by a shrink: the new dp and the slots it freed
    freed: list[Nat] | None = OMIT

@_ev("drain_missed")
class DrainMissed(Event):
    request_id: str | None = None
    at_step: Nat | None = None
    targets: list[Nat] | None = None
    reason: str | None = None

@_ev("drain_refused")
class DrainRefused(Event):
    request_id: str | None = None
    reason: str | None = None
    targets: list[Nat] | None = None

# --- the end of the job -------------------------------------------------------------------------------------

@_ev("stopping")
class Stopping(Event):
    reason: str | None = None
    signal: str | int | None = None
    members: list[Nat] | None = None
    generation: Nat | None = None

@_ev("job_done")
class JobDone(JobEnd):
    JOB_STATE = "done"
    final_hash: str | None = None
    step: Nat | None = None
    grid: Grid | None = None
    steps_agree: bool | None = None
    generation: Nat | None = None
    rank_hashes: list[str] | None = None

@_ev("clean_stop")
class CleanStop(JobEnd):
    checkpoint_step: Nat | None = OMIT

@_ev("fallback")
class Fallback(JobEnd):
    checkpoint_step: Nat | None = None
    lost_steps: Nat | None = None
    checkpoint_path: str | None = None

@_ev("in_job_restart")
class InJobRestart(JobEnd):
    checkpoint_step: Nat | None = None

@_ev("coordinator_stopped")
class CoordinatorStopped(JobEnd):
    JOB_STATE = "stopped"
    signal: str | int | None = None
    checkpoint_step: Nat | None = None
    checkpoint_path: str | None = None
    note: str | None = None


# The records that end a job, and the job state each leaves (``in_job_restart`` ends one srun step of it:
# the batch script starts the next; a status reads it as the step's end, see status/jobs.py).
JOB_END_STATES: Mapping[str, str] = {c.NAME: c.JOB_STATE for c in (JobDone, CleanStop, Fallback, CoordinatorStopped)}
JOB_END_EVENTS = frozenset(JOB_END_STATES)
