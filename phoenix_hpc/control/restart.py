"""A restarted coordinator takes over its job: state from the journal, then the slots re-register.

Plain functions of the coordinator ``c`` (:func:`rebuild_from_journal`, :func:`on_rejoin`). After a crash the batch
script's supervisor (:mod:`phoenix_hpc.control.supervise`) starts a new coordinator with ``--restart N``. It
reuses the job secret, folds ``RUN_DIR/journal.jsonl`` into the job's view (:func:`phoenix_hpc.control.view.fold`
by its recorder, :mod:`phoenix_hpc.control.recorder`, which applies every record it journals from then on;
the fold ``phoenix status`` reads too: generation, grid, slots, rank maps, committed step, checkpoint, a
recovery in progress; a journal line it cannot take is skipped and named in ``coordinator_restarted``; replica
agreement's repaired steps and strikes, :func:`phoenix_hpc.control.agreement.book_from_records`) and writes a new
``coordinator.json`` (new ports, its own pid): the slots, which trained on meanwhile, find it there,
re-register with ``rejoin`` (their generation and step) and resend their newest commit report (own shard,
replicas held). Until a slot has re-registered its heartbeats are not judged for the start-up grace
(``resilience.coordinator_grace_s``); a slot that never comes back (it died while the coordinator was away)
is then declared dead by the heartbeat timeout, and the recovery machine handles it as any fault.

A coordinator that died after the job's end (``job_done``, a stop) but before its verdict file only writes
the verdict again. A recovery that was in progress when the coordinator died cannot be continued (its plan's rendezvous lived
in the dead coordinator's store): its dead slots are queued again as a fault, so a new recovery with the
next generation starts from the survivors' host copies.
"""

from __future__ import annotations

from typing import Any

from phoenix_hpc.control import events as E
from phoenix_hpc.control.agreement import book_from_records
from phoenix_hpc.control.classify import Fault, FaultKind
from phoenix_hpc.control.records import PendingFault, Slot
from phoenix_hpc.control.rejoin import rejoin_verdict
from phoenix_hpc.control.states import JobState, RecoveryPhase, SlotState, job_machine, slot_machine
from phoenix_hpc.control.view import JobView, SlotView

# a slot's state in the journal's view -> in the coordinator (drained: it left by a planned drain, DONE)
_SLOT_STATE = {"active": SlotState.ACTIVE, "standby": SlotState.STANDBY, "joining": SlotState.JOINING,
               "quiesced": SlotState.QUIESCED, "dead": SlotState.DEAD, "drained": SlotState.DONE,
               "done": SlotState.DONE}


def rebuild_from_journal(c: Any) -> JobView:
    """Take the state of the (fresh) coordinator ``c`` from its view: the journal's fold, which its recorder
    started from the records already in the journal (control/recorder.py). Returns the view."""
    r = c.view
    now = c.clock()
    if r.grid is not None:
        c.grid = r.grid
    opened = c.recorder.take_opened()  # the records the view was folded from (the journal is read once)
    if c.grid:  # the steps repaired and the strikes of replica agreement (control/agreement.py)
        records = E.well_typed(opened)  # the fold skipped the others
        c.agreement = book_from_records(records, dp=c.grid[2], generation=c.generation, rank_maps=c.rank_maps,
                                        rank_map=c.rank_map, window=int(c.t.agreement_strikes_window_steps))
    c._rejoined: set[int] = set()
    for w, s in r.slots.items():
        m = slot_machine(f"slot {w}", _SLOT_STATE.get(s.state, SlotState.ACTIVE))
        # not re-registered yet: step 0 gives it the start-up grace before its heartbeats are judged
        c.slots[w] = Slot(w, s.node, int(s.pid or 0), s.role, m, now, s.logical_rank, s.generation or 0, 0,
                             domain=s.domain)
    if r.job_end is not None:  # it died between the job's end and its verdict: give the verdict, nothing more
        c.job = job_machine(JobState(E.JOB_END_STATES[r.job_end]))
        c._end_at = now + c.t.linger_s
        return r
    if r.running:
        c.job.to(JobState.RUNNING, "restarted coordinator: the journal says the job was running")
    if r.recovery is not None and r.recovery.phase is not RecoveryPhase.REPLAY:
        requeue_recovery(c, r, now)
    return r


def requeue_recovery(c: Any, r: JobView, now: float) -> None:
    """A recovery was cut short by the restart: its dead slots become a pending fault again."""
    dead = tuple(sorted(w for w in r.recovery.dead if w in c.slots))
    nodes = tuple(sorted({c.slots[w].node for w in dead}))
    f = Fault(FaultKind.PROCESS_EXIT, dead, nodes, False,
              f"recovery to generation {r.generation} interrupted by a coordinator restart")
    c.faults.append(PendingFault(f, now))


def on_rejoin(c: Any, body: dict) -> None:
    """``register`` with ``rejoin``: a slot that kept running while the coordinator was away."""
    w, pid = int(body["world_rank"]), int(body["pid"])
    rj: dict[str, Any] = body.get("rejoin") or {}
    slot = c.slots.get(w)
    rec = None if slot is None else SlotView(w, slot.node, slot.pid, slot.state.value, slot.logical_rank,
                                             slot.generation, role=slot.role)
    why = rejoin_verdict(rec, pid, str(body.get("role")), body.get("logical_rank"), rj.get("generation"),
                         c.generation)
    if why is not None:
        c.record(E.RejoinRefused(world_rank=w, pid=pid, reason=why))
        return c.transport.reply(body, {"type": "rejected", "reason": f"rejoin of world rank {w} refused: {why}"})
    step = int(rj.get("step") or 0)
    slot.step = max(slot.step, step)
    slot.last_seen = c.clock()
    if rj.get("generation") is not None:
        slot.generation = max(slot.generation, int(rj["generation"]))
    first = w not in c._rejoined
    c._rejoined.add(w)
    # group commit, as for a registration (membership.py): one fsync per batch of rejoining slots
    c.record(E.Rejoined(world_rank=w, pid=pid, node=slot.node, role=str(body.get("role")),
                        generation=rj.get("generation"), step=step, again=not first,
                        buffered=int(rj.get("buffered") or 0), dropped=int(rj.get("dropped") or 0)), deferred=True)
    c.transport.reply_after_sync(body, {"type": "registered", "generation": c.generation, "role": slot.role,
                                  "logical_rank": slot.logical_rank})
