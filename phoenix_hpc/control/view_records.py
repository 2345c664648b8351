"""The records of the journal fold (:mod:`phoenix_hpc.control.view`): the job's view and what it holds.

Plain dataclasses, shown as they are by ``phoenix status`` (:mod:`phoenix_hpc.status.model` re-exports
:class:`RecoveryStatus`, :class:`FaultStatus`, :class:`InjectionStatus` and :class:`DrainStatus`). Times are unix
seconds; ``*_s`` fields are durations in seconds; steps are training iterations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from phoenix_hpc.control.events import RecoveryPhase

TERMINAL_STATES = frozenset({"done", "failed", "stopped", "ended"})
LIVE_SLOT_STATES = frozenset({"active", "standby", "joining", "quiesced"})

Grid = tuple[int, int, int]  # (tp, pp, dp)


@dataclass
class SlotView:
    """One slot as the journal tells it. ``state``: active, standby, joining, quiesced, dead, drained (left
    by a planned drain) or done (the job finished); ``generation``: the one it was last restored at (None for
    a spare never used); ``grid``: the grid its logical rank was numbered in when that differs from the job's
    (a shrink renumbers); ``domain``: its node's failure domains (from its registration)."""

    world_rank: int
    node: str
    pid: int | None
    state: str
    logical_rank: int | None
    generation: int | None
    role: str = "active"  # active | standby
    note: str = ""
    grid: Grid | None = None
    domain: dict[str, str] | None = None
    step: int = 0  # its step when it last re-registered with a restarted coordinator (rejoined)


@dataclass
class InProgress:
    """The recovery in progress as the coordinator runs it: ``survivors`` and ``dead`` (world ranks) of its
    ``recovery_start``, and its phase (ABORTED: cut short; the next recovery_start replaces it)."""

    generation: int
    survivors: list[int]
    dead: list[int]
    phase: RecoveryPhase = RecoveryPhase.QUIESCE


@dataclass
class RecoveryStatus:
    """One recovery as ``phoenix status`` shows it."""

    generation: int
    action: str | None  # hot_swap | local_recovery | fallback
    state: str  # in_progress | done | aborted | fallback
    started_at: float
    finished_at: float | None
    reason: str | None
    dead_slots: list[int]
    joins: list[dict[str, Any]]  # {world_rank, node, logical_rank, replaces_world_rank}
    detect_s: float | None
    total_s: float | None
    phases: dict[str, float]  # recovery_done's: detect, reconfigure, params, optimizer, replay (seconds)
    steps_replayed: int | None
    recoverable_step: int | None
    planned_at: float | None = None  # when the recovery plan was journalled (end of the quiesce phase)
    quiesce_s: float | None = None  # recovery_start -> recovery_plan: survivors leaving the step they were in

    @property
    def other_s(self) -> float | None:
        """``total_s`` minus ``phases`` and ``quiesce_s``: time no phase accounts for (messages between the
        coordinator and the members, invariant checks; negative where phases overlap). None until done."""
        if self.total_s is None or not self.phases:
            return None
        return round(float(self.total_s) - sum(self.phases.values()) - (self.quiesce_s or 0.0), 3)


@dataclass
class FaultStatus:
    ts: float
    kind: str
    world_rank: int | None
    node: str | None
    step: int | None
    phase: str | None
    message: str
    source: str  # "reported" (by a rank) | "detected" (by the coordinator)


