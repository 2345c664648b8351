"""Membership and liveness: which slots belong to the job and whether they are alive.

Plain functions of the coordinator ``c`` (the ``on_*`` handlers are entries of its dispatch table; the rules
are :mod:`phoenix_hpc.control.admission`). They handle
``register`` (active slots at start, standby slots any time; the grid is taken from the first active
registration) and ``heartbeat``; rejects messages from unregistered, re-spawned, dead or wrong-generation slots
(the coordinator's ``_slot_of`` and ``_gen_ok``); turns a closed liveness connection
(:mod:`phoenix_hpc.control.liveness`) or a heartbeat timeout (:func:`phoenix_hpc.control.detect.detect`,
called from the coordinator's tick) into :func:`declare_dead`, which marks the slots DEAD,
queues a fault for the recovery machine (:mod:`phoenix_hpc.control.recovery_machine`) unless only spares died,
and *fences* each slot: tells it to stop (the coordinator's ``_fence``), again for any message a dead slot
sends later.
"""

from __future__ import annotations

from typing import Any

from phoenix_hpc.control import events as E
from phoenix_hpc.control.admission import admit
from phoenix_hpc.control.admission import declare_dead as dead_verdict
from phoenix_hpc.control.classify import FaultKind
from phoenix_hpc.control.commands import Outcome
from phoenix_hpc.control.handlers import apply_commit
from phoenix_hpc.control.planned_end import exits_during_end
from phoenix_hpc.control.records import PendingFault, Slot
from phoenix_hpc.control.restart import on_rejoin
from phoenix_hpc.control.states import LIVE_SLOT_STATES, TERMINAL_JOB_STATES, JobState, SlotState, slot_machine

#: why nothing is compared in a job without in-memory protection (the ``agreement_off`` record at job_running)
NO_SNAPSHOTS = ("no in-memory protection (resilience.mode checkpoint-restart, or resilience.enabled false): no "
                "snapshot is taken, so the DP replicas' parameters are not compared and a silently corrupted replica "
                "goes unnoticed")


def drain_exits(c: Any) -> bool:
    """Slots whose process ended (their liveness connection closed, :mod:`phoenix_hpc.control.liveness`)
    are declared dead at once, unless they already finished, died, or the job ended."""
    if c.liveness is None:
        return False
    exits = c.liveness.poll_exits()
    if not exits:
        return False
    c._drain_inbox()  # what a slot sent before it exited (e.g. ``done``) counts first
    if c.ending is not None:
        exits_during_end(c, exits)  # expected: noted only (control/planned_end.py)
        return True
    gone = []
    for w, pid in exits:
        slot = c.slots.get(w)
        if slot is None or slot.pid != pid or slot.state not in LIVE_SLOT_STATES:
            continue
        if slot.logical_rank is not None and slot.logical_rank in c.done:
            continue
        gone.append(w)
    if gone and c.job.state not in TERMINAL_JOB_STATES:
        detail = ", ".join(f"world rank {w} (pid {c.slots[w].pid} on {c.slots[w].node})" for w in gone)
        declare_dead(c, gone, FaultKind.PROCESS_EXIT, f"process exited: {detail}", c.clock())
    return True


def on_register(c: Any, body: dict) -> None:
    """A slot's ``register`` (or, with ``rejoin``, its return after a coordinator restart)."""
    if body.get("rejoin") is not None:  # a slot back after a coordinator restart (control/restart.py)
        return on_rejoin(c, body)
    a = admit(body, slots=c.slots, grid=c.grid, rank_map=c.rank_map, job_state=c.job.state)
    c.grid = a.grid  # the first active registration sets the job's grid (control/admission.py)
    if a.reject:
        return c.transport.reject(a.reject, body, key=a.key)
    w, pid, node, role, logical = a.world_rank, a.pid, a.node, a.role, a.logical_rank
    inputs, domain = a.inputs, a.domain  # k and levels: the view's placement_inputs, at registered below
    slot = Slot(w, node, pid, role, slot_machine(f"slot {w}"), c.clock(), logical, c.generation,
                domain=domain)
    slot.machine.to(SlotState.ACTIVE if role == "active" else SlotState.STANDBY, "registered")
    c.slots[w] = slot
    c.counters["accepted"] += 1
    # the placement inputs go to the journal too: a restarted coordinator recomputes placements from them
    # group commit (control/journal.py): the record is written now and made durable with the rest of this
    # batch of messages by one fsync, and the answer goes out after that fsync (messaging.Transport.sync_and_answer)
    c.record(E.Registered(world_rank=w, pid=pid, node=node, role=role, logical_rank=logical,
                          **({"placement_inputs": inputs} if inputs is not None else {})), deferred=True)
    c.transport.reply_after_sync(body, {"type": "registered", "generation": c.generation, "role": role,
                                  "logical_rank": logical})
    if c.grid and len(c.rank_map) == c.grid[0] * c.grid[1] * c.grid[2] \
            and c.job.state is JobState.STARTING:
        c.job.to(JobState.RUNNING, "all active ranks registered")
        c.record(E.JobRunning(generation=c.generation, grid=list(c.grid),
                              rank_map=sorted(c.rank_map.items()),
                              standby=sorted(s.world_rank for s in c.slots.values() if s.role == "standby")))
        if not c.t.snapshots:  # no snapshot, no digest: say once that nothing is compared (docs/design.md 6)
            c.record(E.AgreementOff(generation=c.generation, reason=NO_SNAPSHOTS))


