"""Fault drills (``phoenix drill``): plan N faults at random steps and phases, then match what the journal
says happened to each of them. Both halves are pure; the CLI does the submitting and waiting.

Planning rules (so that every planned fault can be survived by design):

- by default the kinds :data:`VERIFIED_KINDS` are drawn (crash, kill-node, hang, transient);
  ``link-down``, ``gpu-error``, ``corrupt-replica`` and ``bitflip`` are drawn only when named in ``kinds``;
- a ``bitflip`` is expected to end in a local recovery (replica agreement finds it at the next commit fence
  and every member rolls back before it, docs/design.md section 6). It needs ``parallelism.dp >= 2`` (with
  one replica nothing can compare it: undetectable) and a protection of every step
  (``resilience.protect_every_max`` 1: a flip in a step that starts no snapshot is not found); each rank is
  flipped at most once per drill (a member named the corrupted replica twice within
  ``resilience.agreement_strikes_window_steps`` is replaced instead, a hot swap), so a drill draws another
  kind once every rank was flipped;
- a ``corrupt-replica`` causes no recovery by itself, so a drill pairs it with one: one holder's replica of
  the target's shard is corrupted (landing in phase ``recovery``, at the start of the next recovery, before
  the holders verify their copies again) and the target crashes at the planned step and phase. The recovery
  then needs that shard from a replica: with another verified replica (k >= 2) a hot swap, with none (k = 1)
  the restart of every member from the persistent checkpoint (``checkpoint_restart``). With k = 1 that crash
  is survivable only once a persistent checkpoint exists: the first is written after step
  ``checkpoint.interval_steps`` (:func:`phoenix_hpc.launch.persist.is_due`, synchronously, before the next step
  starts), so :func:`corrupt_replica_first_step` is its earliest step. A ``corrupt-replica`` drawn earlier is
  moved to that step when it stays in the first half of its segment (below), else another of the kinds is
  drawn for that fault; with no other kind, or no checkpoint before the last fault step, the plan is refused.
  Each fault moved or redrawn carries a ``note`` saying why (``phoenix drill`` prints it);

- faults land in steps ``FIRST_STEP .. steps - 2``, one in the first half of each of ``n`` equal segments of
  that range, so recoveries (and their replays) end before the next fault's step; the ``recovery`` and
  ``restore`` phases are never drawn (a fault in a phase of a recovery lands only if another recovery follows;
  drill it on purpose with ``inject-fault``);
- the spare budget is respected: ``kill-node`` needs a whole spare node (G standby slots), ``crash``,
  ``hang``, ``link-down`` and ``gpu-error`` one standby slot, ``transient`` none; kinds that no longer fit
  are not drawn;
- targets are logical ranks (``--rank``): after a hot swap the coordinator resolves them to the new slot;
  a drawn ``kill-node`` never takes the batch host (it runs the job's coordinator, whose loss ends the job by
  design, docs/design.md section 7): :func:`resolve_target` moves it to the next node with an active slot.
  The batch host is killed only when asked by name (``phoenix drill --kill-batch-host-at STEP``), after the
  drawn faults; the run then continues through the chain (:func:`batch_host_outcome` reports it).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Sequence

from phoenix_hpc.control import events as E
from phoenix_hpc.errors import FaultError
from phoenix_hpc.faults.kinds import KINDS, PHASE_WIRE
from phoenix_hpc.faults.trigger import RECOVERY_PHASES
from phoenix_hpc.status.model import Status

FIRST_STEP = 3  # the first commits must exist before a fault can be recovered from memory

VERIFIED_KINDS: tuple[str, ...] = ("crash", "kill-node", "hang", "transient")
"""Kinds a drill draws by default: each one's recovery (hot swap or local recovery) to the fault-free final
state is checked end to end on the local cluster (tests/e2e), in a drill too. ``link-down`` and ``gpu-error``
are checked end to end as single faults (tests/e2e/test_hotswap.py) but not drawn by default: a link-down
slot stays blocked, holding its node, until the job ends."""


@dataclass(frozen=True)
class DrillFault:
    index: int
    kind: str
    phase: str
    at_step: int
    rank: int  # logical rank targeted (kill-node: the node that holds it when the fault is sent)
    expect: str | None = None  # the recovery action expected, when not the kind's own (corrupt-replica)
    note: str | None = None  # why the planner moved this fault or drew another kind for it (None: as drawn)


CORRUPT_COMPANION = "crash"  # what makes the recovery that needs a corrupted replica (see the module doc)
#: user phases outside every step (``faults/trigger.RECOVERY_PHASES``): never drawn
IN_RECOVERY = tuple(p for p, wire in PHASE_WIRE.items() if wire in RECOVERY_PHASES)


def slot_cost(kind: str, gpus_per_node: int) -> int:
    """Standby slots a fault of ``kind`` consumes (docs/design.md section 6: transient faults use no spare;
    a drilled ``corrupt-replica`` comes with a crash of its target)."""
    if kind == "corrupt-replica":
        return slot_cost(CORRUPT_COMPANION, gpus_per_node)
    if KINDS[kind].action != "hot_swap":
        return 0
    return gpus_per_node if kind == "kill-node" else 1


def corrupt_replica_first_step(k: int, checkpoint_every: int | None) -> int | None:
    """The first step at which a drilled ``corrupt-replica`` (a holder's copy corrupted, then its owner
    crashed) can be survived by design. Pure.

    With ``k >= 2`` another verified replica serves the hot swap: step 1 (the plan's own lower bound
    applies). With ``k = 1`` (or 0) the recovery restarts every member from the persistent checkpoint, so one
    must exist: the first is written after step ``checkpoint_every`` (``resilience.checkpoint.interval_steps``,
    :func:`phoenix_hpc.launch.persist.is_due`) before step ``checkpoint_every + 1`` starts. None: no
    persistent checkpoint is written (``checkpoint_every`` None), never survivable.
    """
    if k >= 2:
        return 1
    if checkpoint_every is None:
        return None
    return int(checkpoint_every) + 1


def plan_drill(n: int, seed: int, *, steps: int, world: int, gpus_per_node: int, spare_nodes: int,
               kinds: Sequence[str] = VERIFIED_KINDS, k: int = 1, in_job: bool = False,
               checkpoint_every: int | None = None, dp: int = 1, protect_every_max: int = 1,
               replica_agreement: bool = True) -> list[DrillFault]:
    """``n`` faults for a job of ``steps`` steps and ``world`` logical ranks (see the module doc); ``k``: the
    job's replicas per shard (what a ``corrupt-replica`` drill expects depends on it). ``in_job``: a drill of
    the in-job checkpoint-restart baseline (:mod:`phoenix_hpc.drills.in_job`): only its kinds, each fault
    costs a whole spare node and is expected to end in an in-job restart. ``checkpoint_every``: the job's
    ``resilience.checkpoint.interval_steps`` (None: it writes no persistent checkpoint); a ``corrupt-replica``
    with ``k = 1`` is planned only after the first one (:func:`corrupt_replica_first_step`). ``dp`` and
    ``protect_every_max``: the job's ``parallelism.dp`` and ``resilience.protect_every_max`` (a ``bitflip``
    needs dp >= 2 and 1); ``replica_agreement``: ``resilience.replica_agreement`` (a ``bitflip`` needs it on).

    Raises:
        FaultError: ``n < 1``, too few steps for ``n`` separated faults, or an unknown kind (or, ``in_job``,
            one that mode does not accept), or a ``corrupt-replica`` that cannot be placed where the job
            survives it and no other kind was given (the message says why).
    """
    if n < 1:
        raise FaultError(f"--faults: {n} is not allowed; at least 1")
    if not kinds:
        raise FaultError("--kinds: names no kind; give a comma-separated list of " + ", ".join(KINDS))
    if in_job:
        from phoenix_hpc.drills.in_job import ACTION, IN_JOB_PHASES, check_kinds

        check_kinds(kinds)
        if n > spare_nodes:
            raise FaultError(f"--faults: {n} is not allowed with resilience.checkpoint.restart = in-job: every "
                             f"fault takes one of the job's {spare_nodes} spare node(s); at most {spare_nodes}")
    replicas = k
    for k in kinds:
        if k not in KINDS:
            raise FaultError(f"--kinds: {k!r} is not a fault kind; allowed: {', '.join(KINDS)}")
        if KINDS[k].action == "none" and k != "corrupt-replica":
            raise FaultError(f"--kinds: {k!r} is not allowed in a drill: it causes no recovery by itself (a drill "
                             f"waits for one per fault); inject it with phoenix inject-fault before another fault; "
                             f"allowed: {', '.join(n for n, s in KINDS.items() if s.action != 'none')}")
        if k == "bitflip" and dp < 2:
            raise FaultError(f"--kinds: 'bitflip' is not allowed in a drill of a job with parallelism.dp = {dp}: "
                             "no data-parallel peer holds the same parameters, so a flipped bit is undetectable "
                             "(journalled agreement_undetectable) and nothing recovers; allowed with dp >= 2")
        if k == "bitflip" and not replica_agreement:
            raise FaultError("--kinds: 'bitflip' is not allowed in a drill of a job with resilience.replica_agreement "
                             "= false: nothing compares the replicas' parameters, so the flip goes unnoticed "
                             "(journalled agreement_off) and nothing recovers; allowed with replica_agreement true")
        if k == "bitflip" and protect_every_max != 1:
            raise FaultError(f"--kinds: 'bitflip' is not allowed in a drill of a job with "
                             f"resilience.protect_every_max = {protect_every_max}: a flip in a step that starts no "
                             "snapshot is overwritten unseen, so the drill could not expect its recovery; allowed "
                             "with protect_every_max 1")
    last = steps - 2
    span = last - FIRST_STEP + 1
    min_gap = 3
    if span < n * min_gap:
        raise FaultError(f"--faults: {n} fault(s) need at least {FIRST_STEP + 1 + n * min_gap} training steps "
                         f"({min_gap} per fault after step {FIRST_STEP}); the config has training.steps = {steps}")
    rng = random.Random(seed)
    budget = spare_nodes * gpus_per_node

    def cost(kind: str) -> int:  # in-job: the dead slot's whole node leaves the job (refused above when n
        return gpus_per_node if in_job else slot_cost(kind, gpus_per_node)  # exceeds the spare nodes)
    out = []
    flipped: set[int] = set()  # logical ranks a bitflip was planned on
    seg = span / n
    for i in range(n):
        lo = FIRST_STEP + int(round(i * seg))
        hi = FIRST_STEP + int(round((i + 1) * seg)) - 1
        # the first half of the segment: at least half a segment lies between two faults for the recovery
        # (and its replay) to end before the next fault's step
        step = rng.randint(lo, max(lo, lo + (hi - lo) // 2))
        affordable = [k for k in kinds if cost(k) <= budget and (k != "bitflip" or len(flipped) < world)]
        if not affordable:
            raise FaultError(f"--faults: no spare capacity left for fault {i + 1} of {n} with kinds {list(kinds)} "
                             f"({spare_nodes} spare node(s) x {gpus_per_node} slots); add 'transient' or spares")
        kind = rng.choice(affordable)
        note = None
        if kind == "corrupt-replica":
            step, kind, note = _place_corrupt(i, step, lo + (hi - lo) // 2, affordable, rng, replicas,
                                              checkpoint_every)
        budget -= cost(kind)
        phases = [p for p in KINDS[kind].phases if p not in IN_RECOVERY]
        expect = None
        if in_job:
            phases, expect = [p for p in phases if p in IN_JOB_PHASES], ACTION
        if kind == "corrupt-replica":  # the phase is its companion crash's; the corrupted copy lands in recovery
            phases = [p for p in KINDS[CORRUPT_COMPANION].phases if p not in IN_RECOVERY]
            expect = "hot_swap" if replicas >= 2 else "checkpoint_restart"
        phase = rng.choice(phases)
        if kind == "bitflip":  # each rank once: a second flip of one member within the strike window replaces it
            rank = rng.choice([r for r in range(world) if r not in flipped])
            flipped.add(rank)
        else:
            rank = rng.randrange(world)
        out.append(DrillFault(i, kind, phase, step, rank, expect, note))
    return out


def _place_corrupt(i: int, step: int, latest: int, affordable: Sequence[str], rng: random.Random, k: int,
                   checkpoint_every: int | None) -> tuple[int, str, str | None]:
    """``(step, kind, note)`` for fault ``i`` drawn as a ``corrupt-replica`` at ``step``, whose segment allows
    steps up to ``latest``: kept, moved to :func:`corrupt_replica_first_step`, or another affordable kind
    drawn instead (see the module doc).

    Raises:
        FaultError: no step of the segment is survivable and ``affordable`` has no other kind.
    """
    first = corrupt_replica_first_step(k, checkpoint_every)
    if first is not None and step >= first:
        return step, "corrupt-replica", None
    why = (f"with resilience.k = {k} the crash that needs the corrupted replica is recovered only from the "
           "persistent checkpoint, and "
           + ("this job writes none (resilience.checkpoint)" if first is None else
              f"the first one is written after step {first - 1} (resilience.checkpoint.interval_steps)"))
    if first is not None and first <= latest:
        return first, "corrupt-replica", f"moved from step {step} to step {first}: {why}"
    others = [x for x in affordable if x != "corrupt-replica"]
    where = "at any step" if first is None else f"at step {step} (its range ends at step {latest})"
    if not others:
        raise FaultError(f"--kinds: fault {i + 1} cannot be a corrupt-replica {where}: {why}; the job would not "
                         "survive it. Give another kind too, fewer --faults, raise resilience.k to 2, or write checkpoints "
                         "earlier (a smaller resilience.checkpoint.interval_steps)")
    kind = rng.choice(others)
    return step, kind, f"a corrupt-replica cannot be survived {where}: {why}; drew {kind} instead"


@dataclass
class DrillOutcome:
    """What happened to one planned fault, from the job's status (journal)."""

    fault: DrillFault
    request_id: str | None = None
    at_step: int | None = None  # the step requested (always the planned one; None: not sent)
    landed: list[dict[str, Any]] = field(default_factory=list)  # {world_rank, step, phase, ts}
    action: str | None = None
    detect_s: float | None = None
    total_s: float | None = None
    phases: dict[str, float] = field(default_factory=dict)
    steps_replayed: int | None = None
    recovery_state: str | None = None
    error: str | None = None
    rank: int | None = None  # logical rank actually targeted (differs from the plan when moved off the batch host)
    target_world_rank: int | None = None  # the slot holding ``rank`` when the fault was sent
    target_node: str | None = None
    generation: int | None = None  # generation of the recovery this fault caused
    quiesce_s: float | None = None  # recovery_start -> recovery_plan of that generation (see quiesce_by_generation)
    # corrupt-replica: the corruption's own request and landings (``request_id`` / ``landed``: its crash)
    corrupt_request_id: str | None = None
    corrupt_landed: list[dict[str, Any]] = field(default_factory=list)

    @property
    def landed_as_requested(self) -> bool:
        """Every landing record is at the planned step and phase."""
        return bool(self.landed) and all(f["step"] == self.fault.at_step and f["phase"] == self.fault.phase
                                         for f in self.landed)

    @property
    def recovered(self) -> bool:
        return self.recovery_state == "done" and self.error is None

    @property
    def expected_action(self) -> str:
        """The action the design takes for this kind (docs/design.md section 6; a corrupt-replica: what its
        crash's recovery does without that copy, by k)."""
        return self.fault.expect or KINDS[self.fault.kind].action

    @property
    def passed(self) -> bool:
        """Landed at the requested step and phase, recovered with the expected action (a corrupt-replica:
        the corruption landed too, in that recovery)."""
        corrupt_ok = self.fault.kind != "corrupt-replica" or (
            bool(self.corrupt_landed) and all(f["phase"] == "recovery" for f in self.corrupt_landed))
        return self.landed_as_requested and self.recovered and self.action == self.expected_action and corrupt_ok

    def to_json(self) -> dict[str, Any]:
        return {"index": self.fault.index, "kind": self.fault.kind, "phase": self.fault.phase,
                "planned_step": self.fault.at_step, "at_step": self.at_step, "plan_note": self.fault.note,
                # the logical rank the plan drew, and the one the fault was sent to: the same, except for a
                # kill-node planned on the batch host's rank, which goes to the lowest rank on another node
                "planned_logical_rank": self.fault.rank,
                "target_logical_rank": self.fault.rank if self.rank is None else self.rank,
                "target_world_rank": self.target_world_rank, "target_node": self.target_node,
                "expected_action": self.expected_action, "generation": self.generation,
                "quiesce_s": self.quiesce_s, "passed": self.passed,
                "request_id": self.request_id, "landed": self.landed,
                "landed_as_requested": self.landed_as_requested, "action": self.action,
                "detect_s": self.detect_s, "total_s": self.total_s, "phases": self.phases,
                "steps_replayed": self.steps_replayed, "recovery_state": self.recovery_state,
                "recovered": self.recovered, "error": self.error,
                **({"corrupt_request_id": self.corrupt_request_id, "corrupt_landed": self.corrupt_landed}
                   if self.fault.kind == "corrupt-replica" else {})}


