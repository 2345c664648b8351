"""The coordinator's recovery state machine (docs/design.md section 6). One recovery at a time; faults
arriving meanwhile are queued.

Faults (reported by a member, or found by membership/liveness) wait in ``faults`` until :func:`decide`
classifies them (:func:`phoenix_hpc.control.classify.combine`). Collective errors are only called transient
once every active slot has heartbeated *after* the report (proof that all processes are alive); a slot that
goes silent instead turns the fault into a hot swap. Then, in phases of :class:`~phoenix_hpc.control.records.Recovery`:

1. ``recovery_start``: bump the generation, mark dead slots DEAD, send ``quiesce`` to the survivors;
2. each survivor stops (abandoning a partial step) and answers ``quiesced`` with its live step and the
   committed steps of the shards and replicas it holds;
3. the pure plan (:func:`phoenix_hpc.recovery.plan.plan_recovery`) picks spares, the recoverable step and
   the transfers; ``recover`` {plan} goes to every member of the new generation (spares: STANDBY ->
   JOINING, idempotent);
4. members rebuild groups, restore, roll back, and answer ``recovered`` with a
   :class:`~phoenix_hpc.recovery.invariants.MemberReport` (evidence: hashes of the restored state, the
   replicas each holds) and their phase timings;
5. the evidence is screened against what the coordinator knows from the plan, the owners' commit reports
   and each generation's placement (:mod:`phoenix_hpc.control.evidence`; rejections: journal
   ``evidence_rejected``) and I1-I5 are checked on what is left (violation: journal ``invariant_violation``
   naming shard and members, stop every slot, job FAILED); then ``resume`` and, once the members are past
   the replayed steps, ``recovery_done`` {total_s, phases, steps_replayed}.

If a member of the recovery dies before it completes, or does not answer within its deadline, the recovery
is aborted and re-planned with the queued fault (spares whose restore was cut short are restored again in
place). When memory cannot cover the loss the plan raises :class:`~phoenix_hpc.recovery.plan.FallbackRequired`.
With a persistent checkpoint and enough spares the recovery goes on as an in-job restart from it
(:func:`~phoenix_hpc.recovery.plan.plan_checkpoint_restart`; journal ``checkpoint_restart`` {reason,
lost_shards, checkpoint_step, lost_steps, checkpoint_path}; every member of the new generation loads the
checkpoint and the lost steps are trained again). Otherwise the job enters FALLBACK and stops (``fallback``
{reason, message, checkpoint_step, lost_steps, checkpoint_path}), the message naming the checkpoint step
and how to resubmit.

Plain functions of the coordinator ``c`` (taken explicitly, like :mod:`~phoenix_hpc.control.membership`):
:func:`on_quiesced` and :func:`on_recovered` are entries of its dispatch table, :func:`decide` and
:func:`advance_recovery` are called from its tick. What a recovery does next, and which phase may follow which, are pure
rules of :mod:`phoenix_hpc.control.recovery_phases`; which action the pending faults call for is
:func:`phoenix_hpc.control.arbitration.arbitrate`. This module carries them out.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

from phoenix_hpc.control import events as E
from phoenix_hpc.control import protocol as P
from phoenix_hpc.control.agreement import judge_corruption, restart_advice
from phoenix_hpc.control.arbitration import arbitrate, fault_time
from phoenix_hpc.control.classify import Action, Decision, Fault, FaultKind, combine
from phoenix_hpc.control.detect import detect
from phoenix_hpc.control.ending import continue_hint
from phoenix_hpc.control.handlers import maybe_log_commit
from phoenix_hpc.control.membership import live_members
from phoenix_hpc.control.records import PendingFault, Recovery, Slot
from phoenix_hpc.control.recovery_answers import fallback_checkpoint, gather_quiesced
from phoenix_hpc.control.recovery_phases import Next, Step, on_answers, on_tick
from phoenix_hpc.control.states import TERMINAL_JOB_STATES, JobState, RecoveryPhase, SlotState
from phoenix_hpc.recovery.invariants import report_from_json, verify_recovery
from phoenix_hpc.recovery.plan import FallbackRequired, RecoveryPlan, plan_checkpoint_restart, plan_recovery
from phoenix_hpc.recovery.shrink import plan_shrink


def on_quiesced(c: Any, body: dict) -> None:
    slot = _phase_report(c, body, "quiesced", RecoveryPhase.QUIESCE)
    if slot is None:
        return
    rec = c.recovery
    for item in body.get("rejected") or ():  # a holder's copy that failed verification: not in the plan
        try:
            sid, step, why = str(item[0]), int(item[1]), str(item[2])[:300]
        except (IndexError, TypeError, ValueError):
            continue
        c.record(E.ReplicaRejected(generation=rec.generation, world_rank=slot.world_rank,
                                   logical_rank=slot.logical_rank, node=slot.node, shard_id=sid, step=step, reason=why))


def on_recovered(c: Any, body: dict) -> None:
    _phase_report(c, body, "recovered", RecoveryPhase.RESTORE)


def _phase_report(c: Any, body: dict, kind: str, phase: RecoveryPhase) -> Slot | None:
    """Record a member's ``quiesced``/``recovered`` report of the current recovery's ``phase``
    (idempotent: a repeated report replaces the first) and return its slot; one from outside that phase
    or generation is rejected and journalled once (``None``)."""
    slot = c._slot_of(body, kind)
    rec = c.recovery
    if slot is None:
        return None
    if rec is None or rec.phase != phase or int(body["generation"]) != rec.generation:
        c.transport.reject(f"{kind} from world rank {slot.world_rank} for generation {body.get('generation')} "
                  f"outside a {phase.value}", body, key=(kind, slot.world_rank, body.get("generation")))
        return None
    (rec.quiesced if phase is RecoveryPhase.QUIESCE else rec.recovered)[slot.world_rank] = body
    slot.last_seen = c.clock()
    return slot


def decide(c: Any, now: float) -> None:
    """Carry out :func:`phoenix_hpc.control.arbitration.arbitrate` on the queued faults: fence, journal
    ``decision``, then end the job or start the recovery."""
    members = set(c.rank_map.values())
    arb = arbitrate(list(c.faults), [s.last_seen for s in c.slots.values() if s.state is SlotState.ACTIVE],
                    dead_members=any(c.slots[w].state is SlotState.DEAD for w in members),
                    restore_pending=bool(c.restore_pending), members=members, now=now,
                    heartbeat_timeout_s=c.t.heartbeat_timeout_s)
    if arb is None:
        return  # wait for fresh heartbeats or for detect() to declare the silent ones dead
    c.faults.clear()
    decision, faults = arb.decision, list(arb.faults)
    if arb.fence:  # e.g. a reported hardware error on a live slot: fence the slot, then replace it
        for f in arb.fence:
            c._declare_dead(list(f.slots), f.kind, f.reason, now)
        c.faults.clear()
    book = c.agreement
    if book is None and c.grid and any(f.bad_step is not None for f in faults):
        from phoenix_hpc.control.agreement import AgreementBook

        book = c.agreement = AgreementBook(dp=c.grid[2], generation=c.generation)
    verdict = judge_corruption(decision, faults, book)  # control/agreement.py
    decision = verdict.decision
    c.record(E.Decision(action=decision.action.value, reason=decision.reason,
                        faults=[{"kind": f.kind.value, "slots": list(f.slots), "nodes": list(f.nodes),
                                 **({"bad_step": f.bad_step} if f.bad_step is not None else {})}
                                for f in faults]))
    if c.t.in_job_restart:  # checkpoint-restart in the job: the batch script starts a new srun step
        return _request_in_job_restart(c, decision.reason, set(arb.reporters))
    if verdict.stop_from is not None:
        # replicas that differed (control/agreement.py): only a checkpoint from before it is vouched for
        from phoenix_hpc.recovery.ckpt_files import complete_steps

        ck, advice = restart_advice(*verdict.stop_from,
                                    complete_steps(c.t.checkpoint_path) if c.t.checkpoint_path else [])
        c._end(JobState.FAILED, E.CleanStop(reason=decision.reason, checkpoint_step=ck,
                                            message="stopped without training on; " + advice))
        return
    if decision.action is Action.CLEAN_STOP:
        ck = newest_checkpoint(c)
        c._end(JobState.FAILED, E.CleanStop(reason=decision.reason, checkpoint_step=ck,
                              message="stopped without training on; " + (
                                  f"to continue from the persistent checkpoint of step {ck}: {continue_hint(str(c.run_dir), c.next_job)}"
                                  if ck is not None else "no persistent checkpoint yet: submit the config again")))
        return
    t_fault = fault_time(arb.arrived, c._t_fault_hint, now)  # the hint as the fencing left it
    c._t_fault_hint = None
    if book is not None:  # the steps this recovery rolls back before: a second difference there stops the job
        book.repaired |= verdict.repaired
    start_recovery(c, decision, faults, t_fault, now)


def _request_in_job_restart(c: Any, reason: str, reporters: set[int]) -> None:
    """``resilience.checkpoint.restart: in-job``: write ``RUN_DIR/in_job_restart.json`` {dead_nodes,
    checkpoint_step, reason} and end this step's job; the batch script ends the srun step at once and
    starts a new one in the same allocation without ``dead_nodes``, whose ranks restore the newest
    persistent checkpoint. ``dead_nodes``: the nodes of the slots found dead so far, except those of
    ``reporters`` (slots that reported a collective error themselves before exiting: their node is
    alive)."""
    from phoenix_hpc.control.in_job import write_restart_request

    dead_nodes = sorted({s.node for w, s in c.slots.items() if s.state is SlotState.DEAD and w not in reporters})
    ck = newest_checkpoint(c)
    write_restart_request(c.run_dir, dead_nodes, ck, reason)
    c.record(E.RestartInJob(dead_nodes=dead_nodes, checkpoint_step=ck, reason=reason))
    c._end(JobState.FAILED, E.InJobRestart(reason=reason, checkpoint_step=ck,
                             message=f"{reason}; restarting in the job from the persistent checkpoint of step {ck} "
                                     f"without the node(s) {dead_nodes}"))
    c._end_at = c.clock()  # no linger: the batch script ends this step's tasks at once


def start_recovery(c: Any, decision: Decision, faults: list[Fault], t_fault: float, now: float,
                    drain=None) -> None:
    if drain is None:  # a fault came first: a drain not yet under way can no longer pause every member
        c.transport.carry_out(c.drains.missed(f"a recovery started first ({decision.reason})", live=c._is_live))
    maybe_log_commit(c, force=True)  # journal the committed step this recovery starts from, first
    if c.job.state is JobState.RUNNING:
        c.job.to(JobState.RECOVERING, decision.reason)
    g = c.generation + 1  # the view's generation once recovery_start is recorded below
    c.store.set("ctl/generation", str(g))
    survivors = set(live_members(c))
    rec = Recovery(decision, faults, g, survivors, t_fault, now,
                    deadline=now + c.t.collective_timeout_s + c.t.heartbeat_timeout_s, drain=drain)
    c.recovery = rec
    # the slots this recovery loses: dead members of the generation it leaves (a slot an earlier
    # recovery replaced is no member any more), and dead slots of no generation yet (a spare)
    members = set(c.rank_map.values())
    dead = sorted(w for w, s in c.slots.items() if s.state is SlotState.DEAD
                  and (w in members or s.logical_rank is None))
    c.record(E.RecoveryStart(generation=g, action=decision.action.value,
                             survivors=sorted(survivors), dead=dead, detect_s=round(now - t_fault, 3),
                             **({"drain": drain.request_id, "drained": list(drain.targets)} if drain else {})))
    raw = P.encode({"type": "quiesce", "generation": c.generation, "dead": dead, "reason": decision.reason},
                   c.secret)  # one signed message for every survivor (each slot's replay guard is its own)
    for w in sorted(survivors):
        s = c.slots[w]
        if s.state is SlotState.ACTIVE:
            s.machine.to(SlotState.QUIESCED, f"recovery to generation {c.generation}")
        c.transport.send_encoded(w, raw)
    c._hold_after(E.RecoveryStart.NAME)


def _abort_recovery(c: Any, reason: str, now: float) -> None:
    rec = c.recovery
    c.record(E.RecoveryAborted(generation=rec.generation, phase=RecoveryPhase(rec.phase).value,
                               reason=reason))
    if rec.plan is not None and rec.phase == RecoveryPhase.RESTORE:
        c.restore_pending |= {j.logical_rank for j in rec.plan.joins if c.slots[j.world_rank].state is not SlotState.DEAD}
    rec.move(RecoveryPhase.ABORTED)
    c.recovery = None
    # survivors stay QUIESCED; the queued fault starts the next recovery at once
    if not c.faults:
        c.faults.append(PendingFault(Fault(FaultKind.UNKNOWN, (), (), False, reason), now))
    pend = list(c.faults)
    c.faults.clear()
    # the re-planned recovery still restores a step before a difference of the replicas this one was for
    pend += [PendingFault(f, now) for f in rec.faults if f.bad_step is not None]
    # the last heartbeat of a member found dead during this recovery (_declare_dead) goes with the queued
    # faults into the re-planned recovery, as _decide takes it: left behind, it would date a later
    # recovery's detection from a fault this one handles
    t_fault = rec.t_fault if c._t_fault_hint is None else min(rec.t_fault, c._t_fault_hint)
    c._t_fault_hint = None
    faults = [p.fault for p in pend]
    decision = combine(faults)
    if decision.action is Action.CLEAN_STOP:
        c.record(E.Decision(action=decision.action.value, reason=decision.reason))
        c._end(JobState.FAILED, E.CleanStop(reason=decision.reason))
        return
    c.record(E.Decision(action="hot_swap", reason=f"second fault during recovery: {decision.reason}",
                        faults=[{"kind": f.kind.value, "slots": list(f.slots)} for f in faults]))
    start_recovery(c, Decision(Action.HOT_SWAP, decision.reason), faults, t_fault, now)


def advance_recovery(c: Any, now: float) -> None:
    """The tick's step of the recovery: carry out :func:`phoenix_hpc.control.recovery_phases.on_tick`."""
    rec = c.recovery
    nxt = on_tick(rec, dead=partial(_is_dead, c), step_of=partial(_step_of, c), faults_pending=bool(c.faults), now=now)
    _do_next(c, rec, nxt, now)