@dataclass
class InjectionStatus:
    request_id: str
    ts: float
    kind: str  # user kind name (crash, kill-node, ...)
    phase: str  # user phase name
    at_step: int | None
    targets: list[int]  # world ranks
    fired: list[dict[str, Any]]  # {world_rank, step, phase, ts}: where it actually landed
    # forwarded (targets asked) | armed (every target confirmed) | refused | landed | missed
    state: str = "forwarded"
    armed_steps: dict[int, int] = field(default_factory=dict)  # world rank -> step it armed the fault at
    missed: list[dict[str, Any]] = field(default_factory=list)  # {world_rank, at_step, reason}
    reason: str | None = None  # why it was refused
    # corrupt-replica: what became of the corrupted copies (derive.corrupt_replica_outcome), None otherwise
    outcome: str | None = None

    def settle(self) -> None:
        """``state`` from what the journal and the landing records said so far: ``refused``, ``missed`` (a
        target lost or the job over before its step), ``landed`` (every target fired), ``armed``, else as is."""
        if self.reason is not None:
            self.state = "refused"
        elif self.missed:
            self.state = "missed"
        elif self.fired and {f["world_rank"] for f in self.fired} >= set(self.targets):
            self.state = "landed"
        elif self.armed_steps:
            self.state = "armed"


@dataclass
class DrainStatus:
    """One planned drain (``phoenix drain``, journal ``drain_*`` records)."""

    request_id: str
    ts: float
    target: dict[str, Any]
    targets: list[int]  # world ranks moved off
    nodes: list[str]
    at_step: int | None  # the iteration at whose commit fence every member pauses
    # requested | armed | moving | done | refused | missed
    state: str = "requested"
    steps_replayed: int | None = None
    moved: list[list[int]] = field(default_factory=list)  # [old world rank, new world rank, logical rank]
    generation: int | None = None
    reason: str | None = None  # why it was refused or missed


@dataclass
class AgreementRepair:
    """One difference of the DP replicas' parameters that replica agreement found (docs/design.md section 6,
    *Repair from memory*) and what became of it, as the journal tells it: the ``silent_corruption`` record
    (``step``, the (``pp``, ``tp``) stage, the generation whose commits showed it, the members' digests
    {logical rank: digest hex}, ``suspects`` and ``majority`` (logical ranks; no majority: ``[]``, with
    dp = 2 nobody can tell) and ``suspect_world_ranks``), the ``decision`` whose faults name it as their
    ``bad_step``, and the recovery that followed (``recovery_generation``, ``action``, the step restored
    ``restored_step`` and ``steps_replayed``). ``pp``/``tp`` stay None while only the decision named the step.

    ``state``: ``found`` (no decision yet; at the job's end: not repaired), ``repairing`` (decided, its
    recovery under way), ``repaired`` (the recovery is done), ``stopped`` (the job stopped cleanly instead:
    ``stop`` says why) or ``fallback`` (the recovery fell back to the persistent checkpoint). ``stop``:
    ``{"ts", "reason", "second", "checkpoint_step", "message"}``, ``second`` true for a second difference
    at a step already rolled back and replayed; ``second_generation``: the generation whose commits showed
    that second difference (None if none)."""

    step: int
    pp: int | None
    tp: int | None
    generation: int | None
    ts: float
    members: dict[str, str] = field(default_factory=dict)
    suspects: list[int] = field(default_factory=list)
    majority: list[int] = field(default_factory=list)
    suspect_world_ranks: list[int] = field(default_factory=list)
    state: str = "found"
    action: str | None = None
    recovery_generation: int | None = None
    restored_step: int | None = None
    steps_replayed: int | None = None
    second_generation: int | None = None
    stop: dict[str, Any] | None = None


