"""A planned end of a job: the final checkpoint written from the ranks' host snapshots (docs/design.md
section 7, "Planned ends").

A planned end is one the job is told about rather than one it suffers: Slurm's warning before the time
limit (``--signal=B:USR1@s``, forwarded by the batch shell to the coordinator), SIGTERM (``scancel``,
preemption, maintenance: to the coordinator, or to the ranks, which pass it on), or a ``stop`` request
(``phoenix`` commands). The coordinator then runs two rounds with the members of the current generation:

1. ``stop`` {reason, ``checkpoint: true``} to every member. Each member leaves training at once (at its
   next step boundary, or when the collective it is blocked in fails because a peer already left and freed
   its groups), closes its runtime protector without waiting on peers, and answers ``stopping``
   {world_rank, pid, steps: the steps of its verified host snapshots, newest first}.
2. The coordinator picks the newest step every member holds (:func:`choose_step`) and sends
   ``write_checkpoint`` {step}. Each member writes its shard of that step from the host snapshot it
   already holds (file I/O only, no training step, no collective) and answers ``shard_written``
   {step, file, sha256, bytes, write_s} or {step, error}.

When every shard is reported, the coordinator marks the checkpoint complete (``complete.json``, then
``latest``; :func:`phoenix_hpc.recovery.ckpt_files.mark_complete`), journals ``checkpoint`` {step, path,
source: "final", write_s} and ends the job (``coordinator_stopped`` naming the checkpoint and the command
that resumes it). A member that does not answer within the round's deadline, or fails to write, leaves the
checkpoint incomplete (``checkpoint_incomplete``): it is never loaded. Nothing is written when the newest
complete checkpoint on disk is already at that step or newer.

This module holds the state of one planned end (:class:`PlannedEnd`, which takes the members' answers) and
its decisions, each returning the journal events and the commands to carry out
(:class:`~phoenix_hpc.control.commands.Outcome`): :func:`begin_end` (the ``stop`` round),
:func:`after_round` (once a round is over: the ``write_checkpoint`` round, or the end with or without a
checkpoint) and :func:`completed` (the events of a checkpoint marked complete), with the rules they use
(:func:`no_final_checkpoint`: whether the end writes one at all; :func:`after_stop_round`: which step it
writes, or why none). :mod:`phoenix_hpc.control.planned_end` journals and carries them out, and does the file
work (marking the checkpoint complete, pruning).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from phoenix_hpc.control import events as E
from phoenix_hpc.control.commands import Outcome, Send
from phoenix_hpc.recovery.steps import newest_common_step


def choose_step(copies: dict[int, list[int]]) -> int | None:
    """The newest step of which every member holds a verified host snapshot (``copies``: world rank ->
    steps), or None when there is no such step (or no member). Pure."""
    return newest_common_step(copies)


def resume_hint(run_dir: str) -> str:
    """The command that continues a run from its newest complete checkpoint (the path shell-quoted)."""
    return f"phoenix submit --resume {shlex.quote(run_dir)}"


def continue_hint(run_dir: str, next_job: str | None) -> str:
    """How the run goes on after this job: the chain's queued job (``resources.chain``) when there is one,
    and the command that resumes it by hand. Pure."""
    if next_job is None:
        return resume_hint(run_dir)
    return (f"job {next_job}, queued by the chain, continues the run from the newest complete checkpoint when this "
            f"job has ended (to continue by hand instead: scancel {next_job}; {resume_hint(run_dir)})")


@dataclass
class PlannedEnd:
    """One planned end in progress (coordinator clock, seconds).

    ``members``: world ranks of the current generation; ``phase``: ``stop`` (waiting for ``stopping``)
    then ``write`` (waiting for ``shard_written``); ``exited``: members whose process ended meanwhile.
    """

    reason: str
    signal: str | None
    members: set[int]
    t_start: float
    deadline: float
    phase: str = "stop"
    copies: dict[int, list[int]] = field(default_factory=dict)
    written: dict[int, dict] = field(default_factory=dict)
    exited: set[int] = field(default_factory=set)
    step: int | None = None
    t_write: float = 0.0

    def missing(self) -> list[int]:
        """Members that have not answered the current round."""
        got = self.copies if self.phase == "stop" else self.written
        return sorted(self.members - set(got))

    def round_over(self, now: float) -> bool:
        """Every member answered, or one that has not answered exited, or the deadline passed."""
        missing = self.missing()
        return not missing or bool(set(missing) & self.exited) or now > self.deadline

    def take_stopping(self, world_rank: int, steps: list[int]) -> bool:
        """A member's ``stopping`` answer (the steps of its verified host snapshots). False (ignored) outside
        the ``stop`` round or from a slot that is no member of this end."""
        if self.phase != "stop" or world_rank not in self.members:
            return False
        self.copies[world_rank] = [int(s) for s in steps]
        return True

    def take_written(self, world_rank: int, body: dict) -> bool:
        """A member's ``shard_written`` answer (``body``: file, sha256, bytes, write_s, or error). A shard of
        another step than the one asked for counts as an error. False (ignored) outside the ``write`` round or
        from a slot that is no member of this end."""
        if self.phase != "write" or world_rank not in self.members:
            return False
        if int(body.get("step", -1)) != self.step and not body.get("error"):
            body = {"error": f"wrote step {body.get('step')}, asked for {self.step}"}
        self.written[world_rank] = body
        return True

    def files(self) -> dict[str, dict]:
        """The written shards: file name -> {sha256, bytes} (what ``complete.json`` lists)."""
        return {b["file"]: {"sha256": b["sha256"], "bytes": int(b["bytes"])} for b in self.written.values()}

    def write_s(self) -> float:
        """The slowest member's write time (seconds), 0 when none reported one."""
        return max((float(b.get("write_s", 0.0)) for b in self.written.values()), default=0.0)

    def failures(self) -> list[str]:
        """Why the checkpoint cannot be complete (empty when every member wrote its shard)."""
        out = [f"world rank {w}: {b['error']}" for w, b in sorted(self.written.items()) if b.get("error")]
        out += [f"world rank {w}: no answer" + (" (its process exited)" if w in self.exited else "")
                for w in self.missing()]
        return out