def _do_next(c: Any, rec: Recovery, nxt: Next, now: float) -> None:
    """Do what the phase rule decided (:class:`phoenix_hpc.control.recovery_phases.Step`)."""
    if nxt.step is Step.TIMEOUT:
        c._declare_dead(list(nxt.slots), FaultKind.HEARTBEAT_TIMEOUT, nxt.dead_reason, now)
    if nxt.step in (Step.ABORT, Step.TIMEOUT):
        _abort_recovery(c, nxt.reason, now)
    elif nxt.step is Step.PLAN:
        _plan(c, rec, now)
    elif nxt.step is Step.CHECK:
        check_and_resume(c, rec, now)
    elif nxt.step in (Step.FINISH, Step.INTERRUPTED):
        finish_recovery(c, rec, now, interrupted=nxt.step is Step.INTERRUPTED)


def _is_dead(c: Any, w: int) -> bool:
    return c.slots[w].state is SlotState.DEAD


def _step_of(c: Any, w: int) -> int:
    return c.slots[w].step


def advance_on_answers(c: Any, now: float) -> None:
    """Called by the coordinator's loop after messages arrived, so that a recovery does not wait up to a
    tick for what it waits on: one in its quiesce phase is planned as soon as the last survivor's
    ``quiesced`` is in, but no sooner than one tick (:attr:`tick_s`) after it started; one in its restore
    phase resumes as soon as the last ``recovered`` is in; one in its replay phase ends as soon as the last
    member's step past the replayed ones is in. The quiesce phase's floor of one tick is the window in which
    a second process exit found just after the first (a node's other slots, killed together) still falls
    in the quiesce phase and is planned together with it: a member inside a blocking call between its
    generation's arrival barrier and its ``recovered`` (the groups' rendezvous, the protector's agreement,
    its engine work) does not answer a newer quiesce, so a loss then ends the job (docs/design.md, the
    coordinator). Everything else stays on the tick: a lost member, a pending fault,
    a slot whose heartbeats are overdue (the tick declares it dead before it plans, so a spare that went
    silent is not named in a plan), the deadlines (judged after the pause accounting,
    :meth:`_advance_recovery`), a replay cut short by a fault."""
    rec = c.recovery
    if rec is None or c.ending is not None or c.job.state in TERMINAL_JOB_STATES:
        return
    nxt = on_answers(rec, dead=partial(_is_dead, c), step_of=partial(_step_of, c), faults_pending=bool(c.faults),
                     overdue=lambda: bool(detect(now, c._watched(now), c.t)[0]), now=now,
                     tick_s=c.tick_s)
    if nxt.step is Step.CHECK:
        check_and_resume(c, rec, now)  # a plan that replays no step is past it at once: below
        if c.recovery is not rec or rec.phase != RecoveryPhase.REPLAY:
            return
        nxt = on_answers(rec, dead=partial(_is_dead, c), step_of=partial(_step_of, c), faults_pending=bool(c.faults),
                         overdue=lambda: False, now=now, tick_s=c.tick_s)
    if nxt.step in (Step.PLAN, Step.FINISH):
        _do_next(c, rec, nxt, now)


