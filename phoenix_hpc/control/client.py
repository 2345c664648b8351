"""The rank-side client of the coordinator: the connection, register and rejoin, reports, instructions.

One :class:`CoordinatorClient` per slot. It reads ``RUN_DIR/coordinator.json`` and ``RUN_DIR/secret``
(waiting for them, bounded), and opens its own TCPStore client connections (one for the calling thread, one
for the heartbeat thread: a store connection is not shared between threads). Messages are signed with the
job secret (:mod:`phoenix_hpc.control.protocol`); instructions from the coordinator whose MAC does not verify,
or whose nonce was already received (a replay), are dropped.

Instructions are popped from the store only when the slot's doorbell rang (the coordinator rings it over
the liveness connection after queueing an instruction, :mod:`phoenix_hpc.control.liveness`): :meth:`poll`
takes whatever is queued, :meth:`poll_if_rung` only after a ring (the training thread's per-step check and
the quiesce watchdog use it), and :meth:`wait_instruction` sleeps on the doorbell. Without a liveness
connection (a coordinator that offers none) every call polls.

The heartbeat and coordinator watchdog threads are :class:`phoenix_hpc.control.heartbeat.Heartbeat`
(:meth:`CoordinatorClient.start_heartbeat`); the injections and drains this slot armed are
:class:`phoenix_hpc.control.armed.ArmedInstructions`.

Coordinator restart (``resilience.coordinator_restarts`` > 0; ``restart_timeout_s`` of
:meth:`CoordinatorClient.start_heartbeat`): a closed liveness connection is then not the end. The slot is
*away*: training goes on, reports are kept in a bounded outbox (:mod:`phoenix_hpc.control.outbox`), polls
return nothing, and the heartbeat thread watches ``RUN_DIR/coordinator.json`` for a coordinator with
another pid (the batch script's supervisor restarts a crashed one, :mod:`phoenix_hpc.control.supervise`).
When one is there the slot re-registers (``register`` with ``rejoin``: generation, step, outbox size),
opens a new liveness connection, sends its outbox in order and its newest commit report (own shard and
replicas held) and ``done`` again, and counts :attr:`CoordinatorClient.incarnation` up (a new store: the
next generation's rendezvous uses it). Only when none comes back within ``restart_timeout_s`` does
``on_lost`` run (one line, exit code 75). A refused rejoin (the slot was declared dead) also ends it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from collections import deque
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from phoenix_hpc.control import protocol as P
from phoenix_hpc.control.armed import ArmedInstructions
from phoenix_hpc.control.heartbeat import Heartbeat, default_on_lost
from phoenix_hpc.control.outbox import Outbox
from phoenix_hpc.errors import ControlError

if TYPE_CHECKING:
    from phoenix_hpc.faults.trigger import Injection


def _on_armed(name: str, doc: str, settable: bool = False) -> property:
    """A field of the slot's :class:`~phoenix_hpc.control.armed.ArmedInstructions`, read (and, when
    ``settable``, set) through the client."""
    return property(lambda c: getattr(c.armed, name),
                    (lambda c, v: setattr(c.armed, name, v)) if settable else None, doc=doc)


class CoordinatorClient:
    """A slot's connection to the coordinator.

    Args:
        run_dir: the job's run directory.
        world_rank: this slot's MPI world rank (stable for the life of the process).
        wait_s: how long to wait for ``coordinator.json`` and for replies.
        store_timeout_s: timeout of store operations (a hung coordinator makes them fail after this).
        pid: the process id presented to the coordinator (default ``os.getpid()``).

    Raises:
        ControlError: the coordinator does not come up within ``wait_s``, or the secret cannot be read.
    """

    def __init__(self, run_dir: str | os.PathLike, world_rank: int, *, wait_s: float = 60.0,
                 store_timeout_s: float = 10.0, pid: int | None = None):
        import torch.distributed as dist

        self.run_dir = Path(run_dir)
        self.world_rank = int(world_rank)
        self.pid = os.getpid() if pid is None else int(pid)
        self.wait_s = wait_s
        self.info = P.wait_for_coordinator(self.run_dir, wait_s)
        theirs = self.info.get("protocol")
        if theirs != P.PROTOCOL_VERSION:
            raise ControlError(f"the coordinator of {self.run_dir} speaks control protocol version {theirs!r}, "
                               f"this phoenix_hpc speaks {P.PROTOCOL_VERSION}: rank and coordinator must come "
                               "from the same phoenix_hpc install")
        self.secret = P.read_secret(self.run_dir)
        self.host, self.port = str(self.info["host"]), int(self.info["port"])
        self._store_timeout = timedelta(seconds=store_timeout_s)
        self.store = self._connect()
        self._lock = threading.Lock()
        self.armed = ArmedInstructions(self.world_rank, self.pid, self.send)  # injections and drain accepted
        self._alive = None  # the liveness connection (liveness.AliveConnection), after registration
        self._rings_seen = -1  # doorbell rings acted on (-1: poll once whatever the count)
        self.stop_received = False  # a ``stop`` was popped: the coordinator may exit from now on
        self._next_full_poll = 0.0  # wait_instruction's next read regardless of the doorbell (monotonic s)
        self.instructions: deque[dict] = deque()
        # duplicates only: an instruction may wait in the queue through a long step, so no age limit
        self._guard = P.ReplayGuard(max_age_s=None)
        self.heart = Heartbeat(self.world_rank)  # the heartbeat and watchdog threads (start_heartbeat)
        self.pending_signal: str | None = None  # a signal to pass on (note_signal), sent by the heartbeat thread
        self.signalled: str | None = None  # the signal this slot received (note_signal), kept
        self.board = None  # the node's heartbeat board (node_beats.NodeBoard) once heartbeats run per node
        self._board_stale_s: float | None = None  # records older than this do not keep the board (leave)
        self._commit: dict[str, Any] | None = None  # the newest commit report, carried by the node's heartbeats
        self._dist = dist
        self.incarnation = 0  # restarted coordinators this slot rejoined (a new store each time)
        self._restart_timeout_s = 0.0  # > 0: a closed connection means "away", not "lost" (start_heartbeat)
        self._away_since: float | None = None  # monotonic s: the coordinator's connection closed, none back yet
        self._away_reason = ""
        self.outbox = Outbox()  # reports kept while away (bounded), the newest commit and done
        self._registration: dict[str, Any] | None = None  # the register fields, sent again on a rejoin
        self._state: Callable[[], tuple[int | None, int | None]] | None = None

    def _connect(self, timeout_s: float | None = None):
        import torch.distributed as dist

        timeout = self._store_timeout if timeout_s is None else timedelta(seconds=timeout_s)
        return dist.TCPStore(self.host, self.port, is_master=False, timeout=timeout, wait_for_workers=False)

    def _push(self, body: dict[str, Any]) -> None:
        """Sign ``body`` and push it to the inbox over :attr:`store` (caller holds ``_lock``)."""
        self.store.queue_push(P.KEY_IN, P.encode(body, self.secret))

    def tcp_store(self):
        """A new TCPStore client to the coordinator's store (e.g. for ``PrefixStore(f"gen{g}", ...)``)."""
        return self._connect()

    # --- sending -----------------------------------------------------------------------------------
    def send(self, body: dict[str, Any]) -> None:
        """Sign ``body`` and push it to the coordinator's inbox (a push does not wait for an answer, so a
        slow or stopped coordinator does not hold the caller).

        Raises:
            torch.distributed.DistError: the store cannot be reached (the next call opens a new connection).
        """
        with self._lock:
            self.outbox.note(body)
            if self._away_since is not None:  # the coordinator is gone for now: keep it for the next one
                return self.outbox.keep(body)
            try:
                if self.store is None:
                    self.store = self._connect()
                self.outbox.flush(self._push)  # what was kept while the store could not be reached, in order
                self._push(body)
            except self._dist.DistError:
                self.store = None
                if self._restart_timeout_s > 0:  # a restart may be under way: keep it, do not fail the step
                    return self.outbox.keep(body)
                raise

    @property
    def away(self) -> bool:
        """Whether the coordinator's connection closed and no restarted coordinator was joined yet."""
        return self._away_since is not None

    def request(self, body: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        """Send ``body`` with a fresh ``reply_to`` and wait for the signed reply.

        Raises:
            ControlError: no reply within ``timeout_s`` (default ``wait_s``).
        """
        nonce = uuid.uuid4().hex
        with self._lock:  # a request goes out now or fails (never kept in the outbox)
            try:
                if self.store is None:
                    self.store = self._connect()
                self.store.queue_push(P.KEY_IN, P.encode({**body, "reply_to": nonce}, self.secret))
            except self._dist.DistError as exc:
                self.store = None
                raise ControlError(f"coordinator at {self.host}:{self.port} unreachable: {exc}".splitlines()[0]) from None
        deadline = time.monotonic() + (self.wait_s if timeout_s is None else timeout_s)
        key = P.key_reply(nonce)
        while time.monotonic() < deadline:
            try:
                with self._lock:
                    if self.store is None:
                        self.store = self._connect()
                    raw = self.store.queue_pop(key, block=False)
            except self._dist.QueueEmptyError:
                time.sleep(0.01)
                continue
            except self._dist.DistError:  # a connection that failed mid-operation is never reused
                with self._lock:
                    self.store = None
                time.sleep(0.1)
                continue
            try:
                reply = P.decode(raw, self.secret)
                self._guard.check(reply)
                return reply
            except P.ProtocolError:
                continue
        raise ControlError(f"no reply from the coordinator to {body.get('type')} within {timeout_s or self.wait_s:g}s")

    def register(self, *, node: str, role: str, logical_rank: int | None = None,
                 grid: tuple[int, int, int] | None = None, world_size: int | None = None,
                 placement_inputs: dict[str, Any] | None = None) -> dict[str, Any]:
        """Register this slot. Returns the coordinator's ``registered`` reply.

        ``placement_inputs``: ``{"k": replicas per shard, "levels": [the failure-domain levels the placement
        uses], "domain": {level: domain name} of this slot's node or None}``, what every member feeds
        :func:`phoenix_hpc.topology.generation_placement`; the coordinator recomputes each generation's
        placement from them to judge a holder's claim on a replica whose owner never reported it.

        Raises:
            ControlError: the coordinator rejected the registration (the message says why) or did not answer.
        """
        self._registration = {"node": node, "role": role, "logical_rank": logical_rank,
                              "grid": list(grid) if grid else None, "world_size": world_size,
                              **({"placement_inputs": placement_inputs} if placement_inputs else {})}
        reply = self.request({"type": "register", "world_rank": self.world_rank, "pid": self.pid,
                              **self._registration})
        if reply.get("type") != "registered":
            raise ControlError(f"registration of world rank {self.world_rank} rejected: {reply.get('reason')}")
        if self._alive is None:  # held until the process ends: its closing is the exit signal
            self._open_alive()
        return reply

    def _open_alive(self) -> None:
        port = self.info.get("liveness_port")
        if not port:
            return
        from phoenix_hpc.control.liveness import AliveConnection, connect_alive

        sock = connect_alive(self.host, int(port), self.world_rank, self.pid, self.secret)
        self._alive = AliveConnection(sock, name=f"phoenix-liveness-{self.world_rank}",
                                      on_closed=self._connection_closed)

    def _connection_closed(self, why: str) -> None:
        """The liveness reader saw the coordinator's end close: away (a restart is expected) or lost."""
        if self._restart_timeout_s > 0 and self.heart.watching and not self.stop_received:
            with self._lock:
                if self._away_since is None:
                    self._away_since, self._away_reason = time.monotonic(), f"its connection closed ({why})"
                    self.store = None
            print(f"[phoenix] world rank {self.world_rank}: the coordinator is gone ({why}); training on, "
                  f"waiting up to {self._restart_timeout_s:g} s for its restart", file=sys.stderr, flush=True)
            return
        self.heart.judge()

    def _try_rejoin(self) -> bool:
        """Away: if ``coordinator.json`` names another coordinator process, re-register with it, open a new
        liveness connection and send what was kept. Returns whether the slot is back. Heartbeat thread."""
        if (self.run_dir / P.EXIT_STATUS_FILE).exists():  # it wrote its verdict: the job ended, nothing restarts
            self.heart.lose("the coordinator ended the job before this slot heard its stop")
            return False
        info = P.read_coordinator_file(self.run_dir)
        if info is None or info.get("pid") == self.info.get("pid") or info.get("protocol") != P.PROTOCOL_VERSION:
            return False
        old = (self.info, self.host, self.port)
        self.info, self.host, self.port = info, str(info["host"]), int(info["port"])
        with self._lock:
            self.store = None
        g, step = self._state() if self._state is not None else (None, None)
        try:
            reply = self.request({"type": "register", "world_rank": self.world_rank, "pid": self.pid,
                                  **(self._registration or {}),
                                  "rejoin": {"generation": g, "step": step, "buffered": len(self.outbox),
                                             "dropped": self.outbox.dropped}},
                                 timeout_s=self.heart.answer_timeout_s)
        except ControlError:  # not serving yet: the next round tries again
            self.info, self.host, self.port = old
            return False
        if reply.get("type") != "registered":
            self.heart.lose(f"the restarted coordinator refused this slot: {reply.get('reason')}")
            return False
        try:
            self._open_alive()
        except ControlError:
            return False
        with self._lock:
            try:
                if self.store is None:
                    self.store = self._connect()
                self.outbox.flush(self._push, resend=True)  # then the newest commit report, done
            except self._dist.DistError:
                self.store = None  # the rest goes with the next send
            away_s = time.monotonic() - (self._away_since or time.monotonic())
            self._away_since = None
            self.incarnation += 1
            self._rings_seen = -1
            self.heart.alive_now()
        print(f"[phoenix] world rank {self.world_rank}: rejoined the restarted coordinator (pid {info.get('pid')}) "
              f"after {away_s:.1f} s at step {step}", file=sys.stderr, flush=True)
        return True

    def heartbeat(self, generation: int | None, step: int | None) -> None:
        self.send({"type": "heartbeat", "world_rank": self.world_rank, "pid": self.pid,
                   "generation": generation, "step": step})

    def report_commit(self, generation: int, live_step: int, shards: dict[str, int],
                      replicas: dict[str, int], sent: dict[str, dict[str, Any]] | None = None,
                      interval: int = 1, params: list[list[Any]] | None = None) -> None:
        """Committed steps: ``shards`` {own shard id: committed local step}, ``replicas`` {shard id: step};
        ``sent`` (the owner's word, evidence for the recovery checks): {own shard id: {"holders": [logical
        ranks its replicas went to in this generation], "step": committed step, "hash": 8 hex digits}}.
        With a node board (heartbeats per node) the report rides on the node's next ``heartbeats`` message
        (at most one heartbeat interval later) instead of a message of its own. ``interval``: the protection
        interval m of the committed snapshot (runtime/interval.py; lost work is at most m steps).
        ``params``: ``[[committed step, digest], ...]`` of the newest commits (oldest first), each the 64-bit
        digest (16 hex digits) of the snapshot's parameter tensors that the coordinator compares with the DP
        peers' (control/agreement.py)."""
        extra = {"sent": sent} if sent else {}
        if params:
            extra["params"] = [list(p) for p in params]
        if interval != 1:
            extra["interval"] = int(interval)
        if self.board is not None:
            with self._lock:
                self._commit = {"g": generation, "live_step": live_step, "shards": dict(shards),
                                "replicas": dict(replicas), **extra}
            return
        self.send({"type": "commit", "world_rank": self.world_rank, "pid": self.pid, "generation": generation,
                   "live_step": live_step, "shards": shards, "replicas": replicas, **extra})

    def report_fault(self, generation: int, step: int, phase: str, exc: BaseException | None = None,
                     kind: str | None = None, message: str = "", detail: dict | None = None) -> None:
        """A fault seen inside the step (exception, collective timeout); ``kind`` overrides classification;
        ``detail``: fields the fault carries besides (a replica disagreement's ``corrupt_step``,
        ``agreed_step`` and ``params``: :attr:`phoenix_hpc.errors.ReplicaDisagreement.fault_detail`)."""
        self.send({**(detail or {}), "type": "fault", "world_rank": self.world_rank, "pid": self.pid,
                   "generation": generation, "step": step, "phase": phase, "kind": kind,
                   "exc_type": type(exc).__name__ if exc is not None else "",
                   "message": str(exc) if exc is not None else message,
                   **({"signalled": self.signalled} if self.signalled else {})})

    def report_checkpoint(self, step: int, path: str) -> None:
        self.send({"type": "checkpoint", "world_rank": self.world_rank, "pid": self.pid, "step": step,
                   "path": path})

    def report_quiesced(self, generation: int, live_step: int, shards: dict[str, list[int]],
                        replicas: dict[str, list[int]], dirty: bool, rejected: list | None = None,
                        numel: dict[str, int] | None = None) -> None:
        """Answer a ``quiesce``: the live step (optimizer steps fully applied), the steps of the verified
        copies (committed buffer first, then the previous one) of the own shard and of held replicas,
        ``dirty`` when the live state holds a partially applied update, and ``rejected``: ``[[shard id, step,
        reason], ...]`` of held replicas that failed verification now and are not offered; ``numel``:
        ``{"pp{pp}/tp{tp}": elements}`` of the own stage's flat optimizer vector (what a shrink re-partitions;
        engines that support one)."""
        body = {"type": "quiesced", "world_rank": self.world_rank, "pid": self.pid, "generation": generation,
                "live_step": live_step, "shards": shards, "replicas": replicas, "dirty": dirty}
        if rejected:
            body["rejected"] = [list(x) for x in rejected]
        if numel:
            body["opt_numel"] = {str(k): int(v) for k, v in numel.items()}
        self.send(body)

    def report_recovered(self, generation: int, report: dict[str, Any], timings: dict[str, float]) -> None:
        self.send({"type": "recovered", "world_rank": self.world_rank, "pid": self.pid,
                   "generation": generation, "report": report, "timings": timings})

    def report_stopping(self, generation: int, steps: list[int]) -> None:
        """Answer a planned end's ``stop``: the steps of this member's verified host snapshots
        (:mod:`phoenix_hpc.control.ending`)."""
        self.send({"type": "stopping", "world_rank": self.world_rank, "pid": self.pid, "generation": generation,
                   "steps": [int(s) for s in steps]})

    def report_shard_written(self, step: int, info: dict[str, Any]) -> None:
        """This member's shard of the final checkpoint of ``step`` is on disk (``info``: file, sha256,
        bytes, write_s), or could not be written (``info``: error)."""
        self.send({"type": "shard_written", "world_rank": self.world_rank, "pid": self.pid, "step": int(step),
                   **info})

    def note_signal(self, signame: str) -> None:
        """Called from a signal handler: the heartbeat thread passes ``signame`` on to the coordinator
        (``signal``), which ends the job as planned. Only sets a field (signal-safe)."""
        self.pending_signal = signame
        self.signalled = signame  # kept: a fault this slot reports from now on is a consequence of the stop

    def report_done(self, generation: int, step: int, state_hash: str) -> None:
        """This member finished at ``step`` with ``state_hash``. With a node board the newest commit report of
        ``generation`` goes with it (``commit``): a report still waiting for the node's next heartbeat would
        otherwise never arrive, and the coordinator's last ``commit`` record (what ``phoenix status`` shows
        after the end) would miss this member's copies."""
        with self._lock:
            commit = self._commit if self._commit is not None and self._commit.get("g") == generation else None
        self.send({"type": "done", "world_rank": self.world_rank, "pid": self.pid, "generation": generation,
                   "step": step, "state_hash": state_hash, **({"commit": commit} if commit else {})})

    # --- receiving ---------------------------------------------------------------------------------
    def _doorbell(self):
        """The liveness connection when it can ring (open), else None (then every call polls)."""
        a = self._alive
        return None if a is None or a.closed is not None else a

    @property
    def rings(self) -> int | None:
        """The doorbell's ring count, or None without an open liveness connection."""
        a = self._doorbell()
        return None if a is None else a.rings

    def poll_if_rung(self) -> list[dict[str, Any]]:
        """:meth:`poll` if the doorbell rang since the last poll (always without a liveness connection);
        else ``[]`` without touching the store."""
        rings = self.rings
        if rings is not None and rings == self._rings_seen:
            return []
        return self.poll()

    def wait_ring(self, timeout_s: float) -> None:
        """Sleep until the doorbell rings (or ``timeout_s`` passes; without a liveness connection, just
        sleep ``timeout_s``)."""
        a = self._doorbell()
        if a is None:
            time.sleep(timeout_s)
        else:
            a.wait_ring(self._rings_seen, timeout_s)

    def poll(self) -> list[dict[str, Any]]:
        """Pop every pending instruction. An ``inject`` instruction is armed (kept in :attr:`injections`)
        when this slot has not started its step yet (:attr:`started_step`; the training loop keeps it) and
        refused otherwise, and a ``disarm`` drops one; both are answered with ``inject_ack``. The other
        instructions are returned in order (and not kept).

        Raises:
            ControlError: the coordinator's store cannot be reached and nothing was received.
        """
        out = []
        if self._away_since is not None:  # no coordinator to hear from until one is back
            return out
        key = P.key_out(self.world_rank)
        rings = self.rings  # read before popping: a ring during the pops makes the next poll_if_rung pop again
        while True:
            try:
                with self._lock:
                    if self.store is None:  # the previous connection failed mid-operation: a new one
                        self.store = self._connect()
                    raw = self.store.queue_pop(key, block=False)
            except self._dist.QueueEmptyError:
                self._rings_seen = -1 if rings is None else rings
                break
            except self._dist.DistError as exc:  # the store (coordinator) is unreachable, slow, or gone
                with self._lock:
                    self.store = None  # a reply may still come on that connection: never reuse it
                if out or self._restart_timeout_s > 0:  # with restarts: nothing heard; the liveness connection judges
                    break
                raise ControlError(f"coordinator at {self.host}:{self.port} unreachable: {exc}".splitlines()[0]) from None
            try:
                msg = P.decode(raw, self.secret)
                self._guard.check(msg)  # an instruction sent again (a replayed stop, inject) is dropped
                if msg["type"] == "recover":
                    msg = P.resolve_plan(msg, self._get_locked, self.secret)  # the plan is stored once, by key
            except P.ProtocolError:
                continue
            except self._dist.DistError:  # the plan could not be read: as if the instruction never came
                continue
            if self.armed.handle(msg):  # inject, disarm, drain, undrain: armed or refused, and answered
                continue
            if msg["type"] == "stop":
                self.stop_received = True
            out.append(msg)
        return out

    def _get_locked(self, key: str) -> bytes:
        with self._lock:
            return self.store.get(key)

    def wait_instruction(self, types: tuple[str, ...], timeout_s: float,
                         poll_s: float = 0.02, fallback_s: float = 2.0) -> dict[str, Any] | None:
        """Wait up to ``timeout_s`` for an instruction whose type is in ``types`` (a ``stop`` always returns).
        Other instructions are queued in :attr:`instructions`. Returns None on timeout. Pops the store when
        the doorbell rang, and every ``fallback_s`` regardless (a ring lost with a broken connection); every
        ``poll_s`` without a liveness connection.

        Raises:
            ControlError: the store cannot be reached when it is polled.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            if self._doorbell() is None or time.monotonic() >= self._next_full_poll:
                self._next_full_poll = time.monotonic() + fallback_s  # across calls: callers wait in slices
                msgs = self.poll()
            else:
                msgs = self.poll_if_rung()
            for i, msg in enumerate(msgs):
                if msg["type"] in types or msg["type"] == "stop":
                    self.instructions.extend(msgs[i + 1:])  # what came after it (e.g. a re-plan's quiesce)
                    return msg
                self.instructions.append(msg)
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            a = self._doorbell()
            if a is None:
                time.sleep(min(poll_s, left))
            else:
                a.wait_ring(self._rings_seen, min(left, max(0.0, self._next_full_poll - time.monotonic())))

    # --- heartbeat + watchdog ----------------------------------------------------------------------
    def start_heartbeat(self, interval_s: float, timeout_s: float,
                        state: Callable[[], tuple[int | None, int | None]],
                        on_lost: Callable[[str], None] = default_on_lost, lost_after_s: float | None = None,
                        grace_s: float = 0.0, node: str | None = None,
                        restart_timeout_s: float = 0.0) -> None:
        """Start the heartbeat thread (sends ``state() -> (generation, step)`` every ``interval_s``; a store
        operation slower than ``timeout_s`` counts as no answer) and the coordinator watchdog
        (``on_lost(reason)`` on evidence that the coordinator is gone,
        :func:`~phoenix_hpc.control.detect.coordinator_verdict`: its connection closed, or no answer for
        ``lost_after_s`` seconds, default ``timeout_s``, ``resilience.coordinator_timeout_s`` under the rank
        entry point, judged only after ``grace_s`` seconds from now, ``resilience.coordinator_grace_s``).

        With ``node`` (this slot's node name) heartbeats and commit reports go through the node's board
        (:mod:`phoenix_hpc.control.node_beats`): one slot of the node sends one ``heartbeats`` message for
        all of them; if the board cannot be created, this slot heartbeats alone.
        ``restart_timeout_s`` > 0 (``resilience.coordinator_restart_timeout_s`` when restarts are on): a closed
        connection makes the slot wait that long for a restarted coordinator, training on (module docstring)."""
        lost_after_s = timeout_s if lost_after_s is None else lost_after_s
        if node is not None and self.board is None:
            from phoenix_hpc.control.node_beats import NodeBoard, board_dir

            try:
                self.board = NodeBoard(board_dir(self.secret, node), self.world_rank)
            except OSError as exc:
                print(f"[phoenix] world rank {self.world_rank}: no node heartbeat board ({exc}); heartbeating "
                      "alone", file=sys.stderr, flush=True)
        self._restart_timeout_s, self._state = float(restart_timeout_s), state
        self.heart.start(
            interval_s, timeout_s, connect=self._connect, beat=lambda store: self._beat(store, interval_s, timeout_s),
            rejoin=self._try_rejoin, away=self._away, ending=lambda: self.stop_received,
            # with restarts a closed connection means "away" (_connection_closed), judged by the away rule
            closed=lambda: None if self._alive is None or self._restart_timeout_s > 0 else self._alive.closed,
            on_lost=on_lost, lost_after_s=lost_after_s, grace_s=grace_s, restart_timeout_s=self._restart_timeout_s)

    def _away(self) -> tuple[float, str] | None:
        """(since, reason) while the coordinator is away, else None."""
        return None if (since := self._away_since) is None else (since, self._away_reason)

    def _beat(self, store, interval_s: float, timeout_s: float) -> int | None:
        """One heartbeat of this slot (heartbeat thread): pass on a pending signal, then beat through the node's
        board or alone. Returns the coordinator's beat counter (None: no fresh reading). Raises OSError (the
        board cannot be written) or torch.distributed.DistError (the store failed)."""
        g, step = self._state()
        sig = self.pending_signal
        if sig is not None:
            store.queue_push(P.KEY_IN, P.encode({"type": "signal", "world_rank": self.world_rank,
                                                 "pid": self.pid, "signal": sig}, self.secret))
            self.pending_signal = None
        if self.board is not None:
            return self._beat_on_board(store, g, step, interval_s, timeout_s)
        store.queue_push(P.KEY_IN, P.encode({"type": "heartbeat", "world_rank": self.world_rank, "pid": self.pid,
                                             "generation": g, "step": step}, self.secret))
        return store.add(P.KEY_BEAT, 0)

    def _beat_on_board(self, store, g: int | None, step: int | None, interval_s: float, timeout_s: float) -> int | None:
        """:func:`phoenix_hpc.control.node_beats.beat_on_board` with this slot's record and newest commit report."""
        from phoenix_hpc.control.node_beats import CARRIER_FRESH_INTERVALS, beat_on_board

        with self._lock:
            commit = self._commit
        self._board_stale_s = timeout_s + CARRIER_FRESH_INTERVALS * interval_s  # for leave() at the end
        return beat_on_board(self.board, store, {"pid": self.pid, "g": g, "step": step, "t": time.time(),
                                                 "commit": commit}, world_rank=self.world_rank, pid=self.pid,
                             secret=self.secret, interval_s=interval_s, timeout_s=timeout_s)

    def stop_heartbeat(self, join_timeout_s: float = 15.0) -> None:
        """Stop the heartbeat and watchdog threads (waits for them)."""
        self.heart.stop(join_timeout_s)

    # --- the armed instructions (ArmedInstructions), read and set by the training loop -------------------
    injections = _on_armed("injections", "The armed injections (:attr:`ArmedInstructions.injections`).")
    injections_lock = _on_armed("lock", "The lock of :attr:`injections` and :attr:`drain`, shared with the fault "
                                "trigger.")
    drain = _on_armed("drain", "The armed planned drain ``{request_id, at_step}``, or None.", settable=True)
    started_step = _on_armed("started_step", "The iteration this slot is in (set by the training loop): "
                             "instructions for it come too late.", settable=True)
    last_step = _on_armed("last_step", "The job's last step, when known (an injection past it is refused).",
                          settable=True)

    def take_drain(self, step: int) -> dict[str, Any] | None:
        """:meth:`ArmedInstructions.take_drain`."""
        return self.armed.take_drain(step)

    def take_injection(self, step: int, phase: str) -> "Injection | None":
        """:meth:`ArmedInstructions.take_injection`."""
        return self.armed.take_injection(step, phase)

    def close(self) -> None:
        """Stop the heartbeat; close the liveness connection (from then on the coordinator reads this slot
        as exited unless it finished or was already declared dead)."""
        self.stop_heartbeat()
        self.stop_received = True
        if self.board is not None:
            self.board.leave(stale_s=self._board_stale_s)
        if self._alive is not None:
            self._alive.close()
        self.store = None