def match_outcome(out: DrillOutcome, st: Status, before_ts: float | None = None) -> DrillOutcome:
    """Fill ``out`` from the status: the landing records of its request, and the first recovery that started
    at or after the fault landed (the one it caused) and, when ``before_ts`` is given (the time the next
    fault landed), before that."""
    inj = next((i for i in st.injections if i.request_id == out.request_id), None)
    if inj is not None:
        out.landed = list(inj.fired)
    cor = next((i for i in st.injections if out.corrupt_request_id and i.request_id == out.corrupt_request_id), None)
    if cor is not None:
        out.corrupt_landed = list(cor.fired)
    if not out.landed:
        return out
    t_landed = min(float(f["ts"]) for f in out.landed)
    rec = next((r for r in st.recoveries
                if r.started_at >= t_landed and (before_ts is None or r.started_at < before_ts)), None)
    if rec is not None:
        out.action, out.recovery_state, out.generation = rec.action, rec.state, rec.generation
        out.total_s, out.phases, out.steps_replayed = rec.total_s, dict(rec.phases), rec.steps_replayed
        out.detect_s = rec.phases.get("detect", rec.detect_s)
    return out


def quiesce_by_generation(records: Sequence[dict[str, Any]]) -> dict[int, float]:
    """Seconds from each recovery's ``recovery_start`` to its ``recovery_plan`` in the journal: the wait until
    every survivor has left the step it was in (a survivor blocked in a collective with a dead slot is freed
    by ``resilience.collective_timeout_s``). Not one of ``recovery_done.phases``: those are detect,
    reconfigure, params, optimizer (each the slowest member's own time) and replay. Pure."""
    start = {int(r["generation"]): float(r["ts"]) for r in records if r.get("event") == E.RecoveryStart.NAME}
    return {g: round(float(r["ts"]) - start[g], 3) for r in records
            if r.get("event") == E.RecoveryPlanned.NAME and (g := int(r["generation"])) in start}