def _plan(c: Any, rec: Recovery, now: float) -> None:
    # the members' answers as the planner's inputs (control/recovery_answers.py); a spare whose restore was
    # cut short at its generation's arrival barrier answers live step -1 and offers nothing
    # (launch/execute.py Member.join): it is restored again in place, also when the plan it was cut short in
    # restored it in place already (restore_pending then no longer names it)
    q = gather_quiesced(rec.quiesced, {w: c.slots[w].logical_rank for w in rec.quiesced}, c.restore_pending,
                        bad_step_of(rec))
    c.restore_pending = set(q.restore_pending)
    committed, live_steps, dirty, numel = q.committed, q.live_steps, q.dirty, q.numel
    # a drained node takes no logical rank again; its slots left (DONE) and are replaced like dead ones
    spares = sorted((w for w, s in c.slots.items() if s.state is SlotState.STANDBY
                     and s.node not in c.drained_nodes), key=lambda w: (c.slots[w].node, w))
    dead = [w for w, s in c.slots.items() if s.state is SlotState.DEAD or
            (s.state is SlotState.DONE and w in c.drained and w in c.rank_map.values())]
    t0 = time.perf_counter()
    if c.t.recovery_from_checkpoint:  # resilience.recovery_source: checkpoint (the fallback on purpose)
        return fallback(c, rec, FallbackRequired("resilience.recovery_source is 'checkpoint'"), live_steps,
                        spares, dead, now)
    if numel and _shrink_wanted(c, rec, dead, spares):  # no numel: the members' engine cannot shrink
        try:
            plan = plan_shrink(
                generation=rec.generation - 1, grid=tuple(c.grid), rank_map=dict(c.rank_map),
                nodes={w: s.node for w, s in c.slots.items()}, dead=dead, placement=c.placement,
                committed=committed, live_steps=live_steps, numel=numel, dirty=dirty,
                k=int((c.placement_inputs or {}).get("k", 1)))
        except FallbackRequired as exc:
            return fallback(c, rec, exc, live_steps, spares, dead, now)
        return _send_plan(c, rec, plan, now, time.perf_counter() - t0)
    try:
        plan = plan_recovery(
            generation=rec.generation - 1, grid=tuple(c.grid), rank_map=dict(c.rank_map),
            nodes={w: s.node for w, s in c.slots.items()}, dead=dead, spares=spares,
            placement=c.placement, committed=committed, live_steps=live_steps,
            restore=sorted(c.restore_pending), dirty=dirty, params_from_optimizer=c.t.shrink_capable,
        )
    except FallbackRequired as exc:
        return fallback(c, rec, exc, live_steps, spares, dead, now)
    _send_plan(c, rec, plan, now, time.perf_counter() - t0)


