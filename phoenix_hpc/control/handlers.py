"""The handlers of the training messages a member sends while it trains: ``commit`` (the committed steps of
the shards and replicas it holds), ``checkpoint``, ``fault`` (from inside a step), ``done`` and ``stop``; and
the journal's ``commit`` record of the recoverable step.

Plain functions of the coordinator ``c`` (the ``on_*`` handlers are entries of its dispatch table); the
decisions are in :mod:`phoenix_hpc.control.ledger`. The recovery's own
messages (``quiesced``, ``recovered``) are in :mod:`phoenix_hpc.control.recovery_machine`, registration and
heartbeats in :mod:`phoenix_hpc.control.membership`, fault injection in :mod:`phoenix_hpc.control.inject_relay`
and the planned end's in :mod:`phoenix_hpc.control.planned_end`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from phoenix_hpc.control import events as E
from phoenix_hpc.control import recovery_machine
from phoenix_hpc.control.agreement import REPORT_STEPS, AgreementBook, add_strike, check_report
from phoenix_hpc.control.classify import Fault, FaultKind
from phoenix_hpc.control.ledger import all_done, fault_report, job_done
from phoenix_hpc.control.records import PendingFault
from phoenix_hpc.control.states import TERMINAL_JOB_STATES, JobState
from phoenix_hpc.recovery.steps import committed_step, recoverable_step
from phoenix_hpc.runtime.interval import lost_steps_at_most
from phoenix_hpc.topology import GridCoord, coord_of, rank_of


def on_commit(c: Any, body: dict) -> None:
    """A member's ``commit`` report (``c``: the coordinator)."""
    slot = c._slot_of(body, "commit")
    if slot is None or not c._gen_ok(slot, body.get("generation"), "commit", body) or slot.logical_rank is None:
        return
    slot.last_seen = c.clock()
    if body.get("live_step") is not None:  # current when sent (a board entry's may lag: _on_heartbeats)
        c._note_step(slot, int(body["live_step"]))
    apply_commit(c, slot, body)


def apply_commit(c: Any, slot: Any, body: dict) -> None:
    """A commit report's copies (``shards``, ``replicas``, the owner's statement, the interval) for an
    active ``slot`` whose generation was checked; the caller takes its ``live_step``. O(shards the slot
    holds).

    A report names every copy the member holds: a copy it named before and does not name now is gone (after a
    recovery the new generation's placement moved the replica elsewhere), so its committed step and its place
    among the shard's holders are dropped; kept, the stale step held the recoverable step back for the rest of
    the job."""
    r = slot.logical_rank
    shards, replicas = dict(body.get("shards", {})), dict(body.get("replicas", {}))
    held = (tuple(shards), tuple(replicas))
    old = c.held.get(r)
    if old is not None and old != held:  # rare (a new placement): the per-report cost is one tuple compare
        old_shards, old_replicas = old
        for sid in {*old_shards, *old_replicas} - shards.keys() - replicas.keys():  # copies no longer held
            c.committed.get(sid, {}).pop(r, None)
        for sid in set(old_replicas) - set(replicas):
            if r in c.placement.get(sid, ()):
                c.placement[sid].remove(r)
    c.held[r] = held
    for sid, step in shards.items():
        c.committed.setdefault(sid, {})[r] = int(step)
    for sid, step in replicas.items():
        c.committed.setdefault(sid, {})[r] = int(step)
        holders = c.placement.setdefault(sid, [])
        if r not in holders:
            holders.append(r)
    g = body["generation"] if "generation" in body else body.get("g", slot.generation)  # "g": a node's heartbeats
    m = int(body.get("interval", 1))
    if m != c.protect_interval and int(g) == c.generation:
        # every rank commits the same steps with the same interval (runtime/interval.py): the first
        # report of a new one is journalled with what it means for lost work
        c.protect_interval = m
        step = max((int(s) for s in dict(body.get("shards", {})).values()), default=None)
        c.record(E.ProtectInterval(interval=m, step=step, generation=c.generation,
                                   lost_steps_at_most=lost_steps_at_most(m)))
    c._record_sent(slot, int(g), body.get("sent"), body)  # control/evidence.py
    if not c.t.replica_agreement:
        agreement_off(c, int(g))
    elif body.get("params") is not None:
        check_agreement(c, slot, int(g), body["params"])
    c._commit_dirty = True  # the recoverable step is an O(ranks) scan: once per tick, not per message