def landed_ts(out: DrillOutcome) -> float | None:
    """When ``out``'s fault first fired (None: not yet)."""
    return min((float(f["ts"]) for f in out.landed), default=None)


def resolve_target(fault: DrillFault, st: Status) -> tuple[int, int, str]:
    """The ``(logical rank, world rank, node)`` a planned fault hits in the job as it is now.

    The planned logical rank, except for a ``kill-node`` whose rank lives on the batch host (the coordinator's
    node, which the design does not recover, docs/design.md section 7): then the lowest logical rank on another
    node is taken.

    Raises:
        FaultError: no live active slot holds the rank, or (kill-node) every active slot is on the batch host.
    """
    active = sorted((s.logical_rank, s.world_rank, s.node) for s in st.slots
                    if s.state == "active" and s.logical_rank is not None)
    by_rank = {r: (r, w, n) for r, w, n in active}
    if fault.rank not in by_rank:
        raise FaultError(f"fault {fault.index + 1}: no active slot holds logical rank {fault.rank} now")
    hit = by_rank[fault.rank]
    host = st.job.batch_host
    if fault.kind == "kill-node" and host is not None and hit[2] == host:
        others = [a for a in active if a[2] != host]
        if not others:
            raise FaultError(f"fault {fault.index + 1}: kill-node needs an active slot outside the batch host {host}")
        hit = others[0]
    return hit