def bad_step_of(rec: Recovery) -> int | None:
    """The first step a recovery's faults know to be bad (DP replicas that differed, docs/design.md section 6):
    it restores an older step; None when none of its faults names one."""
    return min((f.bad_step for f in getattr(rec, "faults", ()) if f.bad_step is not None), default=None)


def _shrink_wanted(c: Any, rec: Recovery, dead: list[int], spares: list[int]) -> bool:
    """Whether this recovery is a shrink (docs/design.md section 6, "Shrink"): a drain that asked for one,
    or (``resilience.spares_exhausted`` allows it) more lost active slots than live standby slots. Not
    while a spare's cut-short restore is pending (its state cannot serve as a source)."""
    if c.restore_pending:
        return False
    if rec.drain is not None:
        return bool(rec.drain.request.get("shrink"))
    lost = [w for w in dead if w in c.rank_map.values()]
    return c.t.shrink and len(lost) > len(spares)


def grid_of(c: Any, generation: int) -> tuple[int, int, int]:
    """The grid of ``generation`` (it changes only at a shrink)."""
    since = [g for g in c.grid_since if g <= generation]
    return c.grid_since[max(since)] if since else tuple(c.grid)


def _send_plan(c: Any, rec: Recovery, plan: RecoveryPlan, now: float, plan_s: float) -> None:
    # the plan was made for generation - 1 -> generation; keep the coordinator's numbering
    rec.plan = plan
    rec.move(RecoveryPhase.RESTORE)
    rec.phases["plan_s"] = plan_s
    rec.deadline = now + c.t.collective_timeout_s + c.t.heartbeat_timeout_s
    # this generation's rank map (plan.world_of()) and grid_since: the view's, at recovery_plan below
    c.restore_pending = set()
    if plan.action == "shrink":  # a new grid: the old layout's copies and statements name other shards
        c.grid = tuple(plan.grid)
        c.committed.clear()
        c.evidence.commit_hash.clear()
        c.placement.clear()
        c.held.clear()
        for r, w in plan.rank_map:  # the kept slots are renumbered in the smaller grid
            c.slots[w].logical_rank = r
    for j in plan.joins:  # a joining slot holds no copy yet: the dead slot's reported copies are gone
        for copies in c.committed.values():
            copies.pop(j.logical_rank, None)
        c.held.pop(j.logical_rank, None)
    for j in plan.joins:
        s = c.slots[j.world_rank]
        if s.state is SlotState.STANDBY:  # idempotent admission: only a STANDBY slot is taken
            s.machine.to(SlotState.JOINING, f"replaces world rank {j.replaces_world_rank}")
            s.logical_rank = j.logical_rank
            s.role = "active"
    c.record(E.RecoveryPlanned.from_record(
        {"generation": rec.generation,
         **{k: v for k, v in plan.to_json().items() if k not in ("generation", "old_generation")}}))
    t0 = time.perf_counter()
    plan_json = {**plan.to_json(), "generation": rec.generation}
    # The plan grows with the job (its rank map names every member): it is stored once under its own key
    # and every member gets the same small signed ``recover`` naming the key and the plan's SHA-256
    # (P.plan_reference), encoded once: O(members) bytes to send instead of O(members^2).
    raw = P.encode(P.plan_reference(c.store, rec.generation, plan_json, c.secret), c.secret)
    for w in [w for _, w in plan.rank_map] + list(plan.leavers):  # a shrink's leavers send before they go
        c.transport.send_encoded(w, raw)
    c.record(E.RecoveryPlanSent(generation=rec.generation, members=len(plan.rank_map),
                                plan_s=round(plan_s, 4), send_s=round(time.perf_counter() - t0, 4)))