#: why nothing is compared with ``resilience.replica_agreement: false`` (the ``agreement_off`` record)
AGREEMENT_OFF = ("resilience.replica_agreement is false: the DP replicas' parameters are not compared (no digest "
                 "is computed or reported), so a silently corrupted replica goes unnoticed")


def agreement_off(c: Any, g: int) -> None:
    """``resilience.replica_agreement: false``: compare nothing, and journal ``agreement_off`` once per
    generation, at the first commit report of the job's current generation ``g`` (the view keeps the
    generation it was journalled for, so a restarted coordinator does not journal it again)."""
    if g == c.generation and c.view.agreement.get("off_generation") != c.generation:
        c.record(E.AgreementOff(generation=c.generation, reason=AGREEMENT_OFF))


def check_agreement(c: Any, slot: Any, g: int, params: Any) -> None:
    """A member's parameter digests of its newest commits (``params``: ``[[step, digest], ...]``), each
    compared with its DP peers' once all of them reported that step (control/agreement.py decides). A
    rejected digest is journalled once (``agreement_rejected``) and compared with nothing; a disagreement is
    journalled (``silent_corruption``, naming the suspects) and counted against them (:func:`_disagreement`).
    A grid with dp = 1 is journalled once per generation as undetectable (``agreement_undetectable``).

    Reports of the generation a recovery just left are still compared while the book is of that generation
    (until the first report of the new one): the ranks' commit fence stops them at the step after a
    difference, and the reports that name who differs arrive with their heartbeats during the recovery."""
    if not c.grid:
        return
    tp, pp, dp = c.grid
    book = c.agreement
    if book is None or (g == c.generation and (book.generation != c.generation or book.dp != dp)):
        old = book  # a new generation (a shrink changes dp mid-recovery)
        book = c.agreement = AgreementBook(dp=dp, generation=c.generation)
        if old is not None:
            book.carry_from(old)
        if dp < 2:
            c.record(E.AgreementUndetectable(
                generation=c.generation, stages=[[p, t] for p in range(pp) for t in range(tp)],
                reason="dp = 1: no data-parallel peer holds the same parameters to compare with"))
    r = slot.logical_rank

    def reject(step: Any, why: str, key: Any = None) -> None:
        if book.first_rejection((slot.world_rank, g, repr(step), why) if key is None else key):
            c.record(E.AgreementRejected(world_rank=slot.world_rank, logical_rank=r, generation=g,
                                         step=step, reason=why))

    if not isinstance(params, list) or len(params) > REPORT_STEPS:
        return reject(None, f"parameter digests {type(params).__name__} of length "
                            f"{len(params) if isinstance(params, list) else '-'}: not a list of at most "
                            f"{REPORT_STEPS} [step, digest] pairs")
    if g != book.generation or book.dp != dp:  # one record per old generation: every slot reports it until its first new commit
        steps = [p[0] for p in params if isinstance(p, list) and p and type(p[0]) is int]
        return reject(max(steps, default=None), check_report("0" * 16, g, c.generation),
                      key=("generation", g))
    co = coord_of(r, tp, pp, dp)
    seen = book.newest.get(r, -1)  # a node board repeats a slot's report with every heartbeat: taken once
    for item in params:
        if type(item) is list and len(item) == 2 and type(item[0]) is int and 0 <= item[0] <= seen:
            continue
        step, digest = (item[0], item[1]) if isinstance(item, list) and len(item) == 2 else (None, item)
        why = check_report(digest, g, book.generation)
        if why is None and (not isinstance(step, int) or isinstance(step, bool) or step < 0):
            why = f"step {step!r} is not a non-negative integer"
        if why is not None:
            reject(step, why)
            continue
        book.newest[r] = max(book.newest.get(r, -1), step)
        v = book.add(step, co.pp, co.dp, co.tp, digest)
        if v is not None and not v.agree:
            _disagreement(c, book, v, step)


