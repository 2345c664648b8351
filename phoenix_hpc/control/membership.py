"""Membership and liveness: which slots belong to the job and whether they are alive.

:class:`MembershipMixin` is part of :class:`phoenix_hpc.control.coordinator.Coordinator`. It handles
``register`` (active slots at start, standby slots any time; the grid is taken from the first active
registration) and ``heartbeat``; rejects messages from unregistered, re-spawned, dead or wrong-generation slots
(:meth:`~MembershipMixin._slot_of`, :meth:`~MembershipMixin._gen_ok`); turns a closed liveness connection
(:mod:`phoenix_hpc.control.liveness`) or a heartbeat timeout (:func:`phoenix_hpc.control.detect.detect`,
called from the coordinator's tick) into :meth:`~MembershipMixin._declare_dead`, which marks the slots DEAD,
queues a fault for the recovery machine (:mod:`phoenix_hpc.control.recovery_machine`) unless only spares died,
and *fences* each slot: tells it to stop (:meth:`~MembershipMixin._fence`), again for any message a dead slot
sends later.
"""

from __future__ import annotations

from typing import Any

from phoenix_hpc.control import events as E
from phoenix_hpc.control.admission import admit, declare_dead
from phoenix_hpc.control.classify import FaultKind
from phoenix_hpc.control.commands import Outcome
from phoenix_hpc.control.handlers import apply_commit
from phoenix_hpc.control.planned_end import exits_during_end
from phoenix_hpc.control.records import PendingFault, Slot
from phoenix_hpc.control.states import LIVE_SLOT_STATES, TERMINAL_JOB_STATES, JobState, SlotState, slot_machine