def check_and_resume(c: Any, rec: Recovery, now: float) -> None:
    plan = rec.plan
    reports, rejected = {}, []
    for w, b in sorted(rec.recovered.items()):
        try:
            reports[w] = report_from_json(b["report"])
        except (KeyError, TypeError, ValueError) as exc:
            rejected.append(f"report of world rank {w} rejected: {exc}")
    why, bad = verify_recovery(c._expected(rec), reports, plan.invariants)
    rejected += why
    if rejected:
        c.record(E.EvidenceRejected(generation=rec.generation, reasons=rejected))
    if bad:
        c.record(E.InvariantViolation(generation=rec.generation, violations=[str(v) for v in bad],
                                      rejected=rejected))
        c._end(JobState.FAILED, E.CleanStop(reason="recovery invariant violated: " + "; ".join(map(str, bad))))
        return
    for w, rep in reports.items():  # the new generation's owners: where their replicas go from now on
        sent = rec.recovered[w]["report"].get("sent") if isinstance(rec.recovered[w]["report"], dict) else None
        if sent:
            c._record_sent(c.slots[w], rec.generation, sent, rec.recovered[w])
    for key in ("reconfigure", "params", "optimizer"):
        rec.phases[key] = max((float(b.get("timings", {}).get(key, 0.0)) for b in rec.recovered.values()), default=0.0)
    for _, w in plan.rank_map:
        s = c.slots[w]
        s.generation = rec.generation
        s.step = plan.recoverable_step
        if s.state in (SlotState.QUIESCED, SlotState.JOINING):
            s.machine.to(SlotState.ACTIVE, f"generation {rec.generation} restored")
    if plan.action == "shrink":  # every member has its new shard: the leavers have sent what they held
        freed = []
        for w in plan.leavers:
            s = c.slots[w]
            if s.state is SlotState.QUIESCED:
                s.machine.to(SlotState.STANDBY, f"left DP replica of generation {rec.generation - 1} (shrink)")
                s.logical_rank, s.role = None, "standby"
                freed.append(w)
        tp, pp, dp = plan.grid
        c.record(E.Shrink(generation=rec.generation, dp_from=plan.old_grid[2], dp_to=dp,
                          grid={"tp": tp, "pp": pp, "dp": dp}, recoverable_step=plan.recoverable_step,
                          freed=freed, lost=list(plan.lost),
                          **({"drain": rec.drain.request_id} if rec.drain is not None else {})))
    rec.t_restored = now
    rec.move(RecoveryPhase.REPLAY)
    rec.target_step = plan.recoverable_step + plan.steps_replayed
    c.job.to(JobState.RUNNING, f"generation {rec.generation} restored")
    c.record(E.RecoveryRestored(generation=rec.generation, recoverable_step=plan.recoverable_step,
                                invariants=list(plan.invariants), restore_s=round(now - rec.t_start, 3)))
    for _, w in plan.rank_map:
        c.transport.send(w, {"type": "resume", "generation": rec.generation, "step": plan.recoverable_step})


