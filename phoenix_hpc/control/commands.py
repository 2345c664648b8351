"""What a control-plane decision asks the coordinator process to do, as plain data.

A decision function (:mod:`phoenix_hpc.control.injects`, :mod:`phoenix_hpc.control.arbitration`, ...) does no
I/O: it returns the journal events (:mod:`phoenix_hpc.control.events`) and the commands below. The
coordinator journals the events first, then carries out the commands in order
(:meth:`phoenix_hpc.control.messaging.Transport.carry_out`): a restarted coordinator and
``phoenix status`` read the journal, so what was decided is recorded before anything acts on it.

- :class:`Send`: an instruction to one slot (its queue, then its doorbell);
- :class:`Reply`: the answer to a request (its ``reply_to``, ``in_reply_to`` its nonce);
- :class:`Reject`: refuse a message or request, counted and journalled once per distinct ``key``;
- :class:`Hold`: the request is answered later (an operator connection stays open);
- :class:`Release`: the held answer: reply, then close the operator connection;
- :class:`CountRejected`: one more refused request in the counters (its journal record is an event).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Union

from phoenix_hpc.control.events import Event


@dataclass(frozen=True)
class Send:
    world_rank: int
    body: Mapping[str, Any]


@dataclass(frozen=True)
class Reply:
    request: Mapping[str, Any]
    body: Mapping[str, Any]


@dataclass(frozen=True)
class Reject:
    reason: str
    request: Mapping[str, Any] | None
    key: tuple | None = None


@dataclass(frozen=True)
class Hold:
    request: Mapping[str, Any]


@dataclass(frozen=True)
class Release:
    request: Mapping[str, Any]
    body: Mapping[str, Any]


@dataclass(frozen=True)
class CountRejected:
    pass


Command = Union[Send, Reply, Reject, Hold, Release, CountRejected]


@dataclass
class Outcome:
    """A decision's result: journal ``events`` first, then ``commands``, both in order."""

    events: list[Event]
    commands: list[Command]

    @classmethod
    def none(cls) -> "Outcome":
        return cls([], [])

    def add(self, other: "Outcome") -> "Outcome":
        """Append ``other`` (its events after these, its commands after these); returns self."""
        self.events += other.events
        self.commands += other.commands
        return self
