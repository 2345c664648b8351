"""The coordinator's side of a planned end (protocol and state in :mod:`phoenix_hpc.control.ending`).

:class:`PlannedEndMixin` is part of :class:`phoenix_hpc.control.coordinator.Coordinator`: it uses the
coordinator's slots, rank map, journal, ``_send``/``_slot_of``/``_end`` and its timing, and adds the
handlers of ``stopping``, ``shard_written`` and ``signal`` (a slot that received SIGTERM passes it on).
"""

from __future__ import annotations

from phoenix_hpc.control import events as E
from phoenix_hpc.control.ending import PlannedEnd, after_stop_round, continue_hint, no_final_checkpoint
from phoenix_hpc.control.events import RecoveryPhase
from phoenix_hpc.control.recovery_phases import ANSWERING
from phoenix_hpc.control.states import TERMINAL_JOB_STATES, JobState, SlotState


class PlannedEndMixin:
    """Planned ends for the coordinator (single-threaded, like the rest of it)."""

    ending: PlannedEnd | None = None
    next_job: str | None = None  # the job the chain queued to continue the run (cli/chain.py), if any
    _stop_signal: str | None = None

    def request_stop(self, reason: str, signal: str | None = None) -> None:
        """Ask the loop to end the job (thread- and signal-safe: only sets fields). ``signal``: the external
        signal behind it (``USR1`` time limit, ``TERM``), journalled with the end."""
        if signal is not None and self._stop_signal is None:
            self._stop_signal = signal
        self._stop_reason = reason

    def _round_timeout_s(self) -> float:
        return self.t.collective_timeout_s + self.t.heartbeat_timeout_s

    def _maybe_begin_end(self, now: float) -> None:
        """Called every loop turn while a stop is requested and the job has not ended."""
        if self.ending is not None:
            return
        rec = self.recovery
        if rec is not None and RecoveryPhase(rec.phase) in ANSWERING and now <= rec.deadline:
            return  # let the recovery finish (bounded by its own deadline); the members are in no state to write
        members = {w for w in self.rank_map.values() if self.slots[w].state is SlotState.ACTIVE}
        why = no_final_checkpoint(final_checkpoint=self.t.final_checkpoint, checkpoint_path=self.t.checkpoint_path,
                                  job_state=self.job.state.value, active_members=len(members),
                                  members=len(self.rank_map))
        if why is not None:
            self._end_stopped(None, why)
            return
        self.ending = PlannedEnd(self._stop_reason, self._stop_signal, members, now, now + self._round_timeout_s())
        self.journal.append(E.Stopping(reason=self._stop_reason, signal=self._stop_signal, members=sorted(members),
                                       generation=self.generation))
        for w in sorted(members):
            self._send(w, {"type": "stop", "reason": self._stop_reason, "checkpoint": True,
                           "generation": self.generation})

    def _advance_end(self, now: float) -> None:
        end = self.ending
        if not end.round_over(now):
            return
        if end.phase == "stop":
            on_disk = self._newest_checkpoint()
            step, note = after_stop_round(end, on_disk)
            if step is None:
                return self._end_stopped(on_disk, note)
            end.phase, end.step, end.t_write = "write", step, now
            end.deadline = now + self.t.final_write_timeout_s
            for w in sorted(end.members):
                self._send(w, {"type": "write_checkpoint", "step": step, "generation": self.generation})
            return
        fails = end.failures()
        if fails:
            self.journal.append(E.CheckpointIncomplete(step=end.step, reasons=fails))
            return self._end_stopped(self._newest_checkpoint(), f"final checkpoint of step {end.step} incomplete: "
                                     + "; ".join(fails))
        from phoenix_hpc.recovery.ckpt_files import mark_complete

        files = {b["file"]: {"sha256": b["sha256"], "bytes": int(b["bytes"])} for b in end.written.values()}
        write_s = max(float(b.get("write_s", 0.0)) for b in end.written.values())
        path = mark_complete(self.t.checkpoint_path, end.step, "snapshot", grid=list(self.grid), files=files,
                             generation=self.generation, write_s=round(write_s, 3))
        self.checkpoint_step = end.step
        from phoenix_hpc.recovery.ckpt_files import prune

        pruned = prune(self.t.checkpoint_path, self.t.checkpoint_keep)
        if pruned:
            self.journal.append(E.CheckpointsPruned(steps=pruned, keep=self.t.checkpoint_keep))
        self.journal.append(E.Checkpoint(step=end.step, path=str(path), source="final", write_s=round(write_s, 3),
                                         total_s=round(now - end.t_start, 3), bytes=sum(f["bytes"] for f in files.values())))
        self._end_stopped(end.step, f"final checkpoint of step {end.step} written")

    def _end_stopped(self, checkpoint_step: int | None, note: str) -> None:
        reason = self._stop_reason or "stop requested"
        hint = continue_hint(str(self.run_dir), self.next_job)
        ck = (f"newest complete checkpoint: step {checkpoint_step} under {self.t.checkpoint_path}"
              if checkpoint_step is not None else "no complete checkpoint: resuming starts the training over")
        self._end(JobState.STOPPED, E.CoordinatorStopped(reason=reason, signal=self._stop_signal,
                                       checkpoint_step=checkpoint_step, checkpoint_path=self.t.checkpoint_path, note=note,
                                       message=f"{reason}; {note}; {ck}. To continue: {hint}"))

    # --- handlers --------------------------------------------------------------------------------------
    def _on_stopping(self, body: dict) -> None:
        slot = self._slot_of(body, "stopping")
        end = self.ending
        if slot is None or end is None or end.phase != "stop" or slot.world_rank not in end.members:
            return
        end.copies[slot.world_rank] = [int(s) for s in body.get("steps", [])]
        slot.last_seen = self.clock()

    def _on_shard_written(self, body: dict) -> None:
        slot = self._slot_of(body, "shard_written")
        end = self.ending
        if slot is None or end is None or end.phase != "write" or slot.world_rank not in end.members:
            return
        if int(body.get("step", -1)) != end.step and not body.get("error"):
            body = {"error": f"wrote step {body.get('step')}, asked for {end.step}"}
        end.written[slot.world_rank] = body
        slot.last_seen = self.clock()

    def _on_signal(self, body: dict) -> None:
        """A slot received a signal meant for the job (SIGTERM from ``scancel --signal=TERM`` or preemption,
        which Slurm delivers to the step's tasks, not to the batch shell): end the job as planned."""
        slot = self._slot_of(body, "signal")
        if slot is None or self.job.state in TERMINAL_JOB_STATES:
            return
        sig = str(body.get("signal", "TERM"))
        if self._stop_reason is None:
            self.journal.append(E.SignalSeen(signal=sig, world_rank=slot.world_rank, node=slot.node))
            self.request_stop(f"SIG{sig} delivered to the job's tasks (scancel, preemption or maintenance)", sig)

    def _exits_during_end(self, exits: list[tuple[int, int]]) -> None:
        """Slot processes that ended during a planned end are expected, not faults: note them only."""
        for w, pid in exits:
            s = self.slots.get(w)
            if s is not None and s.pid == pid:
                self.ending.exited.add(w)