def finish_recovery(c: Any, rec: Recovery, now: float, interrupted: bool) -> None:
    detect_s = rec.t_start - rec.t_fault
    phases = {"detect": round(detect_s, 3), "reconfigure": round(rec.phases.get("reconfigure", 0.0), 3),
              "params": round(rec.phases.get("params", 0.0), 3),
              "optimizer": round(rec.phases.get("optimizer", 0.0), 3),
              "replay": round(now - rec.t_restored, 3)}
    c.record(E.RecoveryDone(generation=rec.generation, action=rec.plan.action,
                            total_s=round(now - rec.t_fault, 3), phases=phases,
                            steps_replayed=rec.plan.steps_replayed, recoverable_step=rec.plan.recoverable_step,
                            replay_interrupted=interrupted,
                            **({"drain": rec.drain.request_id} if rec.drain is not None else {})))
    c.transport.carry_out(c.drains.finished(rec, now, standby=lambda w: c.slots[w].state is SlotState.STANDBY))
    c.recovery = None


def newest_checkpoint(c: Any) -> int | None:
    """The newest complete persistent checkpoint: reported by rank 0 or found under the checkpoint root."""
    from phoenix_hpc.recovery.checkpoint import latest_step

    on_disk = latest_step(c.t.checkpoint_path) if c.t.checkpoint_path else None
    steps = [s for s in (c.checkpoint_step, on_disk) if s is not None]
    return max(steps) if steps else None


