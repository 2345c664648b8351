"""Every record of the job's journal (``RUN_DIR/journal.jsonl``) as a typed, frozen event.

The one place that spells an event name. A writer hands an event to :meth:`~phoenix_hpc.control.journal.
Journal.append` (``journal.append(SlotsDead(slots=[3], ...))``); a reader turns a record back into one with
:func:`from_record`, or compares ``rec["event"]`` with a class's ``NAME``.

On disk nothing changed: one JSON object per line, ``{"ts": unix seconds, "event": NAME, **fields}``, so a
journal written before these classes existed reads the same. :meth:`Event.to_record` gives the fields (no
``ts``: the journal stamps it when it writes); :meth:`Event.from_record` takes a record back:

- a field the record lacks takes the class's default (every field has one: an older coordinator wrote fewer);
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
    OMIT, REGISTRY, Event, EventError, JobEnd, UnknownEvent, event as _ev, from_record, name_of)
from phoenix_hpc.control.states import RecoveryPhase  # noqa: F401 - re-exported: the phase of recovery_aborted


# The timed phases of a finished recovery (``recovery_done.phases``: seconds each), in the order they happen.
TIMED_PHASES = ("detect", "reconfigure", "params", "optimizer", "replay")

# --- the coordinator process -----------------------------------------------------------------------------

@_ev("coordinator_started")
class CoordinatorStarted(Event):
    host: Any = None
    port: Any = None
    pid: Any = None
    job_id: Any = None
    next_job: Any = None
    heartbeat_interval_s: Any = None
    heartbeat_timeout_s: Any = None
    grid: Any = None  # [tp, pp, dp], or None before the job knows it
    restart: Any = OMIT  # N: the N-th restart of this job's coordinator after a crash

@_ev("coordinator_restarted")
class CoordinatorRestarted(Event):
    restart: Any = None
    generation: Any = None
    job_state: Any = None
    recoverable_step: Any = None
    checkpoint_step: Any = None
    slots: Any = None
    dead: Any = None
    recovery_interrupted: Any = None
    pending_faults: Any = None
    skipped: Any = OMIT  # journal lines the rebuild could not take, with the reason (the first 20)

@_ev("coordinator_exit")
class CoordinatorExit(Event):
    job_state: Any = None

@_ev("coordinator_paused")
class CoordinatorPaused(Event):
    paused_s: Any = None
    reason: Any = None

@_ev("test_env")
class TestEnv(Event):
    variables: Any = None

@_ev("test_hold")
class TestHold(Event):
    after: Any = None
    hold_s: Any = None

@_ev("rejected")
class Rejected(Event):
    reason: Any = None
    message_type: Any = None
    world_rank: Any = None

# --- membership and progress ------------------------------------------------------------------------------

@_ev("registered")
class Registered(Event):
    world_rank: Any = None
    pid: Any = None
    node: Any = None
    role: Any = None
    logical_rank: Any = None
    placement_inputs: Any = OMIT  # {"k", "levels", "domain"}

@_ev("job_running")
class JobRunning(Event):
    generation: Any = None
    grid: Any = None
    rank_map: Any = None  # [[logical rank, world rank], ...]
    standby: Any = None

@_ev("rejoined")
class Rejoined(Event):
    world_rank: Any = None
    pid: Any = None
    node: Any = None
    role: Any = None
    generation: Any = None
    step: Any = None
    again: Any = None
    buffered: Any = None
    dropped: Any = None

@_ev("rejoin_refused")
class RejoinRefused(Event):
    world_rank: Any = None
    pid: Any = None
    reason: Any = None

@_ev("progress")
class Progress(Event):
    step: Any = None
    min_step: Any = None
    generation: Any = None

@_ev("step")
class StepSeen(Event):
    """Live progress as the oldest coordinators wrote it (read only)."""
    step: Any = None

@_ev("heartbeat_summary")
class HeartbeatSummary(Event):
    generation: Any = None
    job_state: Any = None
    active: Any = None
    standby: Any = None
    dead: Any = None
    max_step: Any = None
    accepted: Any = None  # the coordinator's message counters
    rejected: Any = None
    heartbeats: Any = None
    heartbeat_messages: Any = None
    heartbeat_age: Any = None
    cpu_s: Any = None

@_ev("protect_interval")
class ProtectInterval(Event):
    interval: Any = None
    step: Any = None
    generation: Any = None
    lost_steps_at_most: Any = None

@_ev("commit")
class Commit(Event):
    recoverable_step: Any = None
    protect_every: Any = None
    shards: Any = None
    replicas: Any = None
    generation: Any = None
    shard_steps: Any = None  # {shard id: {logical rank: committed step}}
    placement: Any = OMIT  # {shard id: [holder logical ranks]}
    shard_bytes: Any = OMIT  # {shard id: bytes}
    agreement: Any = OMIT  # {"checked", "disagreed", "last_step"}: replica agreement (control/agreement.py)

@_ev("placement")
class Placement(Event):
    """The replica placement as older coordinators wrote it (read only)."""
    replicas: Any = None  # [[shard id, owner, holder], ...] (logical ranks)

@_ev("checkpoint")
class Checkpoint(Event):
    step: Any = None
    path: Any = None
    world_rank: Any = OMIT
    source: Any = OMIT
    write_s: Any = OMIT
    total_s: Any = OMIT
    bytes: Any = OMIT

@_ev("checkpoint_incomplete")
class CheckpointIncomplete(Event):
    step: Any = None
    reasons: Any = None

@_ev("checkpoints_pruned")
class CheckpointsPruned(Event):
    steps: Any = None
    keep: Any = None

# --- faults and decisions -------------------------------------------------------------------------------

@_ev("fault")
class Fault(Event):
    world_rank: Any = None
    node: Any = None
    generation: Any = None
    step: Any = None
    phase: Any = None
    kind: Any = None
    exc_type: Any = None
    message: Any = None
    superseded: Any = None

@_ev("slots_dead")
class SlotsDead(Event):
    slots: Any = None
    nodes: Any = None
    kind: Any = None
    reason: Any = None

@_ev("spare_lost")
class SpareLost(Event):
    slots: Any = None
    spares_left: Any = None

@_ev("signal")
class SignalSeen(Event):
    signal: Any = None
    world_rank: Any = None
    node: Any = None

@_ev("decision")
class Decision(Event):
    action: Any = None
    reason: Any = None
    faults: Any = OMIT
    checkpoint_step: Any = OMIT
    lost_steps: Any = OMIT
    lost_shards: Any = OMIT

@_ev("replica_rejected")
class ReplicaRejected(Event):
    generation: Any = None
    world_rank: Any = None
    logical_rank: Any = None
    node: Any = None
    shard_id: Any = None
    step: Any = None
    reason: Any = None

@_ev("silent_corruption")
class SilentCorruption(Event):
    """The DP replicas of one (pp, tp) reported different parameter digests with their commit of ``step``
    (control/agreement.py): ``members`` {logical rank: digest hex}; ``suspects`` the logical ranks outside
    the majority (all of them when there is none, dp = 2); ``majority`` the logical ranks of the strict
    majority (OMIT when there is none)."""
    generation: Any = None
    step: Any = None
    pp: Any = None
    tp: Any = None
    members: Any = None
    suspects: Any = None
    majority: Any = OMIT

@_ev("agreement_rejected")
class AgreementRejected(Event):
    """A member's parameter digest that was not compared (wrong length, an old generation), and why."""
    world_rank: Any = None
    logical_rank: Any = None
    generation: Any = None
    step: Any = None
    reason: Any = None

