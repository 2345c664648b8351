"""The coordinator's message transport: reading the inbox and the operator channel, decoding and checking
signed messages, and sending, replying, rejecting and carrying out commands; and the dispatch of a message
through the coordinator's table of handlers (:data:`phoenix_hpc.control.coordinator.HANDLERS`).

:class:`Transport` is an object the coordinator holds (``Coordinator.transport``); it owns the channels (the
store, the operator and liveness servers, the secret, the replay guard; the coordinator's recorder, through
which a decision's events and the rejections are journalled and folded into its view) and
what the messaging keeps between calls (replies held or waiting for the journal's fsync, slots to ring,
rejections journalled). :func:`drain_inbox`, :func:`drain_operator`, :func:`handle` and :func:`dispatch` are
plain functions of the coordinator ``c`` (the handlers take it). Every message passes a
:class:`~phoenix_hpc.control.protocol.ReplayGuard`: replayed or stale signed messages are rejected and
journalled (each distinct rejection once). A handler raising ``KeyError``/``TypeError``/``ValueError`` on a
malformed body is turned into a rejection, never a crash of the coordinator.
"""

from __future__ import annotations

from typing import Any, Iterator

from phoenix_hpc.control import events as E
from phoenix_hpc.control import protocol as P
from phoenix_hpc.control.commands import CountRejected, Hold, Outcome, Reject, Release, Reply, Send
from phoenix_hpc.control.operator import REPLY_PREFIX as OPERATOR_REPLY_PREFIX
from phoenix_hpc.control.recorder import Recorder


def drain_inbox(c: Any) -> bool:
    """Handle up to 1,000 messages of the inbox, then sync the journal and send the answers that waited for
    it. Returns whether any message came."""
    n = 0
    try:
        for raw in c.transport.inbox(1000):
            n += 1
            handle(c, raw)
    finally:
        c.transport.sync_and_answer()
    return n > 0


def drain_operator(c: Any) -> bool:
    """Requests from the operator channel (:mod:`phoenix_hpc.control.operator`): handled like store
    messages; the reply goes back over the request's connection."""
    t = c.transport
    if t.operator is None:
        return False
    reqs = t.operator.poll()
    for cid, raw in reqs:
        try:
            body = P.decode(raw, t.secret)
            t.replay_guard.check(body)
        except P.ProtocolError as exc:
            t.reject(f"operator channel: {exc}", None, key=("operator", *exc.key))
            t.operator.finish(cid)
            continue
        to = f"{OPERATOR_REPLY_PREFIX}{cid}"
        dispatch(c, {**body, "reply_to": to})
        if to not in t.held_replies:  # an inject is answered once its targets confirmed it
            t.operator.finish(cid)
    return bool(reqs)


def _operator_cid(reply_to: str) -> int | None:
    """The operator connection id a ``reply_to`` of the form ``operator:<digits>`` names, else None."""
    cid = reply_to[len(OPERATOR_REPLY_PREFIX):] if reply_to.startswith(OPERATOR_REPLY_PREFIX) else ""
    return int(cid) if cid.isdigit() else None


def handle(c: Any, raw: bytes) -> None:
    """Decode and check one signed message of the inbox, then :func:`dispatch` it (or reject it)."""
    try:
        body = P.decode(raw, c.transport.secret)
        c.transport.replay_guard.check(body)
    except P.ProtocolError as exc:
        c.transport.reject(str(exc), None, key=("decode", *exc.key))
        return
    dispatch(c, body)


def dispatch(c: Any, body: dict) -> None:
    """Call the handler of ``body``'s type from the coordinator's table; an unknown type or a malformed body
    is rejected (and journalled)."""
    kind = body["type"]
    handler = c.handlers.get(kind) if isinstance(kind, str) else None  # the table: coordinator.HANDLERS
    if handler is None:
        c.transport.reject(f"unknown message type {kind!r}", body)
        return
    try:
        handler(c, body)
    except (KeyError, TypeError, ValueError) as exc:
        c.transport.reject(f"malformed {body['type']} message: {type(exc).__name__}: {exc}", body)