class MembershipMixin:
    """Registration, heartbeats and declaring slots dead, for the coordinator."""

    def _drain_exits(self) -> bool:
        """Slots whose process ended (their liveness connection closed, :mod:`phoenix_hpc.control.liveness`)
        are declared dead at once, unless they already finished, died, or the job ended."""
        if self.liveness is None:
            return False
        exits = self.liveness.poll_exits()
        if not exits:
            return False
        self._drain_inbox()  # what a slot sent before it exited (e.g. ``done``) counts first
        if self.ending is not None:
            exits_during_end(self, exits)  # expected: noted only (control/planned_end.py)
            return True
        gone = []
        for w, pid in exits:
            slot = self.slots.get(w)
            if slot is None or slot.pid != pid or slot.state not in LIVE_SLOT_STATES:
                continue
            if slot.logical_rank is not None and slot.logical_rank in self.done:
                continue
            gone.append(w)
        if gone and self.job.state not in TERMINAL_JOB_STATES:
            detail = ", ".join(f"world rank {w} (pid {self.slots[w].pid} on {self.slots[w].node})" for w in gone)
            self._declare_dead(gone, FaultKind.PROCESS_EXIT, f"process exited: {detail}", self.clock())
        return True

    def _slot_of(self, body: dict, what: str) -> Slot | None:
        w = int(body["world_rank"])
        slot = self.slots.get(w)
        if slot is None:
            self._reject(f"{what} from unregistered world rank {w}", body, key=(what, "unregistered", w))
            return None
        if int(body.get("pid", slot.pid)) != slot.pid:
            self._reject(f"{what} for world rank {w} from pid {body.get('pid')}, registered pid is {slot.pid}", body,
                         key=(what, "pid", w))
            return None
        if slot.state is SlotState.DEAD:
            self._reject(f"{what} from world rank {w}, which was declared dead (fenced; it must exit)", body,
                         key=(what, "dead", w))
            self._fence(w, "this slot was declared dead earlier (fenced)")
            return None
        return slot

    def _on_register(self, body: dict) -> None:
        if body.get("rejoin") is not None:  # a slot back after a coordinator restart (control/restart.py)
            return self._on_rejoin(body)
        a = admit(body, slots=self.slots, grid=self.grid, rank_map=self.rank_map, job_state=self.job.state)
        self.grid = a.grid  # the first active registration sets the job's grid (control/admission.py)
        if a.reject:
            return self._reject(a.reject, body, key=a.key)
        w, pid, node, role, logical, inputs, domain = a.world_rank, a.pid, a.node, a.role, a.logical_rank, a.inputs, a.domain
        if inputs is not None:
            self.placement_inputs = self.placement_inputs or {"k": int(inputs["k"]), "levels": list(inputs["levels"])}
        slot = Slot(w, node, pid, role, slot_machine(f"slot {w}"), self.clock(), logical, self.generation,
                    domain=domain)
        slot.machine.to(SlotState.ACTIVE if role == "active" else SlotState.STANDBY, "registered")
        self.slots[w] = slot
        if logical is not None:
            self.rank_map[logical] = w
        self.counters["accepted"] += 1
        # the placement inputs go to the journal too: a restarted coordinator recomputes placements from them
        # group commit (control/journal.py): the record is written now and made durable with the rest of this
        # batch of messages by one fsync, and the answer goes out after that fsync (messaging._sync_and_answer)
        self.journal.append_deferred(E.Registered(world_rank=w, pid=pid, node=node, role=role,
                                                  logical_rank=logical, **({"placement_inputs": inputs} if inputs is not None else {})))
        self._reply_after_sync(body, {"type": "registered", "generation": self.generation, "role": role,
                                      "logical_rank": logical})
        if self.grid and len(self.rank_map) == self.grid[0] * self.grid[1] * self.grid[2] \
                and self.job.state is JobState.STARTING:
            self.job.to(JobState.RUNNING, "all active ranks registered")
            self.rank_maps[self.generation] = dict(self.rank_map)
            self.journal.append(E.JobRunning(generation=self.generation, grid=list(self.grid),
                                             rank_map=sorted(self.rank_map.items()),
                                             standby=sorted(s.world_rank for s in self.slots.values() if s.role == "standby")))

    def _gen_ok(self, slot: Slot, g: Any, what: str, body: dict) -> bool:
        if g is None and slot.state in (SlotState.STANDBY, SlotState.JOINING):
            return True  # a spare has no generation until its restore completes
        g = int(g)
        if g > self.generation:
            self._reject(f"{what} from world rank {slot.world_rank} with future generation {g} "
                         f"(current {self.generation})", body, key=(what, "future", slot.world_rank, g))
            return False
        if g < slot.generation:
            self._reject(f"{what} from world rank {slot.world_rank} with stale generation {g} "
                         f"(slot is at {slot.generation}, job at {self.generation})", body,
                         key=(what, "stale", slot.world_rank, g))
            return False
        return True

    def _on_heartbeat(self, body: dict) -> None:
        slot = self._slot_of(body, "heartbeat")
        if slot is None or not self._gen_ok(slot, body.get("generation"), "heartbeat", body):
            return
        slot.last_seen = self.clock()
        if body.get("step") is not None:
            self._note_step(slot, int(body["step"]))
        self.counters["heartbeats"] += 1
        self.heartbeat_ages.add(body.get("sent_at"))

    def _on_heartbeats(self, body: dict) -> None:
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
        now = self.clock()
        fresh_s = 2 * self.t.heartbeat_interval_s
        self.heartbeat_ages.add(body.get("sent_at"))
        self.counters["heartbeat_messages"] += 1
        for entry in body.get("beats") or ():
            w, pid, g, step, age, commit = entry
            age = max(0.0, float(age))
            part = {"type": "heartbeat", "world_rank": int(w), "pid": int(pid), "generation": g, "step": step,
                    "carrier": body.get("world_rank")}
            slot = self.slots.get(int(w))
            if slot is None or slot.pid != int(pid) or slot.state is SlotState.DEAD:
                if age <= fresh_s:
                    self._slot_of(part, "heartbeat")
                continue
            if not self._gen_ok(slot, g, "heartbeat", part):
                continue
            slot.last_seen = max(slot.last_seen, now - age)
            commit = commit if commit and slot.logical_rank is not None and commit.get("g") == slot.generation \
                else None
            live = commit.get("live_step") if commit else None
            if step is not None or live is not None:
                self._note_step(slot, max(int(s) for s in (step, live) if s is not None))
            self.counters["heartbeats"] += 1
            if commit:
                apply_commit(self, slot, commit)

    def _declare_dead(self, worlds: list[int], kind: FaultKind, reason: str, now: float) -> None:
        """Carry out :func:`phoenix_hpc.control.admission.declare_dead`: mark the slots DEAD, journal, settle
        their injections, queue the fault, fence them (journalled and queued first, as every instruction: a
        restart knows it was sent)."""
        d = declare_dead(worlds, kind, reason, slots=self.slots, members=set(self.rank_map.values()))
        if d is None:
            return
        for w in d.worlds:
            self.slots[w].machine.to(SlotState.DEAD, reason)
        self.journal.append(d.records[0])
        self._carry_out(self.injects.lost(list(d.worlds), reason, live=self._is_live, has_fired=self._has_fired))
        if d.fault is not None:
            self.faults.append(PendingFault(d.fault, now))
            self._t_fault_hint = d.t_fault if self._t_fault_hint is None else min(self._t_fault_hint, d.t_fault)
        self._carry_out(Outcome(list(d.records[1:]), list(d.fences)))

    def _fence(self, w: int, reason: str) -> None:
        """Tell slot ``w``, declared dead, to exit (``stop`` with ``job_state`` fenced). A slot may be declared
        dead while its process lives (a GPU error, a hang, a lost link, a missed heartbeat): a member that
        reads it leaves at once, frees its node's GPU and memory, and writes ``ranks/fenced-world{w}.json``,
        never the summary of the logical rank a spare holds now (launch/rank.py). A process that is gone, or
        blocked (a lost link in a drill), never reads it; the message is harmless there."""
        self._send(w, {"type": "stop", "reason": reason, "job_state": "fenced"})

    def _live_members(self) -> list[int]:
        return sorted(w for w in self.rank_map.values() if self.slots[w].state not in (SlotState.DEAD, SlotState.DONE))