@_ev("agreement_undetectable")
class AgreementUndetectable(Event):
    """Stages whose parameters no peer can be compared with (dp = 1), journalled once per generation."""
    generation: Any = None
    stages: Any = None  # [[pp, tp], ...]
    reason: Any = None

@_ev("agreement_off")
class AgreementOff(Event):
    """The DP replicas' parameters are not compared in generation ``generation``, ``reason`` says why:
    ``resilience.replica_agreement: false`` (no digest computed, none in the commit fence or the commit reports;
    journalled once per generation at its first commit report), or a job without in-memory protection (no
    snapshot at all; journalled once, at ``job_running``). A check not made is never silently skipped."""
    generation: Any = None
    reason: Any = None

# --- recoveries ---------------------------------------------------------------------------------------------

@_ev("recovery_start")
class RecoveryStart(Event):
    generation: Any = None
    action: Any = None
    survivors: Any = None
    dead: Any = None
    detect_s: Any = None
    drain: Any = OMIT  # the drain request this hot swap carries out
    drained: Any = OMIT

@_ev("recovery_plan")
class RecoveryPlanned(Event):
    """The plan of generation ``generation``: the declared fields are those the fold reads; the rest of
    :meth:`phoenix_hpc.recovery.plan.RecoveryPlan.to_json` travels in ``extra``."""
    generation: Any = None
    action: Any = None
    grid: Any = None  # {"tp", "pp", "dp"}
    rank_map: Any = None
    dead_world: Any = None
    joins: Any = None  # [{"world_rank", "node", "logical_rank", "coord", "replaces_world_rank"}]
    recoverable_step: Any = None
    steps_replayed: Any = None
    shrink: Any = OMIT  # {"old_grid", "leavers", "needs", "sources", "lost"}

@_ev("recovery_plan_sent")
class RecoveryPlanSent(Event):
    generation: Any = None
    members: Any = None
    plan_s: Any = None
    send_s: Any = None

@_ev("evidence_rejected")
class EvidenceRejected(Event):
    generation: Any = None
    reasons: Any = None

@_ev("invariant_violation")
class InvariantViolation(Event):
    generation: Any = None
    violations: Any = None
    rejected: Any = None

@_ev("shrink")
class Shrink(Event):
    generation: Any = None
    dp_from: Any = None
    dp_to: Any = None
    grid: Any = None
    recoverable_step: Any = None
    freed: Any = None
    lost: Any = None
    drain: Any = OMIT