def _disagreement(c: Any, book: AgreementBook, v: Any, step: int) -> None:
    """Journal a :class:`~phoenix_hpc.control.agreement.Verdict` of replicas that differ, count a strike
    against each suspect outside a majority (a repeat offender within ``agreement_strikes_window_steps`` is
    fenced: declared dead and replaced like a failing node), and, for the job's current generation, queue a
    ``silent_corruption`` fault naming the step (a recovery rolls back before it) unless a recovery already
    rolled back before that step. The ranks' commit fence finds the same difference one step after it and
    reports it itself; this queued fault covers the rare case where the heartbeats come first."""
    tp, pp, dp = c.grid
    logical = {d: rank_of(GridCoord(v.pp, d, v.tp), tp, pp, dp) for d in v.digests}
    suspects = [logical[d] for d in v.suspects]
    c.record(E.SilentCorruption(
        generation=book.generation, step=step, pp=v.pp, tp=v.tp,
        members={str(logical[d]): h for d, h in v.digests.items()}, suspects=suspects,
        **({"majority": [logical[d] for d in v.majority]} if v.majority else {})))
    who = (f"logical rank(s) {suspects} differ from the majority {[logical[d] for d in v.majority]}" if v.majority
           else f"logical ranks {suspects} differ and no majority says which is right")
    agreed = book.last_agreed.get((v.pp, v.tp))
    agreed = agreed if agreed is not None and agreed < step else None
    ranks = c.rank_maps.get(book.generation, c.rank_map)  # the verdict's generation's members
    window = c.t.agreement_strikes_window_steps
    for r in (suspects if v.majority else ()):  # with no majority nobody is known to be wrong
        w = ranks.get(r)
        if w is None:
            continue
        book.strikes, repeat = add_strike(book.strikes, w, step, window)
        if repeat and w in c.rank_map.values():
            why = (f"named the corrupted DP replica at steps {', '.join(map(str, book.strikes[w]))}, within "
                   f"resilience.agreement_strikes_window_steps = {window}: treated as a failing node")
            n = len(c.faults)
            c._declare_dead([w], FaultKind.REPEATED_CORRUPTION, why, c.clock())
            for i in range(n, len(c.faults)):  # its replacement must also restore a step before the difference
                p = c.faults[i]
                if p.fault.kind is FaultKind.REPEATED_CORRUPTION:
                    c.faults[i] = PendingFault(replace(p.fault, bad_step=step, agreed_step=agreed), p.t)
    if book.generation == c.generation and step not in book.repaired:
        c.faults.append(PendingFault(Fault(
            FaultKind.SILENT_CORRUPTION, tuple(c.rank_map[x] for x in suspects if x in c.rank_map),
            detail=f"parameters of the DP replicas at pp={v.pp}, tp={v.tp} differ at step {step}: {who}",
            bad_step=step, agreed_step=agreed), c.clock()))


def recoverable_step_of(c: Any) -> int | None:
    """min over shards of the newest step whose owner copy and every reported replica are committed."""
    if not c.grid or not c.committed:
        return None
    per_shard: dict[str, int | None] = {}
    for r, sid in enumerate(shard_ids(c)):
        copies = c.committed.get(sid) or {}
        per_shard[sid] = committed_step(copies) if r in copies else None  # the owner's copy is required
    return recoverable_step(per_shard)


def shard_ids(c: Any) -> tuple[str, ...]:
    """Shard id of every logical rank of the grid (cached per grid)."""
    grid = tuple(c.grid)
    if c._shard_ids_of[0] != grid:
        tp, pp, dp = grid
        c._shard_ids_of = (grid, tuple(coord_of(r, tp, pp, dp).shard_prefix() for r in range(tp * pp * dp)))
    return c._shard_ids_of[1]


