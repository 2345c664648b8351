"""The coordinator: the job's control plane, a separate process started by the batch script.

``python -m phoenix_hpc.control.coordinator --run-dir RUN_DIR``

It hosts the job's ``torch.distributed.TCPStore`` (``is_master``; the ranks' process groups rendezvous in
it under ``gen{g}/``) and the job's state: slots (world rank, node, pid, role, logical rank, lifecycle),
generation, rank map (logical -> world), shard map, per-shard committed steps, spare pool and the job
lifecycle. It talks to ranks with the signed messages of :mod:`phoenix_hpc.control.protocol`, writes
``RUN_DIR/journal.jsonl`` (:mod:`phoenix_hpc.control.journal`) and ``RUN_DIR/coordinator.json`` (atomically,
when ready), and keeps working while training processes die (it is not part of the srun step).

:class:`Coordinator` is the process around the decisions. Each decision is a pure function, or a small
class owning its state, that takes one input and returns the journal events and the commands
(:mod:`phoenix_hpc.control.commands`) it calls for; the coordinator decodes a message, dispatches it through
the table :data:`HANDLERS` (message type -> its one handler), journals the events first and carries out the
commands (sends, replies). The decisions:

- :mod:`phoenix_hpc.control.detect` (which slots are judged, whose heartbeats are overdue),
  :mod:`phoenix_hpc.control.admission` (who may register; what declaring slots dead means),
  :mod:`phoenix_hpc.control.ledger` (fault reports, the job's end), :mod:`phoenix_hpc.control.arbitration`
  (the action for the queued faults), :mod:`phoenix_hpc.control.recovery_phases` (a recovery's phase table
  and next step), :mod:`phoenix_hpc.control.evidence` (``evidence``: what the recovery checks compare with),
  :mod:`phoenix_hpc.control.injects` (``injects``), :mod:`phoenix_hpc.control.drains` (``drains``) and
  :mod:`phoenix_hpc.control.ending` (the planned end's final checkpoint).

What carries them out: this module (state, loop :meth:`Coordinator.run`: drain the messages, beat, tick; the
end of the job; the admission of every slot's message); the transport it holds, ``transport``
(:class:`~phoenix_hpc.control.messaging.Transport`: the store, the secret, send / reply / reject, carrying
out commands); the recorder, ``recorder`` (:class:`~phoenix_hpc.control.recorder.Recorder`: every event the
coordinator journals goes through :meth:`Coordinator.record`, which writes the line and applies it to
``view``, the journal's fold); the inbox, the operator channel, decode, replay guard and dispatch are
:mod:`~phoenix_hpc.control.messaging`'s plain functions; and plain functions of the coordinator: :mod:`~phoenix_hpc.control.recovery_machine`
(quiesce -> plan -> restore -> invariant check -> replay, docs/design.md section 6, with the fallback to the
persistent checkpoint), :mod:`~phoenix_hpc.control.membership` (registration, heartbeats, exits,
declaring slots dead), :mod:`~phoenix_hpc.control.handlers` (the training messages),
:mod:`~phoenix_hpc.control.planned_end`, :mod:`~phoenix_hpc.control.inject_relay`,
:mod:`~phoenix_hpc.control.drain_relay` and :mod:`~phoenix_hpc.control.restart` (a restarted coordinator,
``--restart N``, rebuilds its state from the journal's fold and takes the re-registering slots back). The
plain records are in :mod:`phoenix_hpc.control.records`.

The job ends (``job_done`` with the final hash) when every active rank reported ``done``; or on a ``stop``
message, SIGTERM (to the coordinator, or to a slot, which passes it on as ``signal``) or SIGUSR1 (time
limit): a planned end, which first writes the final checkpoint from the members' host snapshots
(:mod:`phoenix_hpc.control.planned_end`). It then tells every live slot ``stop`` and exits after their
instruction queues drained (bounded by ``linger_s``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import socket
import sys
import time
from collections import deque
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any, Callable, Mapping

from phoenix_hpc.control import drain_relay, handlers, inject_relay, membership, planned_end, restart
from phoenix_hpc.control import recovery_machine as recovery
from phoenix_hpc.control import events as E
from phoenix_hpc.control import protocol as P
from phoenix_hpc.control.classify import FaultKind
from phoenix_hpc.control.detect import detect, watched
from phoenix_hpc.control.ending import continue_hint
from phoenix_hpc.control.drains import DrainBook, PendingDrain
from phoenix_hpc.control.evidence import EvidenceBook
from phoenix_hpc.control.hold import hold_of
from phoenix_hpc.control.injects import InjectBook, fired_path
from phoenix_hpc.control.journal import Journal, ensure_private_dir, write_private_file
from phoenix_hpc.control.liveness import LivenessServer
from phoenix_hpc.control.loadstats import AgeWindow
from phoenix_hpc.control import messaging
from phoenix_hpc.control.messaging import Transport
from phoenix_hpc.control.operator import OperatorServer
from phoenix_hpc.control.pause import PauseMeter
from phoenix_hpc.control.recorder import Recorder
from phoenix_hpc.control.records import PendingFault, Recovery, Slot
from phoenix_hpc.control.settings import Timing, timing_from_run_dir  # noqa: F401 - re-exported
from phoenix_hpc.control.states import (
    LIVE_SLOT_STATES, TERMINAL_JOB_STATES, JobState, RecoveryPhase, SlotState, job_machine)
from phoenix_hpc.test_env import active_test_env


def _from_view(name: str, doc: str) -> property:
    """A field the coordinator reads from its view, the journal's fold (control/view.py), read only: it
    changes by recording the events that the fold applies (:meth:`Coordinator.record`)."""
    return property(lambda c: getattr(c.recorder.view, name), doc=doc)


def _on_transport(name: str) -> property:
    """A field the coordinator's transport owns (:class:`~phoenix_hpc.control.messaging.Transport`), read and
    set through the coordinator."""
    return property(lambda c: getattr(c.transport, name), lambda c, v: setattr(c.transport, name, v))


class Coordinator:
    """The control-plane state machine plus its store and journal. Single-threaded: :meth:`run` drains the
    inbox and runs periodic work (beat, detection, decisions, deadlines); handlers never block.

    Args:
        run_dir: the job's run directory (made 0700).
        grid: ``(tp, pp, dp)`` if known; otherwise taken from the first active registration.
        timing: heartbeat/collective timeouts and journal cadence.
        host: the address written to ``coordinator.json`` for ranks to connect to (default: this host's name).
        port: TCP port of the store (0: any free port).
        clock: monotonic seconds, injectable for tests.
        restart: 0 for the job's first coordinator; N for its N-th restart after a crash, which rebuilds the
            state from the journal (:mod:`phoenix_hpc.control.restart`).
    """

    handlers: Mapping[str, Callable[[Coordinator, dict], None]]  # message type -> handler: HANDLERS below
    next_job: str | None = None  # the job the chain queued to continue the run (cli/chain.py), if any (open())
    store = _on_transport("store")  # the job's TCPStore (server), after open()
    secret = _on_transport("secret")
    journal = _on_transport("journal")
    operator = _on_transport("operator")
    liveness = _on_transport("liveness")
    replay_guard = _on_transport("replay_guard")
    # read from the view (docs/design.md section 7): each changes by recording the events named
    generation = _from_view("generation", "The job's generation (the newest recovery_start; 0 before any).")
    rank_map = _from_view("rank_map", "logical -> world (registered, job_running, each recovery_plan).")
    rank_maps = _from_view("rank_maps", "generation -> its rank map (job_running, each recovery_plan).")
    grid_since = _from_view("grid_since", "generation -> the grid from then on (recovery_plan of a shrink).")
    placement_inputs = _from_view("placement_inputs", '{"k", "levels"} of the first registered naming them.')
    checkpoint_step = _from_view("newest_checkpoint", "The newest persistent checkpoint's step (checkpoint), or None.")

    def __init__(
        self,
        run_dir: str | os.PathLike,
        *,
        grid: tuple[int, int, int] | None = None,
        timing: Timing | None = None,
        host: str | None = None,
        port: int = 0,
        clock: Callable[[], float] = time.monotonic,
        restart: int = 0,
        test_hold: tuple[str, float] | None = None,
        test_env: Mapping[str, str] | None = None,
    ):
        self.restart = int(restart)
        self.test_hold = test_hold  # control/hold.py (tests only): (event, seconds) to hold after, once
        # the active test-only variables (phoenix_hpc/test_env.py) {name: value}, journalled at the start
        self.test_env = dict(test_env or {})
        self._rejoined: set[int] = set()  # world ranks re-registered after a restart
        self.run_dir = ensure_private_dir(run_dir)
        self.grid = grid
        self.t = timing or Timing()
        self.host = host or socket.gethostname()
        self.port = port
        self.clock = clock
        self.slots: dict[int, Slot] = {}
        self.committed: dict[str, dict[int, int]] = {}  # shard id -> {logical: step}
        self.protect_interval = 1  # protection interval m the ranks report with their commits (runtime/interval.py)
        self.placement: dict[str, list[int]] = {}  # shard id -> holder logical ranks (as reported)
        self.held: dict[int, tuple[tuple[str, ...], tuple[str, ...]]] = {}  # logical -> (shards, replicas) last reported
        # the owners' word and each generation's placement, evidence for the recovery checks (control/evidence.py)
        self.evidence = EvidenceBook()
        self.agreement = None  # the DP replicas' parameter digests (control/agreement.py AgreementBook)
        self.job = job_machine()
        self.faults: deque[PendingFault] = deque()
        self.recovery: Recovery | None = None
        self.restore_pending: set[int] = set()  # logical ranks whose restore was cut short
        self.done: dict[int, dict] = {}
        self.counters = {"accepted": 0, "rejected": 0, "heartbeats": 0, "heartbeat_messages": 0}
        # the one place an event is recorded: journalled, then folded into the view (control/recorder.py)
        self.recorder = Recorder()
        self.transport = Transport(self.counters, self.recorder)  # store, secret, send / reply / reject (messaging.py)
        self._last_commit_logged = -1
        self._last_commit_log_t = float("-inf")
        self._commit_dirty = False  # commit reports arrived since the recoverable step was last evaluated
        self._next_commit_eval = float("-inf")  # coordinator clock of the next evaluation (_tick)
        # coordinator clock at which a member first reported a step above 0 (None: training has not begun):
        # from then on every member has passed its set-up (_watched)
        self.training_since: float | None = None
        self._shard_ids_of: tuple[tuple | None, tuple[str, ...]] = (None, ())
        self._stop_reason: str | None = None
        self._stop_signal: str | None = None  # the external signal behind the stop (USR1, TERM), if any
        self.ending = None  # a planned end in progress (control/ending.py)
        self._end_at: float | None = None
        self._t_fault_hint: float | None = None
        self._last_summary = -1e18
        self._last_progress: tuple[int, int, int] | None = None  # (generation, min, max) step of the ACTIVE slots, journalled
        self._last_progress_t = -1e18
        self.pause: PauseMeter | None = None  # the coordinator's own pauses (control/pause.py), after open()
        self.injects = InjectBook()  # fault-injection requests by request id, and their rules (control/injects.py)
        self.drains = DrainBook()  # the newest planned drain and its rules (control/drains.py); also self.drain
        self.drained: set[int] = set()  # world ranks that left by a drain (DONE)
        self.drained_nodes: set[str] = set()  # nodes drained: no spare there takes a logical rank
        self.heartbeat_ages = AgeWindow()  # ages of heartbeats at handling, per summary window (loadstats.py)

    def record(self, event: E.Event, *, deferred: bool = False) -> dict:
        """Journal ``event`` and apply it to :attr:`view` (:meth:`~phoenix_hpc.control.recorder.Recorder.append`)."""
        return self.recorder.append(event, deferred=deferred)

    view = property(lambda c: c.recorder.view, doc="The journal's fold so far (control/view.py), kept by record.")

    def _drain_inbox(self) -> bool:
        """:func:`phoenix_hpc.control.messaging.drain_inbox`."""
        return messaging.drain_inbox(self)

    def _dispatch(self, body: dict) -> None:
        """:func:`phoenix_hpc.control.messaging.dispatch`."""
        messaging.dispatch(self, body)

    def open(self) -> None:
        """Create the secret, the journal and the store; write ``coordinator.json`` last (the readiness
        signal the batch script waits for)."""
        import torch.distributed as dist

        self.secret = P.new_secret(self.run_dir)
        self.recorder.open(Journal(self.run_dir), fold_existing=bool(self.restart))  # a restart continues the fold
        self.store = dist.TCPStore(
            "0.0.0.0", self.port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
        )
        self.port = self.store.port
        self.store.set(P.KEY_BEAT, "0")
        self.operator = OperatorServer()
        operator_port = self.operator.start()
        self.liveness = LivenessServer(self.secret)
        liveness_port = self.liveness.start()
        self.pause = PauseMeter(clock=self.clock)
        self.pause.start()
        from phoenix_hpc.control.run_jobs import job_entries, read_job, successor_of

        job_id = os.environ.get("SLURM_JOB_ID")
        self.next_job = successor_of(job_entries(read_job(self.run_dir)), job_id) if job_id else None
        self.record(E.CoordinatorStarted(
            host=self.host, port=self.port, pid=os.getpid(), job_id=job_id, next_job=self.next_job,
            heartbeat_interval_s=self.t.heartbeat_interval_s, heartbeat_timeout_s=self.t.heartbeat_timeout_s,
            grid=list(self.grid) if self.grid else None, **({"restart": self.restart} if self.restart else {})))
        if self.test_env:  # sbatch --export=ALL carries them from the submitting shell: say so (status shows it)
            self.record(E.TestEnv(variables=dict(self.test_env)))
        if self.restart:
            r = self._rebuild_from_journal()  # control/restart.py
            self.store.set("ctl/generation", str(self.generation))
            self.record(E.CoordinatorRestarted(
                restart=self.restart, generation=self.generation,
                job_state=self.job.state.value, recoverable_step=r.recoverable_step,
                checkpoint_step=r.newest_checkpoint, slots=len(self.slots),
                dead=sorted(w for w, s in self.slots.items() if s.state is SlotState.DEAD),
                recovery_interrupted=r.recovery is not None and r.recovery.phase is not RecoveryPhase.REPLAY,
                pending_faults=len(self.faults), **({"skipped": r.skipped[:20]} if r.skipped else {})))
        write_private_file(
            self.run_dir / P.COORDINATOR_FILE,
            _json({"host": self.host, "port": self.port, "operator_port": operator_port,
                   "liveness_port": liveness_port, "pid": os.getpid(),
                   "secret_file": P.SECRET_FILE, "protocol": P.PROTOCOL_VERSION, "restart": self.restart}),
        )

    def run(self, max_s: float | None = None) -> JobState:
        """Serve until the job ends (done, failed, stopped) and the slots' queues drained. Returns the final
        job state."""
        t0 = self.clock()
        next_beat = next_tick = 0.0
        while True:
            now = self.clock()
            if self._stop_reason and self.job.state not in TERMINAL_JOB_STATES:
                planned_end.maybe_begin_end(self, now)  # the final checkpoint, then the end
            self._account_pause()  # before anything is judged, also while the job ends
            busy = self._drain_inbox()
            busy = messaging.drain_operator(self) or busy
            busy = membership.drain_exits(self) or busy
            now = self.clock()
            if busy:
                recovery.advance_on_answers(self, now)
            if now >= next_beat:
                self.store.add(P.KEY_BEAT, 1)
                next_beat = now + self.t.heartbeat_interval_s / 2
            if now >= next_tick:
                self._tick(now)
                next_tick = now + self.tick_s
            self.transport.ring()
            if self._end_at is not None:
                if now >= self._end_at:
                    break
                if self._queues_drained():  # give the slots a moment to finish reading, then go
                    self._end_at = min(self._end_at, now + 0.5)
            if max_s is not None and now - t0 > max_s:
                self.request_stop(f"max_s={max_s} reached")
            if not busy:
                time.sleep(0.01)
        self.record(E.CoordinatorExit(job_state=self.job.state.value))
        return self.job.state

    @property
    def tick_s(self) -> float:
        """Seconds between two runs of the periodic tick (detection, decisions, deadlines):
        ``min(0.1, heartbeat_interval_s / 4)``. A recovery is planned no sooner than this after it started
        (:func:`~phoenix_hpc.control.recovery_machine.advance_on_answers`)."""
        return min(0.1, self.t.heartbeat_interval_s / 4)

    def close(self) -> None:
        if self.pause is not None:
            self.pause.close()
        if self.operator is not None:
            self.operator.close()
        if self.liveness is not None:
            self.liveness.close()
        if self.journal:
            self.journal.close()
        self.store = None  # the TCPStore server stops when the object is collected

    def _account_pause(self) -> None:
        """Time in which this process did not run (stopped, starved; :mod:`phoenix_hpc.control.pause`) is not
        the slots' silence: move their last-seen times, pending faults and the recovery deadline forward."""
        if self.pause is None:
            return
        self.pause.observe()
        gap = self.pause.take()
        if gap <= 0:
            return
        for s in self.slots.values():
            s.last_seen += gap
        for p in self.faults:
            p.t += gap
        if self.recovery is not None:
            self.recovery.deadline += gap
        if gap >= 1.0:
            self.record(E.CoordinatorPaused(paused_s=round(gap, 3),
                                            reason="this process did not run (stopped or starved of CPU); the slots' "
                                                   "silence during it is not counted"))

    def _watched(self, now: float) -> dict[int, float]:
        """The slots whose heartbeats are judged now, with the time their silence counts from
        (:func:`phoenix_hpc.control.detect.watched`: the start-up grace)."""
        return watched(now, self.slots, grace_s=self.t.startup_grace_s, training_since=self.training_since,
                       live_states=LIVE_SLOT_STATES)

    # --- evidence for the recovery checks (control/evidence.py EvidenceBook) ---------------------------------
    def _record_sent(self, slot: Slot, g: int, sent: Any, body: dict) -> None:
        """Keep an owner's replica statement; a malformed one, or one for a shard it does not own, is rejected
        (journalled once, no reply)."""
        bad = self.evidence.record_sent(world_rank=slot.world_rank, logical_rank=slot.logical_rank, grid=self.grid,
                                        g=g, sent=sent)
        if bad is not None:
            self.transport.reject(bad[0], body, key=bad[1], reply=False)

    def _placements(self, before: int) -> dict[tuple[str, int], frozenset[int]]:
        """Each generation's recomputed replica placement before ``before`` (EvidenceBook.placements)."""
        if not self.grid:
            return {}
        return self.evidence.placements(before, placement_inputs=self.placement_inputs, grid_of=partial(recovery.grid_of, self),
                                        slots=self.slots, rank_maps=self.rank_maps)

    def _expected(self, rec: Recovery) -> Any:
        """What the recovery checks compare the members' evidence with (EvidenceBook.expected)."""
        return self.evidence.expected(rec, grid=self.grid, placement=self._placements(before=rec.generation),
                                      rank_maps=self.rank_maps)

    def _holder_of(self, owners: list[int]) -> tuple[tuple[int, str] | None, str]:
        """A live holder of the first owner's shard, for a corrupt-replica injection (EvidenceBook.holder_of)."""
        return self.evidence.holder_of(owners, rank_map=self.rank_map, grid=self.grid, generation=self.generation,
                                       slots=self.slots, placement=lambda: self._placements(before=self.generation + 1))

    # --- the admission of every slot's message (control/membership.py, control/admission.py) ----------------
    def _slot_of(self, body: dict, what: str) -> Slot | None:
        """The registered, live slot that sent ``body`` (its world rank and pid), or None after rejecting the
        message (journalled once per distinct reason); a dead slot is fenced again."""
        w = int(body["world_rank"])
        slot = self.slots.get(w)
        if slot is None:
            self.transport.reject(f"{what} from unregistered world rank {w}", body, key=(what, "unregistered", w))
            return None
        if int(body.get("pid", slot.pid)) != slot.pid:
            self.transport.reject(f"{what} for world rank {w} from pid {body.get('pid')}, registered pid is {slot.pid}", body,
                         key=(what, "pid", w))
            return None
        if slot.state is SlotState.DEAD:
            self.transport.reject(f"{what} from world rank {w}, which was declared dead (fenced; it must exit)", body,
                         key=(what, "dead", w))
            self._fence(w, "this slot was declared dead earlier (fenced)")
            return None
        return slot

    def _gen_ok(self, slot: Slot, g: Any, what: str, body: dict) -> bool:
        """Whether ``body`` of ``slot`` speaks of a generation it may (not a future one, not one older than the
        slot's); else the message is rejected."""
        if g is None and slot.state in (SlotState.STANDBY, SlotState.JOINING):
            return True  # a spare has no generation until its restore completes
        g = int(g)
        if g > self.generation:
            self.transport.reject(f"{what} from world rank {slot.world_rank} with future generation {g} "
                         f"(current {self.generation})", body, key=(what, "future", slot.world_rank, g))
            return False
        if g < slot.generation:
            self.transport.reject(f"{what} from world rank {slot.world_rank} with stale generation {g} "
                         f"(slot is at {slot.generation}, job at {self.generation})", body,
                         key=(what, "stale", slot.world_rank, g))
            return False
        return True

    def _fence(self, w: int, reason: str) -> None:
        """Tell slot ``w``, declared dead, to exit (``stop`` with ``job_state`` fenced). A slot may be declared
        dead while its process lives (a GPU error, a hang, a lost link, a missed heartbeat): a member that
        reads it leaves at once, frees its node's GPU and memory, and writes ``ranks/fenced-world{w}.json``,
        never the summary of the logical rank a spare holds now (launch/rank.py). A process that is gone, or
        blocked (a lost link in a drill), never reads it; the message is harmless there."""
        self.transport.send(w, {"type": "stop", "reason": reason, "job_state": "fenced"})

    def _rebuild_from_journal(self) -> Any:
        """Take the job's state from the journal's fold (a restarted coordinator; control/restart.py)."""
        return restart.rebuild_from_journal(self)

    def _declare_dead(self, worlds: list[int], kind: FaultKind, reason: str, now: float) -> None:
        """Declare slots ``worlds`` dead (:func:`phoenix_hpc.control.membership.declare_dead`)."""
        membership.declare_dead(self, worlds, kind, reason, now)

    def request_stop(self, reason: str, signal: str | None = None) -> None:
        """Ask the loop to end the job (thread- and signal-safe: only sets fields). ``signal``: the external
        signal behind it (``USR1`` time limit, ``TERM``), journalled with the end."""
        if signal is not None and self._stop_signal is None:
            self._stop_signal = signal
        self._stop_reason = reason

    @property
    def drain(self) -> PendingDrain | None:
        """The newest planned drain (None before the first; control/drains.py)."""
        return self.drains.current

    def _is_live(self, w: int) -> bool:
        """Whether slot ``w`` is expected to be alive (a live state)."""
        return self.slots[w].state in LIVE_SLOT_STATES

    def _has_fired(self, request_id: str, w: int) -> bool:
        """Whether slot ``w`` wrote the landing record of injection ``request_id`` (it does so before the effect)."""
        return fired_path(self.run_dir, request_id, w).exists()

    def _hold_after(self, event: str) -> None:
        """The test-only hold of :mod:`phoenix_hpc.control.hold` after ``event``, once: ring what is queued,
        journal ``test_hold``, sleep."""
        if self.test_hold is None or self.test_hold[0] != event:
            return
        _, secs = self.test_hold
        self.test_hold = None
        self.transport.ring()
        self.record(E.TestHold(after=event, hold_s=secs))
        time.sleep(secs)

    def _note_step(self, slot, step: int) -> None:
        """Take a slot's reported live ``step``; the first step above 0 of a member starts
        :attr:`training_since`. O(1)."""
        slot.step = step
        if step > 0 and self.training_since is None and slot.logical_rank is not None:
            self.training_since = self.clock()

    def _tick(self, now: float) -> None:
        if self.job.state in TERMINAL_JOB_STATES:
            return
        self.transport.carry_out(self.injects.tick(now, live=self._is_live))
        self.transport.carry_out(self.drains.tick(now, live=self._is_live))
        # commit reports arrived: the recoverable step may have advanced. It is an O(ranks) scan, so at most
        # twice per heartbeat interval (the reports come with the heartbeats, once per interval and node)
        if self._commit_dirty and now >= self._next_commit_eval:
            self._commit_dirty = False
            self._next_commit_eval = now + self.t.heartbeat_interval_s / 2
            handlers.maybe_log_commit(self)
        if self.ending is not None:  # members leave on purpose: no detection, no decisions
            return planned_end.advance_end(self, now)
        self._account_pause()
        dead, reason = detect(now, self._watched(now), self.t)
        if dead:
            self._declare_dead(list(dead), FaultKind.HEARTBEAT_TIMEOUT, reason, now)
        if self.recovery is not None:
            recovery.advance_recovery(self, now)
        if self.recovery is None and self.faults and self.job.state in (JobState.RUNNING,):
            recovery.decide(self, now)
        if now - self._last_progress_t >= self.t.progress_interval_s:
            # live progress for ``phoenix status``: the steps the ACTIVE slots last reported (heartbeats)
            steps = [s.step for s in self.slots.values() if s.state is SlotState.ACTIVE]
            span = (self.generation, min(steps), max(steps)) if steps else None
            if span is not None and span != self._last_progress:
                self._last_progress, self._last_progress_t = span, now
                self.record(E.Progress(step=span[2], min_step=span[1], generation=self.generation))
        if now - self._last_summary >= self.t.summary_interval_s:
            self._last_summary = now
            self.record(E.HeartbeatSummary(
                generation=self.generation, job_state=self.job.state.value,
                active=sorted(w for w, s in self.slots.items() if s.state in (SlotState.ACTIVE, SlotState.QUIESCED, SlotState.JOINING)),
                standby=sorted(w for w, s in self.slots.items() if s.state is SlotState.STANDBY),
                dead=sorted(w for w, s in self.slots.items() if s.state is SlotState.DEAD),
                max_step=max((s.step for s in self.slots.values()), default=0), **self.counters,
                heartbeat_age=self.heartbeat_ages.take(), cpu_s=round(time.process_time(), 3)))

    def _end(self, state: JobState, event: E.JobEnd) -> None:
        if state is not JobState.DONE and not event.message:  # every early end names how to go on
            event = dataclasses.replace(event, message=(f"{event.reason or event.NAME}. To continue: "
                                                        f"{continue_hint(str(self.run_dir), self.next_job)}"))
        if self.job.state not in TERMINAL_JOB_STATES:
            self.job.to(state, event.NAME)
        self.record(event)
        self.transport.carry_out(self.injects.at_end(state, live=self._is_live, has_fired=self._has_fired))
        self.transport.carry_out(self.drains.missed(f"the job ended ({state.value})", live=self._is_live))
        reason = event.message or event.reason or event.NAME
        for w, s in sorted(self.slots.items()):
            if s.state in LIVE_SLOT_STATES:
                self.transport.send(w, {"type": "stop", "reason": str(reason), "job_state": state.value})
        self._end_at = self.clock() + self.t.linger_s

    def _queues_drained(self) -> bool:
        return all(self.store.queue_len(P.key_out(w)) == 0 for w, s in self.slots.items()
                   if s.state in LIVE_SLOT_STATES)


# The message dispatch table: each request type of the protocol (control/protocol.py) and of the slots'
# reports -> its one handler. A type not in it is rejected and journalled (messaging.dispatch).
HANDLERS: Mapping[str, Callable[[Coordinator, dict], None]] = {
    "register": membership.on_register,
    "heartbeat": membership.on_heartbeat,
    "heartbeats": membership.on_heartbeats,
    "commit": handlers.on_commit,
    "checkpoint": handlers.on_checkpoint,
    "fault": handlers.on_fault,
    "done": handlers.on_done,
    "stop": handlers.on_stop,
    "quiesced": recovery.on_quiesced,
    "recovered": recovery.on_recovered,
    "inject": inject_relay.on_inject,
    "inject_ack": inject_relay.on_inject_ack,
    "inject_fired": inject_relay.on_inject_fired,
    "drain": drain_relay.on_drain,
    "drain_ack": drain_relay.on_drain_ack,
    "drain_reached": drain_relay.on_drain_reached,
    "stopping": planned_end.on_stopping,
    "shard_written": planned_end.on_shard_written,
    "signal": planned_end.on_signal,
}
Coordinator.handlers = HANDLERS


def _json(d: dict) -> str:
    import json

    return json.dumps(d, indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Entry point. Exit codes: see :func:`exit_code_of` (also written to ``RUN_DIR/job_exit_status`` before
    the process tears down, which the batch script reads); 2 bad input."""
    from phoenix_hpc.errors import PhoenixError

    ap = argparse.ArgumentParser(prog="python -m phoenix_hpc.control.coordinator", description=__doc__.split("\n")[0])
    ap.add_argument("--run-dir", required=True, help="the job's run directory (config.yaml is read from it)")
    ap.add_argument("--host", default=None, help="address ranks use to reach the store (default: hostname)")
    ap.add_argument("--port", type=int, default=0, help="store port (default: any free port)")
    ap.add_argument("--summary-interval-s", type=float, default=None, help="heartbeat summary cadence")
    ap.add_argument("--restart", type=int, default=0,
                    help="N-th restart after a crash: rebuild the state from the journal (default 0: a new job)")
    args = ap.parse_args(argv)
    run_dir = Path(args.run_dir)
    try:
        timing, grid = timing_from_run_dir(run_dir)
    except PhoenixError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.summary_interval_s:
        timing.summary_interval_s = args.summary_interval_s
    try:  # every test-only variable (phoenix_hpc/test_env.py), before anything is written or started
        test_env = active_test_env(os.environ)
        test_hold = hold_of(os.environ, args.restart)  # the test-only hold variable (control/hold.py)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    coord = Coordinator(run_dir, grid=grid, timing=timing, host=args.host, port=args.port, restart=args.restart,
                        test_hold=test_hold, test_env=test_env)
    coord.open()
    signal.signal(signal.SIGTERM, lambda *_: coord.request_stop("SIGTERM to the batch script (scancel, preemption)", "TERM"))
    signal.signal(signal.SIGINT, lambda *_: coord.request_stop("SIGINT", "INT"))
    signal.signal(signal.SIGUSR1, lambda *_: coord.request_stop("time limit (SIGUSR1 before the limit)", "USR1"))
    print(f"[coordinator] serving on {coord.host}:{coord.port} pid {os.getpid()}", file=sys.stderr, flush=True)
    try:
        state = coord.run()
        # the verdict as a file too: a process status can still be lost in teardown (store, threads)
        write_private_file(run_dir / P.EXIT_STATUS_FILE, f"{exit_code_of(state)}\n")
    finally:
        coord.close()
    return exit_code_of(state)


EXIT_DONE, EXIT_FAILED, EXIT_STOPPED = 0, 1, 3


def exit_code_of(state: JobState) -> int:
    """The coordinator's exit status, which the batch script makes the job's: 0 the training finished
    (``job_done``, also after recoveries), 1 it failed (clean stop, no recovery possible), 3 it was stopped
    before its end (time limit, ``stop`` request, SIGTERM). Pure."""
    if state is JobState.DONE:
        return EXIT_DONE
    return EXIT_FAILED if state is JobState.FAILED else EXIT_STOPPED


if __name__ == "__main__":
    sys.exit(main())