def no_final_checkpoint(*, final_checkpoint: bool, checkpoint_path: str | None, job_state: str, active_members: int,
                        members: int) -> str | None:
    """Why a planned end writes no final checkpoint (the note of ``coordinator_stopped``), or None when it
    runs the two rounds. ``final_checkpoint``: the job's mode writes one (phoenix); ``job_state``: the job
    state's value (``running`` is required); ``active_members``: members of the rank map that are ACTIVE,
    of ``members``. Pure."""
    if final_checkpoint and checkpoint_path and job_state == "running" and active_members == members and members:
        return None
    return "no final checkpoint: " + (
        "the job has no persistent checkpoints (resilience.mode is not phoenix)" if not final_checkpoint
        else f"the job is {job_state}" if job_state != "running"
        else "not every member is active")


def after_stop_round(end: PlannedEnd, on_disk: int | None) -> tuple[int | None, str]:
    """After the ``stop`` round: ``(step, "")`` to write the final checkpoint of ``step``, or ``(None,
    note)`` to end without one (``note`` says why: a member without an answer, no step every member holds,
    or ``on_disk``, the newest complete checkpoint, already at that step or newer). Pure."""
    step = choose_step(end.copies) if not end.missing() else None
    if step is None:
        why = ("members without an answer: " + "; ".join(end.failures())) if end.missing() else \
            f"no step held in host memory by every member ({end.copies})"
        return None, f"no final checkpoint: {why}"
    if on_disk is not None and step <= on_disk:
        return None, (f"no final checkpoint needed: step {on_disk} is on disk, the newest step in host memory "
                      f"is {step}")
    return step, ""


@dataclass(frozen=True)
class EndStep:
    """What a planned end does once a round is over (:func:`after_round`): journal ``out.events`` and carry out
    ``out.commands``; then, with ``stop``, end the job STOPPED naming ``(checkpoint step or None, note)``; with
    ``write_complete``, mark the final checkpoint of ``end.step`` complete (file work) and journal
    :func:`completed`'s events before ending the job."""

    out: Outcome
    stop: tuple[int | None, str] | None = None
    write_complete: bool = False


def begin_end(*, reason: str, signal: str | None, members: set[int], generation: int, now: float,
              round_s: float) -> tuple[PlannedEnd, Outcome]:
    """Start a planned end that writes a final checkpoint (:func:`no_final_checkpoint` said it does): its state,
    and the ``stopping`` record and a ``stop`` to every member (``members``: world ranks, ``round_s``: how long
    the round waits, seconds; coordinator clock). Pure."""
    end = PlannedEnd(reason, signal, set(members), now, now + round_s)
    return end, Outcome([E.Stopping(reason=reason, signal=signal, members=sorted(members), generation=generation)],
                        [Send(w, {"type": "stop", "reason": reason, "checkpoint": True, "generation": generation})
                         for w in sorted(members)])


def after_round(end: PlannedEnd, now: float, *, on_disk: int | None, generation: int,
                write_timeout_s: float) -> EndStep:
    """The next step of ``end`` once its round is over (:meth:`PlannedEnd.round_over`; the caller checks it,
    so that ``on_disk``, the newest complete checkpoint, is looked up only then). After the ``stop`` round: the
    ``write_checkpoint`` round of :func:`after_stop_round`'s step (``end`` moves to phase ``write``, deadline
    ``now + write_timeout_s``), or the end without a checkpoint. After the ``write`` round: the end, with a
    ``checkpoint_incomplete`` record when a shard is missing or failed, or ``write_complete``. Mutates only
    ``end``."""
    if end.phase == "stop":
        step, note = after_stop_round(end, on_disk)
        if step is None:
            return EndStep(Outcome.none(), stop=(on_disk, note))
        end.phase, end.step, end.t_write, end.deadline = "write", step, now, now + write_timeout_s
        return EndStep(Outcome([], [Send(w, {"type": "write_checkpoint", "step": step, "generation": generation})
                                    for w in sorted(end.members)]))
    fails = end.failures()
    if fails:
        return EndStep(Outcome([E.CheckpointIncomplete(step=end.step, reasons=fails)], []),
                       stop=(on_disk, f"final checkpoint of step {end.step} incomplete: " + "; ".join(fails)))
    return EndStep(Outcome.none(), write_complete=True)


def completed(end: PlannedEnd, path: str, now: float, *, pruned: list[int], keep: int) -> tuple[list[E.Event], str]:
    """The records of a final checkpoint marked complete at ``path`` (``pruned``: the older checkpoints deleted
    to keep ``keep``), and the note of the job's end. Pure."""
    files = end.files()
    events: list[E.Event] = [E.CheckpointsPruned(steps=pruned, keep=keep)] if pruned else []
    events.append(E.Checkpoint(step=end.step, path=path, source="final", write_s=round(end.write_s(), 3),
                               total_s=round(now - end.t_start, 3), bytes=sum(f["bytes"] for f in files.values())))
    return events, f"final checkpoint of step {end.step} written"
