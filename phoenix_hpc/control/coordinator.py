"""The coordinator: the job's control plane, a separate process started by the batch script.

``python -m phoenix_hpc.control.coordinator --run-dir RUN_DIR``

It hosts the job's ``torch.distributed.TCPStore`` (``is_master``; the ranks' process groups rendezvous in
it under ``gen{g}/``) and the job's state: slots (world rank, node, pid, role, logical rank, lifecycle),
generation, rank map (logical -> world), shard map, per-shard committed steps, spare pool and the job
lifecycle. It talks to ranks with the signed messages of :mod:`phoenix_hpc.control.protocol`, writes
``RUN_DIR/journal.jsonl`` (:mod:`phoenix_hpc.control.journal`) and ``RUN_DIR/coordinator.json`` (atomically,
when ready), and keeps working while training processes die (it is not part of the srun step).

Detection: heartbeats (:func:`phoenix_hpc.control.detect.detect`, interval/timeout from
``resilience``), fault reports from inside the step (collective timeouts and errors, exceptions), and
replies missing past a deadline during a recovery. Classification: :mod:`phoenix_hpc.control.classify`.
Collective errors are only called transient once every active slot has heartbeated *after* the report
(proof that all processes are alive); a slot that goes silent instead turns the fault into a hot swap.

Recovery (one at a time; faults arriving meanwhile are queued), docs/design.md section 6:

1. ``recovery_start``: bump the generation, mark dead slots DEAD, send ``quiesce`` to the survivors;
2. each survivor stops (abandoning a partial step) and answers ``quiesced`` with its live step and the
   committed steps of the shards and replicas it holds;
3. the pure plan (:func:`phoenix_hpc.recovery.plan.plan_recovery`) picks spares, the recoverable step and
   the transfers; ``recover`` {plan} goes to every member of the new generation (spares: STANDBY ->
   JOINING, idempotent);
4. members rebuild groups, restore, roll back, and answer ``recovered`` with a
   :class:`~phoenix_hpc.recovery.invariants.MemberReport` and their phase timings;
5. I1-I4 are checked (violation: journal + stop every slot, job FAILED); then ``resume`` and, once the
   members are past the replayed steps, ``recovery_done`` {total_s, phases, steps_replayed}.

If a member of the recovery dies before it completes, the recovery is aborted and re-planned with the
queued fault (spares whose restore was cut short are restored again in place). When memory cannot cover the
loss the plan raises :class:`~phoenix_hpc.recovery.plan.FallbackRequired`. With a persistent checkpoint and
enough spares the recovery goes on as an in-job restart from it
(:func:`~phoenix_hpc.recovery.plan.plan_checkpoint_restart`; journal ``checkpoint_restart`` {reason,
lost_shards, checkpoint_step, lost_steps, checkpoint_path}; every member of the new generation loads the
checkpoint and the lost steps are trained again). Otherwise the job enters FALLBACK and stops (``fallback``
{reason, message, checkpoint_step, lost_steps, checkpoint_path}), the message naming the checkpoint step
and how to resubmit.

Fault injection (``inject``): forwarded to the target slots, which arm or refuse it; answered once they did;
armed requests that can no longer land are journalled missed (:mod:`phoenix_hpc.control.injects`).
Every message passes a :class:`~phoenix_hpc.control.protocol.ReplayGuard`: replayed or stale signed
messages are rejected and journalled.

The job ends (``job_done`` with the final hash) when every active rank reported ``done``; or on a ``stop``
message, SIGTERM (to the coordinator, or to a slot, which passes it on as ``signal``) or SIGUSR1 (time
limit): a planned end, which first writes the final checkpoint from the members' host snapshots
(:mod:`phoenix_hpc.control.planned_end`). It then tells every live slot ``stop`` and exits after their
instruction queues drained (bounded by ``linger_s``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import socket
import sys
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

from phoenix_hpc.control import protocol as P
from phoenix_hpc.control.classify import Action, Decision, Fault, FaultKind, combine, kind_from_exception
from phoenix_hpc.control.detect import detect
from phoenix_hpc.control.injects import PendingInject, confirm_within, unfired, verdict
from phoenix_hpc.control.journal import Journal, ensure_private_dir, write_private_file
from phoenix_hpc.control.liveness import LivenessServer
from phoenix_hpc.control.operator import REPLY_PREFIX as OPERATOR_REPLY_PREFIX, OperatorServer
from phoenix_hpc.control.ending import resume_hint
from phoenix_hpc.control.planned_end import PlannedEndMixin
from phoenix_hpc.control.states import (
    LIVE_SLOT_STATES,
    TERMINAL_JOB_STATES,
    JobState,
    SlotState,
    StateMachine,
    job_machine,
    slot_machine,
)
from phoenix_hpc.recovery.invariants import Expected, check_all, report_from_json
from phoenix_hpc.recovery.plan import FallbackRequired, RecoveryPlan, plan_checkpoint_restart, plan_recovery
from phoenix_hpc.topology import coord_of

_COMM_KINDS = (FaultKind.COMM_ERROR, FaultKind.COLLECTIVE_TIMEOUT)


@dataclass
class Timing:
    """The resilience timing settings the coordinator uses (seconds)."""

    heartbeat_interval_s: float = 1.0
    heartbeat_timeout_s: float = 10.0
    collective_timeout_s: float = 30.0
    checkpoint_path: str | None = None
    summary_interval_s: float = 30.0
    progress_interval_s: float = 1.0  # at most one ``progress`` record per this many seconds
    commit_log_every: int = 10  # a ``commit`` record every this many recoverable steps, or per progress interval
    linger_s: float = 5.0
    final_checkpoint: bool = False  # a planned end writes a checkpoint from host memory (mode: phoenix)
    final_write_timeout_s: float = 120.0  # the members' write of that checkpoint
    checkpoint_keep: int = 2  # complete checkpoints kept (resilience.checkpoint.keep)


@dataclass
class Slot:
    world_rank: int
    node: str
    pid: int
    role: str  # "active" | "standby"
    machine: StateMachine
    last_seen: float
    logical_rank: int | None = None
    generation: int = 0
    step: int = 0

    @property
    def state(self) -> SlotState:
        return self.machine.state


@dataclass
class _PendingFault:
    fault: Fault
    t: float  # coordinator clock when it arrived


@dataclass
class _Recovery:
    decision: Decision
    faults: list[Fault]
    generation: int
    survivors: set[int]
    t_fault: float  # estimated time the fault happened (coordinator clock)
    t_start: float
    phase: str = "quiesce"  # quiesce -> restore -> replay
    deadline: float = 0.0
    quiesced: dict[int, dict] = field(default_factory=dict)
    plan: RecoveryPlan | None = None
    recovered: dict[int, dict] = field(default_factory=dict)
    t_restored: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    target_step: int = 0


class Coordinator(PlannedEndMixin):
    """The control-plane state machine plus its store and journal. Single-threaded: :meth:`run` drains the
    inbox and runs periodic work (beat, detection, decisions, deadlines); handlers never block.

    Args:
        run_dir: the job's run directory (made 0700).
        grid: ``(tp, pp, dp)`` if known; otherwise taken from the first active registration.
        timing: heartbeat/collective timeouts and journal cadence.
        host: the address written to ``coordinator.json`` for ranks to connect to (default: this host's name).
        port: TCP port of the store (0: any free port).
        clock: monotonic seconds, injectable for tests.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        *,
        grid: tuple[int, int, int] | None = None,
        timing: Timing | None = None,
        host: str | None = None,
        port: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.run_dir = ensure_private_dir(run_dir)
        self.grid = grid
        self.t = timing or Timing()
        self.host = host or socket.gethostname()
        self.port = port
        self.clock = clock
        self.slots: dict[int, Slot] = {}
        self.generation = 0
        self.rank_map: dict[int, int] = {}  # logical -> world
        self.committed: dict[str, dict[int, int]] = {}  # shard id -> {logical: step}
        self.placement: dict[str, list[int]] = {}  # shard id -> holder logical ranks (as reported)
        self.job = job_machine()
        self.faults: deque[_PendingFault] = deque()
        self.recovery: _Recovery | None = None
        self.restore_pending: set[int] = set()  # logical ranks whose restore was cut short
        self.done: dict[int, dict] = {}
        self.checkpoint_step: int | None = None
        self.counters = {"accepted": 0, "rejected": 0, "heartbeats": 0}
        self._rejected_once: set[tuple] = set()
        self._last_commit_logged = -1
        self._last_commit_log_t = float("-inf")
        self._stop_reason: str | None = None
        self._stop_signal: str | None = None  # the external signal behind the stop (USR1, TERM), if any
        self.ending = None  # a planned end in progress (control/ending.py)
        self._end_at: float | None = None
        self._t_fault_hint: float | None = None
        self._last_summary = -1e18
        self._last_progress: tuple[int, int, int] | None = None  # (generation, min, max) step of the ACTIVE slots, journalled
        self._last_progress_t = -1e18
        self.store = None
        self.operator: OperatorServer | None = None
        self.liveness: LivenessServer | None = None
        self.journal: Journal | None = None
        self.secret = b""
        self.replay_guard = P.ReplayGuard()  # replayed or stale signed messages are rejected (and journalled)
        self.injects: dict[str, PendingInject] = {}  # fault-injection requests by request id (control/injects.py)
        self._held_replies: set[str] = set()  # reply_to of requests answered later (injects being confirmed)

    # --- lifecycle ---------------------------------------------------------------------------------
    def open(self) -> None:
        """Create the secret, the journal and the store; write ``coordinator.json`` last (the readiness
        signal the batch script waits for)."""
        import torch.distributed as dist

        self.secret = P.new_secret(self.run_dir)
        self.journal = Journal(self.run_dir)
        self.store = dist.TCPStore(
            "0.0.0.0", self.port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
        )
        self.port = self.store.port
        self.store.set(P.KEY_BEAT, "0")
        self.operator = OperatorServer()
        operator_port = self.operator.start()
        self.liveness = LivenessServer(self.secret)
        liveness_port = self.liveness.start()
        self.journal.append(
            "coordinator_started", host=self.host, port=self.port, pid=os.getpid(),
            job_id=os.environ.get("SLURM_JOB_ID"),
            heartbeat_interval_s=self.t.heartbeat_interval_s, heartbeat_timeout_s=self.t.heartbeat_timeout_s,
            grid=list(self.grid) if self.grid else None,
        )
        write_private_file(
            self.run_dir / P.COORDINATOR_FILE,
            _json({"host": self.host, "port": self.port, "operator_port": operator_port,
                   "liveness_port": liveness_port, "pid": os.getpid(),
                   "secret_file": P.SECRET_FILE, "protocol": P.PROTOCOL_VERSION}),
        )

    def run(self, max_s: float | None = None) -> JobState:
        """Serve until the job ends (done, failed, stopped) and the slots' queues drained. Returns the final
        job state."""
        t0 = self.clock()
        next_beat = next_tick = 0.0
        while True:
            now = self.clock()
            if self._stop_reason and self.job.state not in TERMINAL_JOB_STATES:
                self._maybe_begin_end(now)  # planned_end.py: the final checkpoint, then the end
            busy = self._drain_inbox()
            busy = self._drain_operator() or busy
            busy = self._drain_exits() or busy
            now = self.clock()
            if now >= next_beat:
                self.store.add(P.KEY_BEAT, 1)
                next_beat = now + self.t.heartbeat_interval_s / 2
            if now >= next_tick:
                self._tick(now)
                next_tick = now + min(0.1, self.t.heartbeat_interval_s / 4)
            if self._end_at is not None:
                if now >= self._end_at:
                    break
                if self._queues_drained():  # give the slots a moment to finish reading, then go
                    self._end_at = min(self._end_at, now + 0.5)
            if max_s is not None and now - t0 > max_s:
                self.request_stop(f"max_s={max_s} reached")
            if not busy:
                time.sleep(0.01)
        self.journal.append("coordinator_exit", job_state=self.job.state.value)
        return self.job.state

    def close(self) -> None:
        if self.operator is not None:
            self.operator.close()
        if self.liveness is not None:
            self.liveness.close()
        if self.journal:
            self.journal.close()
        self.store = None  # the TCPStore server stops when the object is collected

    # --- messages ----------------------------------------------------------------------------------
    def _drain_inbox(self) -> bool:
        import torch.distributed as dist

        n = 0
        while n < 1000:
            try:
                raw = self.store.queue_pop(P.KEY_IN, block=False)
            except dist.QueueEmptyError:
                break
            n += 1
            self._handle(raw)
        return n > 0

    def _drain_operator(self) -> bool:
        """Requests from the operator channel (:mod:`phoenix_hpc.control.operator`): handled like store
        messages; the reply goes back over the request's connection."""
        if self.operator is None:
            return False
        reqs = self.operator.poll()
        for cid, raw in reqs:
            try:
                body = P.decode(raw, self.secret)
                self.replay_guard.check(body)
            except P.ProtocolError as exc:
                self._reject(f"operator channel: {exc}", None, key=("operator", *exc.key))
                self.operator.finish(cid)
                continue
            to = f"{OPERATOR_REPLY_PREFIX}{cid}"
            self._dispatch({**body, "reply_to": to})
            if to not in self._held_replies:  # an inject is answered once its targets confirmed it
                self.operator.finish(cid)
        return bool(reqs)

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
            self._exits_during_end(exits)
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

    def _handle(self, raw: bytes) -> None:
        try:
            body = P.decode(raw, self.secret)
            self.replay_guard.check(body)
        except P.ProtocolError as exc:
            self._reject(str(exc), None, key=("decode", *exc.key))
            return
        self._dispatch(body)

    def _dispatch(self, body: dict) -> None:
        handler = getattr(self, f"_on_{body['type']}", None)
        if handler is None:
            self._reject(f"unknown message type {body['type']!r}", body)
            return
        try:
            handler(body)
        except (KeyError, TypeError, ValueError) as exc:
            self._reject(f"malformed {body['type']} message: {type(exc).__name__}: {exc}", body)

    def _send(self, world_rank: int, body: dict) -> None:
        self.store.queue_push(P.key_out(world_rank), P.encode(body, self.secret))

    def _reply(self, body: dict, reply: dict) -> None:
        to = body.get("reply_to")
        reply = {**reply, "in_reply_to": body.get("nonce")}
        if isinstance(to, str) and to.startswith(OPERATOR_REPLY_PREFIX):
            cid = to[len(OPERATOR_REPLY_PREFIX):]
            if self.operator is not None and cid.isdigit():
                self.operator.reply(int(cid), P.encode(reply, self.secret))
        elif isinstance(to, str) and to:
            self.store.queue_push(P.key_reply(to), P.encode(reply, self.secret))

    def _reject(self, reason: str, body: dict | None, key: tuple | None = None, reply: bool = True) -> None:
        self.counters["rejected"] += 1
        key = key or (reason,)
        if key not in self._rejected_once:  # journal each distinct rejection once (stale heartbeats repeat)
            self._rejected_once.add(key)
            self.journal.append(
                "rejected", reason=reason, message_type=(body or {}).get("type"),
                world_rank=(body or {}).get("world_rank"),
            )
        if body is not None and reply:
            self._reply(body, {"type": "rejected", "reason": reason})

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
            self._send(w, {"type": "stop", "reason": "this slot was declared dead and replaced"})
            return None
        return slot

    def _on_register(self, body: dict) -> None:
        w, pid, node, role = int(body["world_rank"]), int(body["pid"]), str(body["node"]), str(body["role"])
        if w < 0 or (body.get("world_size") is not None and w >= int(body["world_size"])):
            return self._reject(f"world rank {w} out of range (world size {body.get('world_size')})", body)
        if role not in ("active", "standby"):
            return self._reject(f"role {role!r} is not 'active' or 'standby'", body)
        old = self.slots.get(w)
        if old is not None:
            why = "was declared dead; a restarted process cannot rejoin" if old.state is SlotState.DEAD else (
                f"already registered (pid {old.pid} on {old.node}, {old.state.value})")
            return self._reject(f"register: world rank {w} {why}", body, key=("register", w, pid))
        logical = None
        if role == "active":
            grid = tuple(int(x) for x in body["grid"])
            if self.grid is None:
                self.grid = grid  # type: ignore[assignment]
            elif grid != tuple(self.grid):
                return self._reject(f"register: world rank {w} has grid {grid}, job grid is {tuple(self.grid)}", body)
            logical = int(body["logical_rank"])
            n = self.grid[0] * self.grid[1] * self.grid[2]
            if not 0 <= logical < n:
                return self._reject(f"register: logical rank {logical} out of range 0..{n - 1}", body)
            if logical in self.rank_map:
                return self._reject(f"register: logical rank {logical} already held by world rank "
                                    f"{self.rank_map[logical]}", body)
        if self.job.state is not JobState.STARTING and role == "active":
            return self._reject(f"register: the job is {self.job.state.value}; active slots register only at start", body)
        slot = Slot(w, node, pid, role, slot_machine(f"slot {w}"), self.clock(), logical, self.generation)
        slot.machine.to(SlotState.ACTIVE if role == "active" else SlotState.STANDBY, "registered")
        self.slots[w] = slot
        if logical is not None:
            self.rank_map[logical] = w
        self.counters["accepted"] += 1
        self.journal.append("registered", world_rank=w, pid=pid, node=node, role=role, logical_rank=logical)
        self._reply(body, {"type": "registered", "generation": self.generation, "role": role,
                           "logical_rank": logical})
        if self.grid and len(self.rank_map) == self.grid[0] * self.grid[1] * self.grid[2] \
                and self.job.state is JobState.STARTING:
            self.job.to(JobState.RUNNING, "all active ranks registered")
            self.journal.append("job_running", generation=self.generation, grid=list(self.grid),
                                rank_map=sorted(self.rank_map.items()),
                                standby=sorted(s.world_rank for s in self.slots.values() if s.role == "standby"))

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
            slot.step = int(body["step"])
        self.counters["heartbeats"] += 1

    def _on_commit(self, body: dict) -> None:
        slot = self._slot_of(body, "commit")
        if slot is None or not self._gen_ok(slot, body.get("generation"), "commit", body) or slot.logical_rank is None:
            return
        slot.last_seen = self.clock()
        if body.get("live_step") is not None:
            slot.step = int(body["live_step"])
        r = slot.logical_rank
        for sid, step in dict(body.get("shards", {})).items():
            self.committed.setdefault(sid, {})[r] = int(step)
        for sid, step in dict(body.get("replicas", {})).items():
            self.committed.setdefault(sid, {})[r] = int(step)
            holders = self.placement.setdefault(sid, [])
            if r not in holders:
                holders.append(r)
        self._maybe_log_commit()

    def _recoverable_step(self) -> int | None:
        """min over shards of the newest step whose owner copy and every reported replica are committed."""
        if not self.grid or not self.committed:
            return None
        tp, pp, dp = self.grid
        steps = []
        for r in range(tp * pp * dp):
            sid = coord_of(r, tp, pp, dp).shard_prefix()
            copies = self.committed.get(sid)
            if not copies or r not in copies:
                return None
            steps.append(min(copies.values()))
        return min(steps)

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
            self.journal.append("commit", recoverable_step=rs, shards=len(self.committed),
                                replicas=sum(len(v) for v in self.placement.values()), generation=self.generation)

    def _on_checkpoint(self, body: dict) -> None:
        slot = self._slot_of(body, "checkpoint")
        if slot is None:
            return
        step = int(body["step"])
        if self.checkpoint_step is None or step > self.checkpoint_step:
            self.checkpoint_step = step
            self.journal.append("checkpoint", step=step, path=body.get("path"), world_rank=slot.world_rank)

    def _on_fault(self, body: dict) -> None:
        slot = self._slot_of(body, "fault")
        if slot is None:
            return
        kind_s = body.get("kind")
        kind = FaultKind(kind_s) if kind_s in FaultKind._value2member_map_ else kind_from_exception(
            str(body.get("exc_type", "")), str(body.get("message", "")))
        g = int(body.get("generation", slot.generation))
        # an error of an older generation's collectives, or of the collectives a planned end broke off
        superseded = g < self.generation or self.ending is not None
        self.journal.append(
            "fault", world_rank=slot.world_rank, node=slot.node, generation=g, step=body.get("step"),
            phase=body.get("phase"), kind=kind.value, exc_type=body.get("exc_type"),
            message=str(body.get("message", ""))[:500], superseded=superseded,
        )
        if superseded:
            return  # an error of an older generation's collectives: a consequence of a fault being handled
        self.faults.append(_PendingFault(
            Fault(kind, (slot.world_rank,), (slot.node,), False, f"{body.get('exc_type', '')}: {body.get('message', '')}"[:300]),
            self.clock()))

    def _on_quiesced(self, body: dict) -> None:
        slot = self._slot_of(body, "quiesced")
        rec = self.recovery
        if slot is None:
            return
        if rec is None or rec.phase != "quiesce" or int(body["generation"]) != rec.generation:
            return self._reject(f"quiesced from world rank {slot.world_rank} for generation {body.get('generation')} "
                                "outside a quiesce", body, key=("quiesced", slot.world_rank, body.get("generation")))
        rec.quiesced[slot.world_rank] = body
        slot.last_seen = self.clock()

    def _on_recovered(self, body: dict) -> None:
        slot = self._slot_of(body, "recovered")
        rec = self.recovery
        if slot is None:
            return
        if rec is None or rec.phase != "restore" or int(body["generation"]) != rec.generation:
            return self._reject(f"recovered from world rank {slot.world_rank} for generation {body.get('generation')}"
                                " outside a restore", body, key=("recovered", slot.world_rank, body.get("generation")))
        rec.recovered[slot.world_rank] = body  # idempotent: a repeated report replaces the first
        slot.last_seen = self.clock()

    def _on_done(self, body: dict) -> None:
        slot = self._slot_of(body, "done")
        if slot is None or slot.logical_rank is None or not self._gen_ok(slot, body.get("generation"), "done", body):
            return
        self.done[slot.logical_rank] = {"step": int(body["step"]), "state_hash": str(body["state_hash"]),
                                        "world_rank": slot.world_rank}
        slot.step = int(body["step"])
        n = len(self.rank_map)
        rec = self.recovery
        if self.grid and len(self.done) == n and self.job.state is JobState.RUNNING and (
                rec is None or rec.phase == "replay"):
            if rec is not None:
                self._finish_recovery(rec, self.clock(), interrupted=False)
            self._maybe_log_commit(force=True)  # the newest recoverable step, for status after the end
            steps = {d["step"] for d in self.done.values()}
            h = hashlib.sha256()
            for r in sorted(self.done):
                h.update(self.done[r]["state_hash"].encode())
            self._end(JobState.DONE, "job_done", final_hash=h.hexdigest(), step=max(steps),
                      steps_agree=len(steps) == 1, generation=self.generation,
                      rank_hashes=[self.done[r]["state_hash"] for r in sorted(self.done)])

    def _on_stop(self, body: dict) -> None:
        self._reply(body, {"type": "ok"})
        self.request_stop(str(body.get("reason", "stop requested")))

    def _on_inject(self, body: dict) -> None:
        kind, phase, at_step = body.get("kind"), body.get("phase"), body.get("at_step")
        if kind not in P.INJECT_KINDS:
            return self._reject(f"inject: kind {kind!r} not one of {', '.join(P.INJECT_KINDS)}", body)
        if phase not in P.INJECT_PHASES:
            return self._reject(f"inject: phase {phase!r} not one of {', '.join(P.INJECT_PHASES)}", body)
        if not isinstance(at_step, int) or at_step < 1:
            return self._reject(f"inject: at_step {at_step!r} must be an integer >= 1", body)
        if self.job.state in TERMINAL_JOB_STATES:
            return self._reject(f"inject: the job is {self.job.state.value}", body)
        targets, why = self._resolve_target(body.get("target"))
        if not targets:
            return self._reject(f"inject: {why}", body)
        live_step = max((self.slots[w].step for w in targets), default=0)
        ahead = body.get("steps_ahead")
        if ahead is not None:
            if not isinstance(ahead, int) or isinstance(ahead, bool) or ahead < 1:
                return self._reject(f"inject: steps_ahead {ahead!r} must be an integer >= 1", body)
            at_step = max(at_step, live_step + ahead)
        if at_step <= live_step:
            return self._reject(f"inject: step {at_step} already done by the target (at step {live_step})", body)
        rid = str(body.get("request_id") or uuid.uuid4().hex[:12])
        if rid in self.injects:
            return self._reject(f"inject: request id {rid!r} was already used", body)
        # the targets decide (they know the step they are in); the answer waits for them (control/injects.py)
        self.injects[rid] = PendingInject(rid, kind, phase, at_step, targets, body,
                                          deadline=self.clock() + confirm_within(body))
        self._held_replies.add(str(body.get("reply_to")))
        msg = {"type": "inject", "kind": kind, "at_step": at_step, "phase": phase, "request_id": rid}
        if ahead is not None:
            msg["steps_ahead"] = ahead
        for w in targets:
            self._send(w, msg)
        self.journal.append("inject_forwarded", kind=kind, phase=phase, at_step=at_step, targets=targets,
                            target=body.get("target"), request_id=rid)

    def _on_inject_ack(self, body: dict) -> None:
        """A target armed or refused an injection (or answered a ``disarm``)."""
        slot = self._slot_of(body, "inject_ack")
        req = self.injects.get(str(body.get("request_id")))
        if slot is None or req is None or slot.world_rank not in req.targets or req.state != "confirming":
            return
        req.acks[slot.world_rank] = body
        v = verdict(req)
        if v == "refused":
            self._refuse_inject(req, "; ".join(req.refusals()))
        elif v == "armed":
            req.state = "armed"
            steps = req.armed_steps()
            self.journal.append("inject_armed", request_id=req.request_id, armed_steps=sorted(steps.items()),
                                started_steps=sorted((w, a.get("started_step")) for w, a in req.acks.items()))
            self._release_reply(req, {"type": "accepted", "targets": req.targets, "request_id": req.request_id,
                                      "at_step": max(steps.values()), "armed_steps": sorted(steps.items())})

    def _on_inject_fired(self, body: dict) -> None:
        """A target's injection fired (sent just before the effect; the landing file is written first)."""
        slot = self._slot_of(body, "inject_fired")
        req = self.injects.get(str(body.get("request_id")))
        if slot is None or req is None:
            return
        armed = req.armed_steps().get(slot.world_rank)
        req.fired.add(slot.world_rank)
        self.journal.append("inject_landed", request_id=req.request_id, world_rank=slot.world_rank,
                            step=body.get("step"), phase=body.get("phase"), at_step=armed,
                            exact=body.get("step") == armed and body.get("phase") == req.phase)

    def _release_reply(self, req: PendingInject, reply: dict) -> None:
        self._held_replies.discard(str(req.request.get("reply_to")))
        self._reply(req.request, reply)
        to = str(req.request.get("reply_to"))
        if to.startswith(OPERATOR_REPLY_PREFIX) and to[len(OPERATOR_REPLY_PREFIX):].isdigit() and self.operator:
            self.operator.finish(int(to[len(OPERATOR_REPLY_PREFIX):]))  # closed, if the reply did not go out

    def _refuse_inject(self, req: PendingInject, reason: str) -> None:
        """Refuse a request still being confirmed: disarm it where it was armed, journal, answer."""
        req.state = "refused"
        for w in req.targets:  # also those yet to answer: their queue holds the inject, then this disarm
            if self.slots[w].state in LIVE_SLOT_STATES:
                self._send(w, {"type": "disarm", "request_id": req.request_id})
        self.journal.append("inject_refused", request_id=req.request_id, reason=reason, targets=req.targets)
        self.counters["rejected"] += 1
        self._release_reply(req, {"type": "rejected", "reason": f"inject: {reason}"})

    def _injects_lost(self, worlds: list[int], why: str) -> None:
        """Slots ``worlds`` are gone: requests they still had to confirm are refused, armed ones they had not
        fired are missed."""
        for req in list(self.injects.values()):
            hit = [w for w in worlds if w in req.targets]
            if not hit:
                continue
            if req.state == "confirming":
                self._refuse_inject(req, f"world rank(s) {hit} lost before confirming ({why})")
            elif req.state == "armed":
                for w in unfired(req, self.run_dir, hit):
                    req.missed.add(w)
                    self.journal.append("inject_missed", request_id=req.request_id, world_rank=w,
                                        at_step=req.armed_steps().get(w),
                                        reason=f"world rank {w} was lost before step {req.armed_steps().get(w)} "
                                               f"({why})")

    def _injects_tick(self, now: float) -> None:
        for req in list(self.injects.values()):
            if req.state == "confirming" and now > req.deadline:
                silent = sorted(set(req.targets) - set(req.acks))
                self._refuse_inject(req, f"world rank(s) {silent} did not confirm within "
                                         f"{confirm_within(req.request):g} s (a slot reads instructions once per "
                                         "step; allow a longer --timeout-s)")

    def _injects_at_end(self, state: JobState) -> None:
        """The job ends: requests being confirmed are refused, armed ones that did not fire are missed."""
        for req in list(self.injects.values()):
            if req.state == "confirming":
                self._refuse_inject(req, f"the job ended ({state.value})")
            elif req.state == "armed":
                for w in unfired(req, self.run_dir):
                    req.missed.add(w)
                    self.journal.append("inject_missed", request_id=req.request_id, world_rank=w,
                                        at_step=req.armed_steps().get(w),
                                        reason=f"the job ended ({state.value}) before step "
                                               f"{req.armed_steps().get(w)}, phase {req.phase}")

    def _resolve_target(self, target: Any) -> tuple[list[int], str]:
        live = {w: s for w, s in self.slots.items() if s.state in LIVE_SLOT_STATES}
        if not isinstance(target, dict) or len(target) != 1:
            return [], f"target {target!r} must be one of {{world_rank}}, {{logical_rank}}, {{node}}, {{coord: [pp, dp, tp]}}"
        (k, v), = target.items()
        if k == "world_rank":
            return ([int(v)], "") if int(v) in live else ([], f"no live slot with world rank {v} (live: {sorted(live)})")
        if k == "logical_rank":
            w = self.rank_map.get(int(v))
            return ([w], "") if w in live else ([], f"no live slot holds logical rank {v} (grid has {len(self.rank_map)})")
        if k == "node":
            ws = sorted(w for w, s in live.items() if s.node == v)
            return (ws, "") if ws else ([], f"no live slot on node {v!r} (nodes: {sorted({s.node for s in live.values()})})")
        if k == "coord" and self.grid:
            pp, dp, tp = (int(x) for x in v)
            T, PP, D = self.grid
            if not (0 <= pp < PP and 0 <= dp < D and 0 <= tp < T):
                return [], f"coord {list(v)} outside the grid tp={T} pp={PP} dp={D}"
            w = self.rank_map.get((pp * D + dp) * T + tp)
            return ([w], "") if w in live else ([], f"no live slot at coord {list(v)}")
        return [], f"unknown target key {k!r}"

    # --- periodic work -----------------------------------------------------------------------------
    def _tick(self, now: float) -> None:
        if self.job.state in TERMINAL_JOB_STATES:
            return
        self._injects_tick(now)
        if self.ending is not None:  # members leave on purpose: no detection, no decisions
            return self._advance_end(now)
        watched = {w: s.last_seen for w, s in self.slots.items() if s.state in LIVE_SLOT_STATES}
        dead, reason = detect(now, watched, self.t)
        if dead:
            self._declare_dead(list(dead), FaultKind.HEARTBEAT_TIMEOUT, reason, now)
        if self.recovery is not None:
            self._advance_recovery(now)
        if self.recovery is None and self.faults and self.job.state in (JobState.RUNNING,):
            self._decide(now)
        if now - self._last_progress_t >= self.t.progress_interval_s:
            # live progress for ``phoenix status``: the steps the ACTIVE slots last reported (heartbeats)
            steps = [s.step for s in self.slots.values() if s.state is SlotState.ACTIVE]
            span = (self.generation, min(steps), max(steps)) if steps else None
            if span is not None and span != self._last_progress:
                self._last_progress, self._last_progress_t = span, now
                self.journal.append("progress", step=span[2], min_step=span[1], generation=self.generation)
        if now - self._last_summary >= self.t.summary_interval_s:
            self._last_summary = now
            self.journal.append(
                "heartbeat_summary", generation=self.generation, job_state=self.job.state.value,
                active=sorted(w for w, s in self.slots.items() if s.state in (SlotState.ACTIVE, SlotState.QUIESCED, SlotState.JOINING)),
                standby=sorted(w for w, s in self.slots.items() if s.state is SlotState.STANDBY),
                dead=sorted(w for w, s in self.slots.items() if s.state is SlotState.DEAD),
                max_step=max((s.step for s in self.slots.values()), default=0), **self.counters,
            )

    def _declare_dead(self, worlds: list[int], kind: FaultKind, reason: str, now: float) -> None:
        worlds = [w for w in worlds if self.slots[w].state is not SlotState.DEAD]
        if not worlds:
            return
        t_fault = min(self.slots[w].last_seen for w in worlds)
        for w in worlds:
            self.slots[w].machine.to(SlotState.DEAD, reason)
        nodes = tuple(sorted({self.slots[w].node for w in worlds}))
        self.journal.append("slots_dead", slots=worlds, nodes=list(nodes), kind=kind.value, reason=reason)
        self._injects_lost(worlds, reason)
        members = set(self.rank_map.values())
        if not any(w in members for w in worlds):
            spares = sorted(w for w, s in self.slots.items() if s.state is SlotState.STANDBY)
            self.journal.append("spare_lost", slots=worlds, spares_left=spares)
            return  # only standby slots died: the spare pool shrinks, training is not affected
        f = Fault(kind, tuple(worlds), nodes, False, reason)
        self.faults.append(_PendingFault(f, now))
        self._t_fault_hint = t_fault if self._t_fault_hint is None else min(self._t_fault_hint, t_fault)

    def _decide(self, now: float) -> None:
        # A collective error is transient only if every active slot proved alive after it was reported.
        pend = list(self.faults)
        active = [s for s in self.slots.values() if s.state in (SlotState.ACTIVE,)]
        comm = [p for p in pend if p.fault.kind in _COMM_KINDS]
        if comm and len(comm) == len(pend):
            t_last = max(p.t for p in comm)
            if not all(s.last_seen > t_last for s in active):
                if now - t_last <= self.t.heartbeat_timeout_s:
                    return  # wait for fresh heartbeats or for detect() to declare the silent ones dead
            else:
                pend = [_PendingFault(Fault(p.fault.kind, p.fault.slots, p.fault.nodes, True, p.fault.detail), p.t)
                        for p in pend]
        self.faults.clear()
        faults = [p.fault for p in pend]
        decision = combine(faults)
        dead_now = sorted(w for w, s in self.slots.items() if s.state is SlotState.DEAD and
                          (w in self.rank_map.values()))
        if decision.action is Action.HOT_SWAP and not dead_now and not self.restore_pending:
            # e.g. a reported hardware error on a live slot: fence the slot, then replace it. Only the slots
            # a replacement fault names: a peer that reported the collective error it caused stays a member
            for f in faults:
                if f.kind in _COMM_KINDS:
                    continue
                self._declare_dead([w for w in f.slots if w in self.rank_map.values()], f.kind, f.detail, now)
            self.faults.clear()
        self.journal.append("decision", action=decision.action.value, reason=decision.reason,
                            faults=[{"kind": f.kind.value, "slots": list(f.slots), "nodes": list(f.nodes)} for f in faults])
        if decision.action is Action.CLEAN_STOP:
            ck = self._newest_checkpoint()
            self._end(JobState.FAILED, "clean_stop", reason=decision.reason, checkpoint_step=ck,
                      message="stopped without training on; " + (
                          f"to continue from the persistent checkpoint of step {ck}: {resume_hint(str(self.run_dir))}"
                          if ck is not None else "no persistent checkpoint yet: submit the config again"))
            return
        t_fault = min([self._t_fault_hint if self._t_fault_hint is not None else now] + [p.t for p in pend])
        self._t_fault_hint = None
        self._start_recovery(decision, faults, t_fault, now)

    # --- recovery orchestration --------------------------------------------------------------------
    def _live_members(self) -> list[int]:
        return sorted(w for w in self.rank_map.values() if self.slots[w].state is not SlotState.DEAD)

    def _start_recovery(self, decision: Decision, faults: list[Fault], t_fault: float, now: float) -> None:
        self._maybe_log_commit(force=True)  # journal the committed step this recovery starts from, first
        if self.job.state is JobState.RUNNING:
            self.job.to(JobState.RECOVERING, decision.reason)
        self.generation += 1
        self.store.set("ctl/generation", str(self.generation))
        survivors = set(self._live_members())
        rec = _Recovery(decision, faults, self.generation, survivors, t_fault, now,
                        deadline=now + self.t.collective_timeout_s + self.t.heartbeat_timeout_s)
        self.recovery = rec
        dead = sorted(w for w, s in self.slots.items() if s.state is SlotState.DEAD)
        self.journal.append("recovery_start", generation=self.generation, action=decision.action.value,
                            survivors=sorted(survivors), dead=dead, detect_s=round(now - t_fault, 3))
        for w in sorted(survivors):
            s = self.slots[w]
            if s.state is SlotState.ACTIVE:
                s.machine.to(SlotState.QUIESCED, f"recovery to generation {self.generation}")
            self._send(w, {"type": "quiesce", "generation": self.generation, "dead": dead,
                           "reason": decision.reason})

    def _abort_recovery(self, reason: str, now: float) -> None:
        rec = self.recovery
        self.journal.append("recovery_aborted", generation=rec.generation, phase=rec.phase, reason=reason)
        if rec.plan is not None and rec.phase == "restore":
            self.restore_pending |= {j.logical_rank for j in rec.plan.joins if self.slots[j.world_rank].state is not SlotState.DEAD}
        self.recovery = None
        # survivors stay QUIESCED; the queued fault starts the next recovery at once
        if not self.faults:
            self.faults.append(_PendingFault(Fault(FaultKind.UNKNOWN, (), (), False, reason), now))
        pend = list(self.faults)
        self.faults.clear()
        faults = [p.fault for p in pend]
        decision = combine(faults)
        if decision.action is Action.CLEAN_STOP:
            self.journal.append("decision", action=decision.action.value, reason=decision.reason)
            self._end(JobState.FAILED, "clean_stop", reason=decision.reason)
            return
        self.journal.append("decision", action="hot_swap", reason=f"second fault during recovery: {decision.reason}",
                            faults=[{"kind": f.kind.value, "slots": list(f.slots)} for f in faults])
        self._start_recovery(Decision(Action.HOT_SWAP, decision.reason), faults, rec.t_fault, now)

    def _advance_recovery(self, now: float) -> None:
        rec = self.recovery
        members = rec.survivors if rec.phase == "quiesce" else (
            {w for _, w in rec.plan.rank_map} if rec.plan else set())
        lost = sorted(w for w in members if self.slots[w].state is SlotState.DEAD)
        if lost and rec.phase in ("quiesce", "restore"):
            return self._abort_recovery(f"slot(s) {lost} died during the {rec.phase} phase", now)
        if rec.phase in ("quiesce", "restore") and now > rec.deadline:
            got = rec.quiesced if rec.phase == "quiesce" else rec.recovered
            silent = sorted(members - set(got))
            self._declare_dead(silent, FaultKind.HEARTBEAT_TIMEOUT,
                               f"no {rec.phase} answer within {rec.deadline - rec.t_start:.0f}s", now)
            return self._abort_recovery(f"slot(s) {silent} did not answer the {rec.phase}", now)
        if rec.phase == "quiesce" and set(rec.quiesced) >= rec.survivors:
            self._plan(rec, now)
        elif rec.phase == "restore" and set(rec.recovered) >= {w for _, w in rec.plan.rank_map}:
            self._check_and_resume(rec, now)
        elif rec.phase == "replay":
            members = [w for _, w in rec.plan.rank_map]
            if all(self.slots[w].step >= rec.target_step for w in members):
                self._finish_recovery(rec, now, interrupted=False)
            elif self.faults:
                self._finish_recovery(rec, now, interrupted=True)

    def _plan(self, rec: _Recovery, now: float) -> None:
        committed: dict[str, dict[int, int]] = {}
        live_steps: dict[int, int] = {}
        dirty: list[int] = []
        for w, q in rec.quiesced.items():
            r = self.slots[w].logical_rank
            if r is None or r in self.restore_pending:
                continue
            live_steps[r] = int(q["live_step"])
            if q.get("dirty"):
                dirty.append(r)
            for sid, st in {**dict(q.get("shards", {})), **dict(q.get("replicas", {}))}.items():
                # one step, or the steps of both ping-pong buffers (committed first)
                committed.setdefault(sid, {})[r] = [int(st)] if isinstance(st, int) else [int(x) for x in st]
        spares = sorted((w for w, s in self.slots.items() if s.state is SlotState.STANDBY),
                        key=lambda w: (self.slots[w].node, w))
        dead = [w for w, s in self.slots.items() if s.state is SlotState.DEAD]
        t0 = time.perf_counter()
        try:
            plan = plan_recovery(
                generation=rec.generation - 1, grid=tuple(self.grid), rank_map=dict(self.rank_map),
                nodes={w: s.node for w, s in self.slots.items()}, dead=dead, spares=spares,
                placement=self.placement, committed=committed, live_steps=live_steps,
                restore=sorted(self.restore_pending), dirty=dirty,
            )
        except FallbackRequired as exc:
            return self._fallback(rec, exc, live_steps, spares, dead, now)
        self._send_plan(rec, plan, now, time.perf_counter() - t0)

    def _send_plan(self, rec: _Recovery, plan: RecoveryPlan, now: float, plan_s: float) -> None:
        # the plan was made for generation - 1 -> generation; keep the coordinator's numbering
        rec.plan = plan
        rec.phase = "restore"
        rec.phases["plan_s"] = plan_s
        rec.deadline = now + self.t.collective_timeout_s + self.t.heartbeat_timeout_s
        self.rank_map = plan.world_of()
        self.restore_pending = set()
        for j in plan.joins:
            s = self.slots[j.world_rank]
            if s.state is SlotState.STANDBY:  # idempotent admission: only a STANDBY slot is taken
                s.machine.to(SlotState.JOINING, f"replaces world rank {j.replaces_world_rank}")
                s.logical_rank = j.logical_rank
                s.role = "active"
        self.journal.append("recovery_plan", generation=rec.generation, **{k: v for k, v in plan.to_json().items()
                                                                           if k not in ("generation", "old_generation")})
        body = {"type": "recover", "generation": rec.generation, "plan": plan.to_json()}
        body["plan"]["generation"] = rec.generation
        for _, w in plan.rank_map:
            self._send(w, body)

    def _check_and_resume(self, rec: _Recovery, now: float) -> None:
        plan = rec.plan
        reports = {w: report_from_json(b["report"]) for w, b in rec.recovered.items()}
        T, PP, D = self.grid
        expected = Expected(rec.generation, plan.rank_map,
                            {coord_of(r, T, PP, D).shard_prefix(): r for r, _ in plan.rank_map},
                            plan.recoverable_step)
        bad = check_all(expected, reports, plan.invariants)
        if bad:
            self.journal.append("invariant_violation", generation=rec.generation, violations=[str(v) for v in bad])
            self._end(JobState.FAILED, "clean_stop", reason="recovery invariant violated: " + "; ".join(map(str, bad)))
            return
        for key in ("reconfigure", "params", "optimizer"):
            rec.phases[key] = max((float(b.get("timings", {}).get(key, 0.0)) for b in rec.recovered.values()), default=0.0)
        for _, w in plan.rank_map:
            s = self.slots[w]
            s.generation = rec.generation
            s.step = plan.recoverable_step
            if s.state in (SlotState.QUIESCED, SlotState.JOINING):
                s.machine.to(SlotState.ACTIVE, f"generation {rec.generation} restored")
        rec.t_restored = now
        rec.phase = "replay"
        rec.target_step = plan.recoverable_step + plan.steps_replayed
        self.job.to(JobState.RUNNING, f"generation {rec.generation} restored")
        self.journal.append("recovery_restored", generation=rec.generation, recoverable_step=plan.recoverable_step,
                            invariants=list(plan.invariants), restore_s=round(now - rec.t_start, 3))
        for _, w in plan.rank_map:
            self._send(w, {"type": "resume", "generation": rec.generation, "step": plan.recoverable_step})

    def _finish_recovery(self, rec: _Recovery, now: float, interrupted: bool) -> None:
        detect_s = rec.t_start - rec.t_fault
        phases = {"detect": round(detect_s, 3), "reconfigure": round(rec.phases.get("reconfigure", 0.0), 3),
                  "params": round(rec.phases.get("params", 0.0), 3),
                  "optimizer": round(rec.phases.get("optimizer", 0.0), 3),
                  "replay": round(now - rec.t_restored, 3)}
        self.journal.append("recovery_done", generation=rec.generation, action=rec.plan.action,
                            total_s=round(now - rec.t_fault, 3), phases=phases,
                            steps_replayed=rec.plan.steps_replayed, recoverable_step=rec.plan.recoverable_step,
                            replay_interrupted=interrupted)
        self.recovery = None

    def _newest_checkpoint(self) -> int | None:
        """The newest complete persistent checkpoint: reported by rank 0 or found under the checkpoint root."""
        from phoenix_hpc.recovery.checkpoint import latest_step

        on_disk = latest_step(self.t.checkpoint_path) if self.t.checkpoint_path else None
        steps = [s for s in (self.checkpoint_step, on_disk) if s is not None]
        return max(steps) if steps else None

    def _fallback(self, rec: _Recovery, exc: FallbackRequired, live_steps: dict[int, int], spares: list[int],
                  dead: list[int], now: float) -> None:
        """Memory replicas cannot cover the loss (docs/design.md section 6): restart generation g+1 in this job
        from the newest persistent checkpoint (spares take the dead ranks, every member loads it); when
        there is no checkpoint or not enough spares, stop cleanly naming the checkpoint to resubmit from."""
        ck = self._newest_checkpoint()
        newest = max(live_steps.values(), default=0)
        lost = None if ck is None else newest - ck
        if ck is not None:
            t0 = time.perf_counter()
            try:
                plan = plan_checkpoint_restart(
                    generation=rec.generation - 1, grid=tuple(self.grid), rank_map=dict(self.rank_map),
                    nodes={w: s.node for w, s in self.slots.items()}, dead=dead, spares=spares,
                    checkpoint_step=ck, live_steps=live_steps)
            except FallbackRequired as exc2:
                exc = exc2
            else:
                self.journal.append("decision", action="checkpoint_restart", reason=exc.reason, checkpoint_step=ck,
                                    lost_steps=lost)
                self.journal.append("checkpoint_restart", generation=rec.generation, reason=exc.reason,
                                    lost_shards=list(exc.lost_shards), checkpoint_step=ck, lost_steps=lost,
                                    checkpoint_path=self.t.checkpoint_path)
                return self._send_plan(rec, plan, now, time.perf_counter() - t0)
        self.journal.append("decision", action="fallback", reason=exc.reason, lost_shards=list(exc.lost_shards),
                            checkpoint_step=ck, lost_steps=lost)
        self.recovery = None
        self.job.to(JobState.FALLBACK, exc.reason)
        if ck is not None:
            msg = (f"recovery from memory impossible: {exc.reason}. The job stops. Newest persistent checkpoint: step {ck} under {self.t.checkpoint_path} "
                   f"({lost} step(s) since then are lost). To continue from it: {resume_hint(str(self.run_dir))} "
                   f"(training restarts at step {ck})")
        else:
            msg = (f"recovery from memory impossible: {exc.reason}. The job stops. No persistent checkpoint was written yet "
                   "(resilience.checkpoint.interval_steps): resubmitting starts the training over")
        self._end(JobState.FAILED, "fallback", reason=exc.reason, message=msg, checkpoint_step=ck,
                  lost_steps=lost, checkpoint_path=self.t.checkpoint_path)

    # --- the end -----------------------------------------------------------------------------------
    def _end(self, state: JobState, event: str, **fields: Any) -> None:
        if self.job.state not in TERMINAL_JOB_STATES:
            self.job.to(state, event)
        self.journal.append(event, **fields)
        self._injects_at_end(state)
        reason = fields.get("message") or fields.get("reason") or event
        for w, s in sorted(self.slots.items()):
            if s.state in LIVE_SLOT_STATES:
                self._send(w, {"type": "stop", "reason": str(reason), "job_state": state.value})
        self._end_at = self.clock() + self.t.linger_s

    def _queues_drained(self) -> bool:
        return all(self.store.queue_len(P.key_out(w)) == 0 for w, s in self.slots.items()
                   if s.state in LIVE_SLOT_STATES)


def _json(d: dict) -> str:
    import json

    return json.dumps(d, indent=1, sort_keys=True) + "\n"


def timing_from_run_dir(run_dir: Path) -> tuple[Timing, tuple[int, int, int] | None]:
    """Timing and grid from ``RUN_DIR/config.yaml`` (defaults when the file is absent).

    Raises:
        ConfigError: the config exists but is invalid.
    """
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.exists():
        return Timing(), None
    from phoenix_hpc.config import load_job_config

    cfg = load_job_config(cfg_path)
    from phoenix_hpc.launch.persist import checkpoint_root

    r = cfg.resilience
    ck = str(checkpoint_root(cfg, run_dir))
    t = Timing(r.heartbeat_interval_s, r.heartbeat_timeout_s, r.collective_timeout_s, ck,
               linger_s=max(2.0, 2 * r.heartbeat_interval_s),
               final_checkpoint=bool(r.enabled and r.mode == "phoenix"), checkpoint_keep=r.checkpoint.keep)
    par = cfg.parallelism
    grid = (par.tp, par.pp, par.dp) if par.dp else None
    return t, grid


def main(argv: list[str] | None = None) -> int:
    """Entry point. Exit codes: see :func:`exit_code_of` (also written to ``RUN_DIR/job_exit_status`` before
    the process tears down, which the batch script reads); 2 bad input."""
    from phoenix_hpc.errors import PhoenixError

    ap = argparse.ArgumentParser(prog="python -m phoenix_hpc.control.coordinator", description=__doc__.split("\n")[0])
    ap.add_argument("--run-dir", required=True, help="the job's run directory (config.yaml is read from it)")
    ap.add_argument("--host", default=None, help="address ranks use to reach the store (default: hostname)")
    ap.add_argument("--port", type=int, default=0, help="store port (default: any free port)")
    ap.add_argument("--summary-interval-s", type=float, default=None, help="heartbeat summary cadence")
    args = ap.parse_args(argv)
    run_dir = Path(args.run_dir)
    try:
        timing, grid = timing_from_run_dir(run_dir)
    except PhoenixError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.summary_interval_s:
        timing.summary_interval_s = args.summary_interval_s
    coord = Coordinator(run_dir, grid=grid, timing=timing, host=args.host, port=args.port)
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
