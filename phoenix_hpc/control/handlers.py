"""The handlers of the training messages a member sends while it trains: ``commit`` (the committed steps of
the shards and replicas it holds), ``checkpoint``, ``fault`` (from inside a step), ``done`` and ``stop``; and
the journal's ``commit`` record of the recoverable step.

:class:`HandlersMixin` is part of :class:`phoenix_hpc.control.coordinator.Coordinator`. The recovery's own
messages (``quiesced``, ``recovered``) are in :mod:`phoenix_hpc.control.recovery_machine`, registration and
heartbeats in :mod:`phoenix_hpc.control.membership`, fault injection in :mod:`phoenix_hpc.control.inject_relay`
and the planned end's in :mod:`phoenix_hpc.control.planned_end`.
"""

from __future__ import annotations

from phoenix_hpc.control import events as E
from phoenix_hpc.control.ledger import all_done, fault_report, job_done
from phoenix_hpc.control.records import PendingFault
from phoenix_hpc.control.states import TERMINAL_JOB_STATES, JobState
from phoenix_hpc.recovery.steps import committed_step, recoverable_step
from phoenix_hpc.runtime.interval import lost_steps_at_most
from phoenix_hpc.topology import coord_of


class HandlersMixin:
    """Training-message handlers for the coordinator."""

    def _on_commit(self, body: dict) -> None:
        slot = self._slot_of(body, "commit")
        if slot is None or not self._gen_ok(slot, body.get("generation"), "commit", body) or slot.logical_rank is None:
            return
        slot.last_seen = self.clock()
        if body.get("live_step") is not None:  # current when sent (a board entry's may lag: _on_heartbeats)
            self._note_step(slot, int(body["live_step"]))
        self._apply_commit(slot, body)

    def _apply_commit(self, slot, body: dict) -> None:
        """A commit report's copies (``shards``, ``replicas``, the owner's statement, the interval) for an
        active ``slot`` whose generation was checked; the caller takes its ``live_step``. O(shards the slot
        holds)."""
        r = slot.logical_rank
        for sid, step in dict(body.get("shards", {})).items():
            self.committed.setdefault(sid, {})[r] = int(step)
        for sid, step in dict(body.get("replicas", {})).items():
            self.committed.setdefault(sid, {})[r] = int(step)
            holders = self.placement.setdefault(sid, [])
            if r not in holders:
                holders.append(r)
        g = body["generation"] if "generation" in body else body.get("g", slot.generation)  # "g": a node's heartbeats
        m = int(body.get("interval", 1))
        if m != self.protect_interval and int(g) == self.generation:
            # every rank commits the same steps with the same interval (runtime/interval.py): the first
            # report of a new one is journalled with what it means for lost work
            self.protect_interval = m
            step = max((int(s) for s in dict(body.get("shards", {})).values()), default=None)
            self.journal.append(E.ProtectInterval(interval=m, step=step, generation=self.generation,
                                                  lost_steps_at_most=lost_steps_at_most(m)))
        self._record_sent(slot, int(g), body.get("sent"), body)  # control/evidence.py
        self._commit_dirty = True  # the recoverable step is an O(ranks) scan: once per tick, not per message

    def _recoverable_step(self) -> int | None:
        """min over shards of the newest step whose owner copy and every reported replica are committed."""
        if not self.grid or not self.committed:
            return None
        per_shard: dict[str, int | None] = {}
        for r, sid in enumerate(self._shard_ids()):
            copies = self.committed.get(sid) or {}
            per_shard[sid] = committed_step(copies) if r in copies else None  # the owner's copy is required
        return recoverable_step(per_shard)

    def _shard_ids(self) -> tuple[str, ...]:
        """Shard id of every logical rank of the grid (cached per grid)."""
        grid = tuple(self.grid)
        if self._shard_ids_of[0] != grid:
            tp, pp, dp = grid
            self._shard_ids_of = (grid, tuple(coord_of(r, tp, pp, dp).shard_prefix() for r in range(tp * pp * dp)))
        return self._shard_ids_of[1]

    def _maybe_log_commit(self, force: bool = False) -> None:
        rs = self._recoverable_step()
        if rs is None or rs == self._last_commit_logged:
            return
        now = self.clock()
        # every commit_log_every steps, and at least once per progress interval (a slow job's steps take
        # minutes: `phoenix status` must not show a recoverable step many minutes old); ``force``: the last one
        if (force or self._last_commit_logged < 0 or rs - self._last_commit_logged >= self.t.commit_log_every
                or now - self._last_commit_log_t >= self.t.progress_interval_s):
            self._last_commit_logged, self._last_commit_log_t = rs, now
            # per copy (owner's snapshot and each holder's verified replica) its committed step, and the
            # generation's placement: `phoenix status` counts the verified replicas of every shard from them
            placed = {sid: sorted(h) for (sid, g), h in self._placements(before=self.generation + 1).items()
                      if g == self.generation}
            self.journal.append(E.Commit(recoverable_step=rs, protect_every=self.protect_interval,
                                         shards=len(self.committed),
                                         replicas=sum(len(v) for v in self.placement.values()), generation=self.generation,
                                         shard_steps={sid: {str(r): st for r, st in sorted(c.items())}
                                                      for sid, c in sorted(self.committed.items())},
                                         **({"placement": placed} if placed else {})))

    def _on_checkpoint(self, body: dict) -> None:
        slot = self._slot_of(body, "checkpoint")
        if slot is None:
            return
        step = int(body["step"])
        if self.checkpoint_step is None or step > self.checkpoint_step:
            self.checkpoint_step = step
            self.journal.append(E.Checkpoint(step=step, path=body.get("path"), world_rank=slot.world_rank))

    def _on_fault(self, body: dict) -> None:
        slot = self._slot_of(body, "fault")
        if slot is None:
            return
        record, fault = fault_report(
            body, world_rank=slot.world_rank, node=slot.node, slot_generation=slot.generation,
            generation=self.generation, stopping=(self.ending is not None or bool(self._stop_reason)
                                                  or self.job.state in TERMINAL_JOB_STATES))
        self.journal.append(record)
        if fault is not None:  # None: a consequence of a fault being handled or of a stop (control/ledger.py)
            self.faults.append(PendingFault(fault, self.clock()))

    def _on_done(self, body: dict) -> None:
        slot = self._slot_of(body, "done")
        if slot is None or slot.logical_rank is None or not self._gen_ok(slot, body.get("generation"), "done", body):
            return
        self.done[slot.logical_rank] = {"step": int(body["step"]), "state_hash": str(body["state_hash"]),
                                        "world_rank": slot.world_rank}
        slot.step = int(body["step"])
        rec = self.recovery
        if all_done(self.done, members=len(self.rank_map), grid=self.grid, job_state=self.job.state,
                    phase=None if rec is None else rec.phase):
            if rec is not None:
                self._finish_recovery(rec, self.clock(), interrupted=False)
            self._maybe_log_commit(force=True)  # the newest recoverable step, for status after the end
            self._end(JobState.DONE, job_done(self.done, grid=self.grid, generation=self.generation))

    def _on_stop(self, body: dict) -> None:
        self._reply(body, {"type": "ok"})
        self.request_stop(str(body.get("reason", "stop requested")))
