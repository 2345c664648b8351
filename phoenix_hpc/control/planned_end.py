"""The coordinator's side of a planned end (protocol, state and pure decisions in
:mod:`phoenix_hpc.control.ending`).

Plain functions of the coordinator ``c`` that carry the decisions out (journal the events, send, do the file
work): :func:`maybe_begin_end` (the loop, while a stop is requested), :func:`advance_end` (the tick, during the
end), and the handlers of ``stopping``, ``shard_written`` and ``signal`` (a slot that received SIGTERM passes
it on). They use the coordinator's slots, rank map, transport, ``_slot_of``/``_end`` and its timing.
"""

from __future__ import annotations

from typing import Any

from phoenix_hpc.control import events as E
from phoenix_hpc.control import recovery_machine
from phoenix_hpc.control.commands import Outcome
from phoenix_hpc.control.ending import after_round, begin_end, completed, continue_hint, no_final_checkpoint
from phoenix_hpc.control.recovery_phases import ANSWERING
from phoenix_hpc.control.states import TERMINAL_JOB_STATES, JobState, RecoveryPhase, SlotState


def round_timeout_s(c: Any) -> float:
    """How long one round of the planned end waits for the members (seconds)."""
    return c.t.collective_timeout_s + c.t.heartbeat_timeout_s


def maybe_begin_end(c: Any, now: float) -> None:
    """Called every loop turn while a stop is requested and the job has not ended."""
    if c.ending is not None:
        return
    rec = c.recovery
    if rec is not None and RecoveryPhase(rec.phase) in ANSWERING and now <= rec.deadline:
        return  # let the recovery finish (bounded by its own deadline); the members are in no state to write
    members = {w for w in c.rank_map.values() if c.slots[w].state is SlotState.ACTIVE}
    why = no_final_checkpoint(final_checkpoint=c.t.final_checkpoint, checkpoint_path=c.t.checkpoint_path,
                              job_state=c.job.state.value, active_members=len(members),
                              members=len(c.rank_map))
    if why is not None:
        end_stopped(c, None, why)
        return
    c.ending, out = begin_end(reason=c._stop_reason, signal=c._stop_signal, members=members,
                              generation=c.generation, now=now, round_s=round_timeout_s(c))
    c.transport.carry_out(out)


def advance_end(c: Any, now: float) -> None:
    """Called by the tick during a planned end: once a round is over, the next round or the end."""
    end = c.ending
    if not end.round_over(now):
        return
    nxt = after_round(end, now, on_disk=recovery_machine.newest_checkpoint(c), generation=c.generation,
                      write_timeout_s=c.t.final_write_timeout_s)
    c.transport.carry_out(nxt.out)
    if nxt.stop is not None:
        return end_stopped(c, *nxt.stop)
    if not nxt.write_complete:
        return
    from phoenix_hpc.recovery.ckpt_files import mark_complete, prune

    path = mark_complete(c.t.checkpoint_path, end.step, "snapshot", grid=list(c.grid), files=end.files(),
                         generation=c.generation, write_s=round(end.write_s(), 3),
                         **({"lr_scheduler": c.t.lr_scheduler} if c.t.lr_scheduler is not None else {}))
    events, note = completed(end, str(path), now, pruned=prune(c.t.checkpoint_path, c.t.checkpoint_keep),
                             keep=c.t.checkpoint_keep)
    c.transport.carry_out(Outcome(events, []))
    end_stopped(c, end.step, note)


def end_stopped(c: Any, checkpoint_step: int | None, note: str) -> None:
    """End the job STOPPED (``coordinator_stopped``), naming the newest complete checkpoint and how to go on."""
    reason = c._stop_reason or "stop requested"
    hint = continue_hint(str(c.run_dir), c.next_job)
    ck = (f"newest complete checkpoint: step {checkpoint_step} under {c.t.checkpoint_path}"
          if checkpoint_step is not None else "no complete checkpoint: resuming starts the training over")
    c._end(JobState.STOPPED, E.CoordinatorStopped(reason=reason, signal=c._stop_signal, checkpoint_step=checkpoint_step,
                                                  checkpoint_path=c.t.checkpoint_path, note=note,
                                                  message=f"{reason}; {note}; {ck}. To continue: {hint}"))


# --- handlers (entries of the coordinator's dispatch table) -------------------------------------------------
def on_stopping(c: Any, body: dict) -> None:
    """A member left training for the planned end and names the steps of its host snapshots."""
    slot = c._slot_of(body, "stopping")
    if slot is not None and c.ending is not None and c.ending.take_stopping(slot.world_rank, body.get("steps", [])):
        slot.last_seen = c.clock()


def on_shard_written(c: Any, body: dict) -> None:
    """A member wrote its shard of the final checkpoint (or failed to)."""
    slot = c._slot_of(body, "shard_written")
    if slot is not None and c.ending is not None and c.ending.take_written(slot.world_rank, body):
        slot.last_seen = c.clock()


def on_signal(c: Any, body: dict) -> None:
    """A slot received a signal meant for the job (SIGTERM from ``scancel --signal=TERM`` or preemption,
    which Slurm delivers to the step's tasks, not to the batch shell): end the job as planned."""
    slot = c._slot_of(body, "signal")
    if slot is None or c.job.state in TERMINAL_JOB_STATES:
        return
    sig = str(body.get("signal", "TERM"))
    if c._stop_reason is None:
        c.record(E.SignalSeen(signal=sig, world_rank=slot.world_rank, node=slot.node))
        c.request_stop(f"SIG{sig} delivered to the job's tasks (scancel, preemption or maintenance)", sig)


def exits_during_end(c: Any, exits: list[tuple[int, int]]) -> None:
    """Slot processes that ended during a planned end are expected, not faults: note them only."""
    for w, pid in exits:
        s = c.slots.get(w)
        if s is not None and s.pid == pid:
            c.ending.exited.add(w)