def fallback(c: Any, rec: Recovery, exc: FallbackRequired, live_steps: dict[int, int], spares: list[int],
              dead: list[int], now: float) -> None:
    """Memory replicas cannot cover the loss (docs/design.md section 6): restart generation g+1 in this job
    from the newest persistent checkpoint (spares take the dead ranks, every member loads it); when
    there is no checkpoint or not enough spares, stop cleanly naming the checkpoint to resubmit from."""
    from phoenix_hpc.recovery.ckpt_files import complete_steps

    bad = bad_step_of(rec)
    if bad is not None and "differed at step" not in exc.reason:
        # the copies from the bad step on were left out of the plan on purpose: say so first (the planner's
        # own words speak of dead holders, which is not why)
        exc = FallbackRequired(f"the DP replicas' parameters differed at step {bad} and memory holds no copy "
                               f"of {', '.join(exc.lost_shards) or 'every shard'} from before it (a difference "
                               f"at a generation's first commit; the planner: {exc.reason})", exc.lost_shards)
    ck, lost = fallback_checkpoint(
        newest_checkpoint(c), complete_steps(c.t.checkpoint_path) if c.t.checkpoint_path and bad is not None else [],
        bad, live_steps, (c.slots[w].step for w in c.rank_map.values() if w in c.slots))
    if ck is not None:
        t0 = time.perf_counter()
        try:
            plan = plan_checkpoint_restart(
                generation=rec.generation - 1, grid=tuple(c.grid), rank_map=dict(c.rank_map),
                nodes={w: s.node for w, s in c.slots.items()}, dead=dead, spares=spares,
                checkpoint_step=ck, live_steps=live_steps)
        except FallbackRequired as exc2:  # say both: why memory could not, and why the checkpoint cannot here
            exc = FallbackRequired(exc.reason if exc2.reason in exc.reason else f"{exc.reason}; and {exc2.reason}",
                                   exc.lost_shards)
        else:
            c.record(E.Decision(action="checkpoint_restart", reason=exc.reason, checkpoint_step=ck,
                                lost_steps=lost))
            c.record(E.CheckpointRestart(generation=rec.generation, reason=exc.reason,
                                         lost_shards=list(exc.lost_shards), checkpoint_step=ck, lost_steps=lost,
                                         checkpoint_path=c.t.checkpoint_path))
            return _send_plan(c, rec, plan, now, time.perf_counter() - t0)
    c.record(E.Decision(action="fallback", reason=exc.reason, lost_shards=list(exc.lost_shards),
                        checkpoint_step=ck, lost_steps=lost))
    c.recovery = None
    c.job.to(JobState.FALLBACK, exc.reason)
    if ck is not None:
        msg = (f"recovery from memory impossible: {exc.reason}. The job stops. Newest persistent checkpoint: step {ck} under {c.t.checkpoint_path} "
               f"({lost} step(s) since then are lost). To continue from it: {continue_hint(str(c.run_dir), c.next_job)} "
               f"(training restarts at step {ck})")
    else:
        msg = (f"recovery from memory impossible: {exc.reason}. The job stops. No persistent checkpoint was written yet "
               "(resilience.checkpoint.interval_steps): resubmitting starts the training over")
    c._end(JobState.FAILED, E.Fallback(reason=exc.reason, message=msg, checkpoint_step=ck,
                         lost_steps=lost, checkpoint_path=c.t.checkpoint_path))