@_ev("recovery_restored")
class RecoveryRestored(Event):
    generation: Any = None
    recoverable_step: Any = None
    invariants: Any = None
    restore_s: Any = None

@_ev("recovery_done")
class RecoveryDone(Event):
    generation: Any = None
    action: Any = None
    total_s: Any = None
    phases: Any = None  # {TIMED_PHASES name: seconds}
    steps_replayed: Any = None
    recoverable_step: Any = None
    replay_interrupted: Any = None
    drain: Any = OMIT

@_ev("recovery_aborted")
class RecoveryAborted(Event):
    generation: Any = None
    phase: Any = None
    reason: Any = None

@_ev("checkpoint_restart")
class CheckpointRestart(Event):
    generation: Any = None
    reason: Any = None
    lost_shards: Any = None
    checkpoint_step: Any = None
    lost_steps: Any = None
    checkpoint_path: Any = None

@_ev("restart_in_job")
class RestartInJob(Event):
    dead_nodes: Any = None
    checkpoint_step: Any = None
    reason: Any = None

# --- injected faults and planned drains -------------------------------------------------------------------

@_ev("inject_forwarded")
class InjectForwarded(Event):
    kind: Any = None
    phase: Any = None
    at_step: Any = None
    targets: Any = None
    target: Any = None
    request_id: Any = None
    shard_id: Any = OMIT  # corrupt-replica: the shard whose replica the target holds

@_ev("inject_armed")
class InjectArmed(Event):
    request_id: Any = None
    armed_steps: Any = None  # [[world rank, step], ...]
    started_steps: Any = None

@_ev("inject_landed")
class InjectLanded(Event):
    request_id: Any = None
    world_rank: Any = None
    step: Any = None
    phase: Any = None
    at_step: Any = None
    exact: Any = None

@_ev("inject_fired")
class InjectFired(Event):
    """A landing the slot wrote to ``RUN_DIR/faults/fired-*.json`` (status merges them with the journal)."""
    request_id: Any = None
    world_rank: Any = None
    step: Any = None
    phase: Any = None
    kind: Any = None
    at_step: Any = None

@_ev("inject_refused")
class InjectRefused(Event):
    request_id: Any = None
    reason: Any = None
    targets: Any = None

@_ev("inject_missed")
class InjectMissed(Event):
    request_id: Any = None
    world_rank: Any = None
    at_step: Any = None
    reason: Any = None

@_ev("drain_requested")
class DrainRequested(Event):
    request_id: Any = None
    target: Any = None
    targets: Any = None
    nodes: Any = None
    at_step: Any = None

@_ev("drain_rearmed")
class DrainRearmed(Event):
    request_id: Any = None
    at_step: Any = None
    attempt: Any = None

@_ev("drain_armed")
class DrainArmed(Event):
    request_id: Any = None
    at_step: Any = None
    members: Any = None

@_ev("drain_start")
class DrainStart(Event):
    request_id: Any = None
    targets: Any = None
    nodes: Any = None
    live_step: Any = None

@_ev("drain_done")
class DrainDone(Event):
    request_id: Any = None
    generation: Any = None
    steps_replayed: Any = None
    recoverable_step: Any = None
    moved: Any = None
    total_s: Any = None
    dp: Any = OMIT  # a drain carried out by a shrink: the new dp and the slots it freed
    freed: Any = OMIT

@_ev("drain_missed")
class DrainMissed(Event):
    request_id: Any = None
    at_step: Any = None
    targets: Any = None
    reason: Any = None

@_ev("drain_refused")
class DrainRefused(Event):
    request_id: Any = None
    reason: Any = None
    targets: Any = None

# --- the end of the job -------------------------------------------------------------------------------------

@_ev("stopping")
class Stopping(Event):
    reason: Any = None
    signal: Any = None
    members: Any = None
    generation: Any = None

@_ev("job_done")
class JobDone(JobEnd):
    JOB_STATE = "done"
    final_hash: Any = None
    step: Any = None
    grid: Any = None
    steps_agree: Any = None
    generation: Any = None
    rank_hashes: Any = None

@_ev("clean_stop")
class CleanStop(JobEnd):
    checkpoint_step: Any = OMIT

@_ev("fallback")
class Fallback(JobEnd):
    checkpoint_step: Any = None
    lost_steps: Any = None
    checkpoint_path: Any = None

@_ev("in_job_restart")
class InJobRestart(JobEnd):
    checkpoint_step: Any = None

@_ev("coordinator_stopped")
class CoordinatorStopped(JobEnd):
    JOB_STATE = "stopped"
    signal: Any = None
    checkpoint_step: Any = None
    checkpoint_path: Any = None
    note: Any = None


# The records that end a job, and the job state each leaves (``in_job_restart`` ends one srun step of it:
# the batch script starts the next; a status reads it as the step's end, see status/jobs.py).
JOB_END_STATES: Mapping[str, str] = {c.NAME: c.JOB_STATE for c in (JobDone, CleanStop, Fallback, CoordinatorStopped)}
JOB_END_EVENTS = frozenset(JOB_END_STATES)