def on_heartbeat(c: Any, body: dict) -> None:
    """One slot's ``heartbeat``."""
    slot = c._slot_of(body, "heartbeat")
    if slot is None or not c._gen_ok(slot, body.get("generation"), "heartbeat", body):
        return
    slot.last_seen = c.clock()
    if body.get("step") is not None:
        c._note_step(slot, int(body["step"]))
    c.counters["heartbeats"] += 1
    c.heartbeat_ages.add(body.get("sent_at"))


def on_heartbeats(c: Any, body: dict) -> None:
    """One node's heartbeats (:mod:`phoenix_hpc.control.node_beats`): ``beats`` lists ``[world_rank, pid,
    generation, step, age_s, commit]`` per slot of the node. Per entry O(1): the slot's last-seen time
    becomes ``now - age_s`` (never earlier than it was), the step and the commit report are taken as from
    a ``heartbeat`` and a ``commit``, except that the slot's step is the larger of the entry's step and
    the commit's ``live_step``. A record keeps its slot's newest commit report until the next commit
    fence, so that live step is one behind through most of every step; taken after the entry's step, it
    lowered every slot's step, and a recovery whose members were past their replayed steps ended only at
    their next fence.

    An entry of a slot that is unknown, re-spawned or dead is rejected like that slot's own message only
    while it is fresh (written within two heartbeat intervals: the slot still runs); an older one is the
    record a killed slot left on its node, and is skipped. A commit of an older generation is skipped
    (the slot has not committed in this one yet)."""
    now = c.clock()
    fresh_s = 2 * c.t.heartbeat_interval_s
    c.heartbeat_ages.add(body.get("sent_at"))
    c.counters["heartbeat_messages"] += 1
    for entry in body.get("beats") or ():
        w, pid, g, step, age, commit = entry
        age = max(0.0, float(age))
        part = {"type": "heartbeat", "world_rank": int(w), "pid": int(pid), "generation": g, "step": step,
                "carrier": body.get("world_rank")}
        slot = c.slots.get(int(w))
        if slot is None or slot.pid != int(pid) or slot.state is SlotState.DEAD:
            if age <= fresh_s:
                c._slot_of(part, "heartbeat")
            continue
        if not c._gen_ok(slot, g, "heartbeat", part):
            continue
        slot.last_seen = max(slot.last_seen, now - age)
        commit = commit if commit and slot.logical_rank is not None and commit.get("g") == slot.generation \
            else None
        live = commit.get("live_step") if commit else None
        if step is not None or live is not None:
            c._note_step(slot, max(int(s) for s in (step, live) if s is not None))
        c.counters["heartbeats"] += 1
        if commit:
            apply_commit(c, slot, commit)


def declare_dead(c: Any, worlds: list[int], kind: FaultKind, reason: str, now: float) -> None:
    """Carry out :func:`phoenix_hpc.control.admission.declare_dead`: mark the slots DEAD, journal, settle
    their injections, queue the fault, fence them (journalled and queued first, as every instruction: a
    restart knows it was sent)."""
    d = dead_verdict(worlds, kind, reason, slots=c.slots, members=set(c.rank_map.values()))
    if d is None:
        return
    for w in d.worlds:
        c.slots[w].machine.to(SlotState.DEAD, reason)
    c.record(d.records[0])
    c.transport.carry_out(c.injects.lost(list(d.worlds), reason, live=c._is_live, has_fired=c._has_fired))
    if d.fault is not None:
        c.faults.append(PendingFault(d.fault, now))
        c._t_fault_hint = d.t_fault if c._t_fault_hint is None else min(c._t_fault_hint, d.t_fault)
    c.transport.carry_out(Outcome(list(d.records[1:]), list(d.fences)))


def live_members(c: Any) -> list[int]:
    """World ranks of the current rank map that are neither dead nor done."""
    return sorted(w for w in c.rank_map.values() if c.slots[w].state not in (SlotState.DEAD, SlotState.DONE))
