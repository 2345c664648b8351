"""The coordinator's message transport: reading the inbox and the operator channel, decoding and checking
signed messages, dispatching them through the coordinator's table of handlers
(:data:`phoenix_hpc.control.coordinator.HANDLERS`), and sending, replying and rejecting.

:class:`MessagingMixin` is part of :class:`phoenix_hpc.control.coordinator.Coordinator`; it uses the
coordinator's store, operator server, secret, replay guard, journal and counters. Every message passes a
:class:`~phoenix_hpc.control.protocol.ReplayGuard`: replayed or stale signed messages are rejected and
journalled (each distinct rejection once). A handler raising ``KeyError``/``TypeError``/``ValueError`` on a
malformed body is turned into a rejection, never a crash of the coordinator.
"""

from __future__ import annotations

from phoenix_hpc.control import events as E
from phoenix_hpc.control import protocol as P
from phoenix_hpc.control.commands import CountRejected, Hold, Outcome, Reject, Release, Reply, Send
from phoenix_hpc.control.operator import REPLY_PREFIX as OPERATOR_REPLY_PREFIX


class MessagingMixin:
    """Message transport and dispatch for the coordinator (single-threaded, like the rest of it)."""

    def _drain_inbox(self) -> bool:
        import torch.distributed as dist

        n = 0
        try:
            while n < 1000:
                try:
                    raw = self.store.queue_pop(P.KEY_IN, block=False)
                except dist.QueueEmptyError:
                    break
                n += 1
                self._handle(raw)
        finally:
            self._sync_and_answer()
        return n > 0

    def _reply_after_sync(self, body: dict, reply: dict) -> None:
        """Answer ``body`` once the journal lines written so far are durable: at the end of this batch of
        messages (:meth:`_sync_and_answer`), after one ``fsync`` for the whole batch (group commit,
        :meth:`phoenix_hpc.control.journal.Journal.append_deferred`)."""
        self._after_sync.append((body, reply))

    def _sync_and_answer(self) -> None:
        """One ``fsync`` for the journal lines the batch deferred, then the answers that waited for it. O(answers)."""
        if self.journal is not None:
            self.journal.sync()
        answers, self._after_sync = self._after_sync, []
        for body, reply in answers:
            self._reply(body, reply)

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

    def _handle(self, raw: bytes) -> None:
        try:
            body = P.decode(raw, self.secret)
            self.replay_guard.check(body)
        except P.ProtocolError as exc:
            self._reject(str(exc), None, key=("decode", *exc.key))
            return
        self._dispatch(body)

    def _dispatch(self, body: dict) -> None:
        kind = body["type"]
        handler = self.handlers.get(kind) if isinstance(kind, str) else None  # the table: coordinator.HANDLERS
        if handler is None:
            self._reject(f"unknown message type {kind!r}", body)
            return
        try:
            handler(self, body)
        except (KeyError, TypeError, ValueError) as exc:
            self._reject(f"malformed {body['type']} message: {type(exc).__name__}: {exc}", body)

    def _carry_out(self, out: Outcome) -> None:
        """Journal a decision's events, then carry out its commands in order (control/commands.py)."""
        for ev in out.events:
            self.journal.append(ev)
        for c in out.commands:
            if isinstance(c, Send):
                self._send(c.world_rank, dict(c.body))
            elif isinstance(c, Reply):
                self._reply(c.request, dict(c.body))
            elif isinstance(c, Reject):
                self._reject(c.reason, c.request, key=c.key)
            elif isinstance(c, Hold):
                self._held_replies.add(str(c.request.get("reply_to")))
            elif isinstance(c, Release):
                self._release_reply(c.request, dict(c.body))
            elif isinstance(c, CountRejected):
                self.counters["rejected"] += 1
            else:
                raise TypeError(f"not a command: {c!r}")

    def _release_reply(self, request: dict, reply: dict) -> None:
        """Answer a request whose answer was held (:class:`~phoenix_hpc.control.commands.Hold`), and close its
        operator connection if the reply did not."""
        to = str(request.get("reply_to"))
        self._held_replies.discard(to)
        self._reply(request, reply)
        if to.startswith(OPERATOR_REPLY_PREFIX) and to[len(OPERATOR_REPLY_PREFIX):].isdigit() and self.operator:
            self.operator.finish(int(to[len(OPERATOR_REPLY_PREFIX):]))  # closed, if the reply did not go out

    def _send(self, world_rank: int, body: dict) -> None:
        self._send_encoded(world_rank, P.encode(body, self.secret))

    def _send_encoded(self, world_rank: int, raw: bytes) -> None:
        """Queue the signed message ``raw`` for ``world_rank`` and ring its doorbell at the next :meth:`_ring`
        (a slot reads its queue only after a ring, besides a slow safety read)."""
        self.store.queue_push(P.key_out(world_rank), raw)
        self._to_ring.add(world_rank)

    def _ring(self) -> None:
        """Ring the doorbell of every slot that got an instruction since the last call
        (:mod:`phoenix_hpc.control.liveness`). One store round trip first: the store server handles one
        connection's requests in order, so the pushes are in the queues before any slot looks."""
        if not self._to_ring or self.liveness is None:
            return
        rung, self._to_ring = self._to_ring, set()
        self.store.queue_len(P.key_out(next(iter(rung))))
        self.liveness.ring(sorted(rung))

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
            self.journal.append(E.Rejected(reason=reason, message_type=(body or {}).get("type"),
                                           world_rank=(body or {}).get("world_rank")))
        if body is not None and reply:
            self._reply(body, {"type": "rejected", "reason": reason})