def maybe_log_commit(c: Any, force: bool = False) -> None:
    """Journal the ``commit`` record of the recoverable step when it changed and is due (every
    ``commit_log_every`` steps, at least once per progress interval; ``force``: now)."""
    rs = recoverable_step_of(c)
    if rs is None or rs == c._last_commit_logged:
        return
    now = c.clock()
    # every commit_log_every steps, and at least once per progress interval (a slow job's steps take
    # minutes: `phoenix status` must not show a recoverable step many minutes old); ``force``: the last one
    if (force or c._last_commit_logged < 0 or rs - c._last_commit_logged >= c.t.commit_log_every
            or now - c._last_commit_log_t >= c.t.progress_interval_s):
        c._last_commit_logged, c._last_commit_log_t = rs, now
        # per copy (owner's snapshot and each holder's verified replica) its committed step, and the
        # generation's placement: `phoenix status` counts the verified replicas of every shard from them
        placed = {sid: sorted(h) for (sid, g), h in c._placements(before=c.generation + 1).items()
                  if g == c.generation}
        c.record(E.Commit(recoverable_step=rs, protect_every=c.protect_interval, shards=len(c.committed),
                          replicas=sum(len(v) for v in c.placement.values()), generation=c.generation,
                          shard_steps={sid: {str(r): st for r, st in sorted(cp.items())}
                                       for sid, cp in sorted(c.committed.items())},
                          **({"placement": placed} if placed else {}),
                          **({"agreement": c.agreement.summary()} if c.agreement is not None else {})))


def on_checkpoint(c: Any, body: dict) -> None:
    """Rank 0 wrote a persistent checkpoint."""
    slot = c._slot_of(body, "checkpoint")
    if slot is None:
        return
    step = int(body["step"])
    if c.checkpoint_step is None or step > c.checkpoint_step:  # the view's newest, after this record
        c.record(E.Checkpoint(step=step, path=body.get("path"), world_rank=slot.world_rank))


def on_fault(c: Any, body: dict) -> None:
    """A member's fault report from inside a step (control/ledger.py decides)."""
    slot = c._slot_of(body, "fault")
    if slot is None:
        return
    record, fault = fault_report(
        body, world_rank=slot.world_rank, node=slot.node, slot_generation=slot.generation,
        generation=c.generation, stopping=(c.ending is not None or bool(c._stop_reason)
                                           or c.job.state in TERMINAL_JOB_STATES))
    c.record(record)
    if (record.kind == FaultKind.SILENT_CORRUPTION.value and body.get("params") is not None
            and c.t.replica_agreement):
        # a commit fence found DP replicas that differ: the report's digests say who, before the heartbeats
        # do (also when the report is superseded: it is still evidence)
        check_agreement(c, slot, record.generation, body["params"])
    if fault is not None:  # None: a consequence of a fault being handled or of a stop (control/ledger.py)
        c.faults.append(PendingFault(fault, c.clock()))


def on_done(c: Any, body: dict) -> None:
    """A member finished the training; the last one ends the job (control/ledger.py decides)."""
    slot = c._slot_of(body, "done")
    if slot is None or slot.logical_rank is None or not c._gen_ok(slot, body.get("generation"), "done", body):
        return
    commit = body.get("commit")  # the member's newest commit report that no heartbeat carried yet
    if isinstance(commit, dict) and commit.get("g") == slot.generation:
        apply_commit(c, slot, commit)
    c.done[slot.logical_rank] = {"step": int(body["step"]), "state_hash": str(body["state_hash"]),
                                 "world_rank": slot.world_rank}
    slot.step = int(body["step"])
    rec = c.recovery
    if all_done(c.done, members=len(c.rank_map), grid=c.grid, job_state=c.job.state,
                phase=None if rec is None else rec.phase):
        if any(p.fault.kind is FaultKind.SILENT_CORRUPTION for p in c.faults):
            return  # replicas that differ: no job_done with their hash; the tick's decision stops the job
        if rec is not None:
            recovery_machine.finish_recovery(c, rec, c.clock(), interrupted=False)
        maybe_log_commit(c, force=True)  # the newest recoverable step, for status after the end
        c._end(JobState.DONE, job_done(c.done, grid=c.grid, generation=c.generation))


def on_stop(c: Any, body: dict) -> None:
    """A ``stop`` request: answered, then a planned end."""
    c.transport.reply(body, {"type": "ok"})
    c.request_stop(str(body.get("reason", "stop requested")))