@dataclass
class JobView:
    """The job as its journal tells it so far (see the module docstring). ``heartbeat_progress``: take the
    live step from ``heartbeat_summary.max_step`` too (journals of coordinators that wrote no ``progress``)."""

    heartbeat_progress: bool = False
    slots: dict[int, SlotView] = field(default_factory=dict)
    rank_map: dict[int, int] = field(default_factory=dict)  # logical -> world, current generation
    rank_map0: dict[int, int] = field(default_factory=dict)  # logical -> world at generation 0
    rank_maps: dict[int, dict[int, int]] = field(default_factory=dict)  # generation -> its rank map
    grid: Grid | None = None
    grid_since: dict[int, Grid] = field(default_factory=dict)  # generation -> grid from it on (shrinks)
    placement_inputs: dict[str, Any] | None = None  # {"k", "levels"}: the first registration that gave them
    generation: int = 0
    job_state: str = "starting"
    running: bool = False  # job_running seen
    restarts: int = 0  # coordinator restarts this job's journal records
    started_at: float | None = None
    ended_at: float | None = None
    end_event: str | None = None  # the record that ended the job (or coordinator_exit)
    job_end: str | None = None  # the JOB_END_EVENTS record that ended it
    end_reason: str | None = None
    end_signal: str | None = None
    final_hash: str | None = None
    end_step: int | None = None
    max_step: int | None = None  # newest step ever finished (a rollback does not lower it)
    live: int | None = None  # the live step: newest step the members finished (lowered only by a rollback)
    live_at: float | None = None  # when a record last said the live step
    progress: list[list[float]] = field(default_factory=list)  # [ts, live step] where it changed
    recoverable_step: int | None = None  # the committed step
    commits: list[list[float]] = field(default_factory=list)  # [ts, committed step] where it changed
    last_commit_at: float | None = None
    protect_every: int = 1
    checkpoint_step: int | None = None  # newest persistent checkpoint the committed step covers
    checkpoint_pending: int | None = None  # a newer one, not yet covered by the committed step
    shard_steps: dict[str, dict[int, int]] = field(default_factory=dict)  # shard -> {holder logical: step}
    shard_bytes: dict[str, int] = field(default_factory=dict)
    shard_commit_at: dict[str, float] = field(default_factory=dict)
    placement: dict[str, list[int]] = field(default_factory=dict)  # shard -> holder logical ranks
    recoveries: list[RecoveryStatus] = field(default_factory=list)
    recovery: InProgress | None = None  # the recovery in progress, as the coordinator runs it
    recovery_starts: list[float] = field(default_factory=list)  # ts of every recovery_start
    faults: list[FaultStatus] = field(default_factory=list)
    injections: dict[str, InjectionStatus] = field(default_factory=dict)
    drains: dict[str, DrainStatus] = field(default_factory=dict)
    shrinks: list[dict[str, Any]] = field(default_factory=list)  # shrink records, oldest first
    rejected: list[dict[str, Any]] = field(default_factory=list)  # replica_rejected records
    # replica agreement (control/agreement.py): the newest commit record's {"checked", "disagreed",
    # "last_step"}, and "undetectable" (the reason, when dp = 1), "rejected" (digests refused) and "off" (the
    # reason, resilience.replica_agreement false) as journalled
    agreement: dict[str, Any] = field(default_factory=dict)
    # the differences replica agreement found, oldest first, each with its repair (or stop)
    repairs: list[AgreementRepair] = field(default_factory=list)
    replaced: set[int] = field(default_factory=set)  # world ranks an earlier recovery replaced or removed
    pending_action: str | None = None  # the last decision's action and reason
    pending_reason: str | None = None
    test_env: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # records the fold could not take, with the reason

    @property
    def newest_checkpoint(self) -> int | None:
        """The newest persistent checkpoint step journalled (covered by the committed step or not)."""
        ck = [s for s in (self.checkpoint_step, self.checkpoint_pending) if s is not None]
        return max(ck) if ck else None

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
        """A persistent checkpoint of ``step`` was written: step ``step`` is finished. It counts as shown once
        the committed step reaches it, so a status never shows checkpoint > committed."""
        self.step_seen(ts, step)
        if self.recoverable_step is not None and step <= self.recoverable_step:
            self.checkpoint_step = max(step, self.checkpoint_step or step)
        else:
            self.checkpoint_pending = max(step, self.checkpoint_pending or step)

    def current_recovery(self) -> RecoveryStatus | None:
        """The newest recovery while it is in progress, else None."""
        r = self.recoveries[-1] if self.recoveries else None
        return r if r is not None and r.state == "in_progress" else None

    def note(self, w: int, text: str) -> None:
        """Add ``text`` to slot ``w``'s note (if the slot is known)."""
        s = self.slots.get(w)
        if s is not None:
            s.note = (s.note + "; " if s.note else "") + text