class Transport:
    """The coordinator's channels and sending (single-threaded, like the rest of the coordinator).

    Args:
        counters: the coordinator's message counters (``rejected`` is counted here).
        recorder: the coordinator's journal and view (control/recorder.py): every event is recorded there.
    """

    def __init__(self, counters: dict[str, int], recorder: Recorder | None = None):
        self.counters = counters
        self.recorder = recorder if recorder is not None else Recorder()
        self.store = None  # the job's TCPStore (server), after Coordinator.open()
        self.secret = b""
        self.operator = None  # control/operator.py OperatorServer, after open()
        self.liveness = None  # control/liveness.py LivenessServer, after open()
        self.replay_guard = P.ReplayGuard()  # replayed or stale signed messages are rejected (and journalled)
        self.rejected_once: set[tuple] = set()
        self.to_ring: set[int] = set()  # slots whose instruction queue got something since the last ring
        self.held_replies: set[str] = set()  # reply_to of requests answered later (injects being confirmed)
        self.after_sync: list[tuple[dict, dict]] = []  # answers that wait for the journal's fsync

    @property
    def journal(self) -> Any:
        """The recorder's :class:`~phoenix_hpc.control.journal.Journal` (None before ``open``)."""
        return self.recorder.journal

    @journal.setter
    def journal(self, journal: Any) -> None:
        self.recorder.journal = journal

    def inbox(self, limit: int) -> Iterator[bytes]:
        """Pop the raw messages of the inbox one at a time, at most ``limit``."""
        import torch.distributed as dist

        for _ in range(limit):
            try:
                yield self.store.queue_pop(P.KEY_IN, block=False)
            except dist.QueueEmptyError:
                return

    def reply_after_sync(self, body: dict, reply: dict) -> None:
        """Answer ``body`` once the journal lines written so far are durable: at the end of this batch of
        messages (:meth:`sync_and_answer`), after one ``fsync`` for the whole batch (group commit,
        :meth:`phoenix_hpc.control.journal.Journal.append_deferred`)."""
        self.after_sync.append((body, reply))

    def sync_and_answer(self) -> None:
        """One ``fsync`` for the journal lines the batch deferred, then the answers that waited for it. O(answers)."""
        if self.journal is not None:
            self.journal.sync()
        answers, self.after_sync = self.after_sync, []
        for body, reply in answers:
            self.reply(body, reply)

    def carry_out(self, out: Outcome) -> None:
        """Journal a decision's events, then carry out its commands in order (control/commands.py)."""
        for ev in out.events:
            self.recorder.append(ev)
        for c in out.commands:
            if isinstance(c, Send):
                self.send(c.world_rank, dict(c.body))
            elif isinstance(c, Reply):
                self.reply(c.request, dict(c.body))
            elif isinstance(c, Reject):
                self.reject(c.reason, c.request, key=c.key)
            elif isinstance(c, Hold):
                self.held_replies.add(str(c.request.get("reply_to")))
            elif isinstance(c, Release):
                self.release_reply(c.request, dict(c.body))
            elif isinstance(c, CountRejected):
                self.counters["rejected"] += 1
            else:
                raise TypeError(f"not a command: {c!r}")

    def release_reply(self, request: dict, reply: dict) -> None:
        """Answer a request whose answer was held (:class:`~phoenix_hpc.control.commands.Hold`), and close its
        operator connection if the reply did not."""
        to = str(request.get("reply_to"))
        self.held_replies.discard(to)
        self.reply(request, reply)
        cid = _operator_cid(to)
        if cid is not None and self.operator:
            self.operator.finish(cid)  # closed, if the reply did not go out

    def send(self, world_rank: int, body: dict) -> None:
        """Sign ``body`` and queue it for ``world_rank`` (:meth:`send_encoded`)."""
        self.send_encoded(world_rank, P.encode(body, self.secret))

    def send_encoded(self, world_rank: int, raw: bytes) -> None:
        """Queue the signed message ``raw`` for ``world_rank`` and ring its doorbell at the next :meth:`ring`
        (a slot reads its queue only after a ring, besides a slow safety read)."""
        self.store.queue_push(P.key_out(world_rank), raw)
        self.to_ring.add(world_rank)

    def ring(self) -> None:
        """Ring the doorbell of every slot that got an instruction since the last call
        (:mod:`phoenix_hpc.control.liveness`). One store round trip first: the store server handles one
        connection's requests in order, so the pushes are in the queues before any slot looks."""
        if not self.to_ring or self.liveness is None:
            return
        rung, self.to_ring = self.to_ring, set()
        self.store.queue_len(P.key_out(next(iter(rung))))
        self.liveness.ring(sorted(rung))

    def reply(self, body: dict, reply: dict) -> None:
        """Answer the request ``body`` (over its operator connection, or to its ``reply_to`` queue)."""
        to = body.get("reply_to")
        reply = {**reply, "in_reply_to": body.get("nonce")}
        if isinstance(to, str) and to.startswith(OPERATOR_REPLY_PREFIX):
            cid = _operator_cid(to)
            if self.operator is not None and cid is not None:
                self.operator.reply(cid, P.encode(reply, self.secret))
        elif isinstance(to, str) and to:
            self.store.queue_push(P.key_reply(to), P.encode(reply, self.secret))

    def reject(self, reason: str, body: dict | None, key: tuple | None = None, reply: bool = True) -> None:
        """Count a rejected message, journal each distinct ``key`` once, and answer ``body`` (with ``reply``)."""
        self.counters["rejected"] += 1
        key = key or (reason,)
        if key not in self.rejected_once:  # journal each distinct rejection once (stale heartbeats repeat)
            self.rejected_once.add(key)
            self.recorder.append(E.Rejected(reason=reason, message_type=(body or {}).get("type"),
                                           world_rank=(body or {}).get("world_rank")))
        if body is not None and reply:
            self.reply(body, {"type": "rejected", "reason": reason})
