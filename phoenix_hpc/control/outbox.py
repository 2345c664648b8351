"""What a slot keeps for its coordinator while that one is away (docs/design.md, coordinator restart).

While the coordinator's connection is closed and a restarted coordinator is awaited, a slot's reports go to
an :class:`Outbox` instead of the store: heartbeats are not kept, a newer commit report replaces an older
one, beyond :data:`OUTBOX_MAX` messages the oldest are dropped and counted (:func:`keep_report`). When the
slot rejoins a restarted coordinator it sends what was kept, in order, and then the newest report of each
:data:`RESENT_TYPES` type that was not among them (own shard and replicas held, ``done``).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

OUTBOX_MAX = 1000  # reports kept while the coordinator is away (the oldest beyond it are dropped)
RESENT_TYPES = ("commit", "done")  # the newest of each is sent again to a restarted coordinator


def keep_report(outbox: deque, body: dict[str, Any], limit: int) -> int:
    """Keep a report for a coordinator that is away: heartbeats are not kept (the next one says more), a
    ``commit`` report replaces the older one kept (commit reports carry the newest committed steps), beyond
    ``limit`` messages the oldest are dropped. Mutates ``outbox``; returns how many were dropped."""
    t = body.get("type")
    if t == "heartbeat":
        return 0
    if t == "commit":
        for i, old in enumerate(outbox):
            if old.get("type") == "commit":
                del outbox[i]
                break
    outbox.append(body)
    dropped = 0
    while len(outbox) > limit:
        outbox.popleft()
        dropped += 1
    return dropped


class Outbox:
    """The reports kept while the coordinator is away, and the newest body of each :data:`RESENT_TYPES`
    type sent. Not thread-safe: the client holds its lock around every call."""

    def __init__(self, limit: int = OUTBOX_MAX):
        self.kept: deque[dict] = deque()
        self.dropped = 0  # reports dropped beyond ``limit``
        self.limit = limit
        self.newest: dict[str, dict] = {}  # the newest body of each RESENT_TYPES type

    def __len__(self) -> int:
        return len(self.kept)

    def note(self, body: dict[str, Any]) -> None:
        """``body`` is being sent: remember it if it is sent again to a restarted coordinator."""
        if body.get("type") in RESENT_TYPES:
            self.newest[body["type"]] = body

    def keep(self, body: dict[str, Any]) -> None:
        """Keep ``body`` (:func:`keep_report`)."""
        self.dropped += keep_report(self.kept, body, self.limit)

    def flush(self, push: Callable[[dict[str, Any]], None], resend: bool = False) -> None:
        """Push what was kept, first and in order (each removed once pushed); with ``resend``, then the newest
        body of each :data:`RESENT_TYPES` type not among them.

        Raises:
            whatever ``push`` raises; what was not pushed stays kept.
        """
        sent = set()
        while self.kept:
            sent.add(self.kept[0].get("type"))
            push(self.kept[0])
            self.kept.popleft()
        if resend:
            for t, body in self.newest.items():
                if t not in sent:
                    push(body)