def check_batch_host_step(at_step: int, steps: int, plan: Sequence[DrillFault]) -> None:
    """``--kill-batch-host-at``: a step after every drawn fault and before the last step. Pure.

    Raises:
        FaultError: naming the option, the value and what is allowed.
    """
    low = max([FIRST_STEP] + [f.at_step + 2 for f in plan])
    if not low <= at_step <= steps - 2:
        raise FaultError(f"--kill-batch-host-at: {at_step} is not allowed: it must be a step from {low} (after the "
                         f"drawn faults' recoveries) to {steps - 2} (before the last step of {steps})")


def batch_host_outcome(run_jobs: Sequence[Any], job_id: str | None, node: str, at_step: int | None) -> dict:
    """What happened to the job whose batch host the drill killed (``run_jobs``: the run's jobs from
    :mod:`phoenix_hpc.status.jobs`): its end as status derives it, the job the chain continued with, the
    checkpoint it resumed from and the steps lost. ``passed`` when the lost job ended by batch-host loss
    and the next job of the chain finished. Pure."""
    jobs = list(run_jobs)
    mine = next((j for j in jobs if j.job_id == job_id), None)
    nxt = next((j for j in jobs if mine is not None and j.after == mine.job_id), None)
    return {
        "node": node, "job_id": job_id, "killed_at_step": at_step,
        "slurm_state": mine.slurm_state if mine else None, "cause": mine.cause if mine else None,
        "last_step": mine.last_step if mine else None,
        "next_job_id": nxt.job_id if nxt else None, "resume_step": nxt.resume_step if nxt else None,
        "next_end": nxt.end if nxt else None,
        "lost_steps": mine.lost_steps if mine else None,
        "committed_lost_steps": mine.committed_lost_steps if mine else None,
        "passed": bool(mine and mine.cause == "batch-host loss" and nxt and nxt.end == E.JobDone.NAME),
    }
