"""What a journal event is (:mod:`phoenix_hpc.control.events` declares every one): a frozen dataclass
with a ``NAME``, turned into a journal record and back, and the registry of the names.

:meth:`Event.to_record` gives ``{"event": NAME, **fields}`` without ``ts`` (the journal stamps it) and
without the fields that are :data:`OMIT` (written only sometimes); :meth:`Event.from_record` and
:func:`from_record` take a record back (see :mod:`phoenix_hpc.control.events` for the rules).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Mapping


class _Omit:
    """The value of a field the record leaves out (falsy, so ``if ev.drain:`` reads naturally)."""

    def __bool__(self) -> bool:
        return False

    def __copy__(self) -> "_Omit":
        return self

    def __deepcopy__(self, memo: dict) -> "_Omit":
        return self

    def __repr__(self) -> str:
        return "OMIT"


OMIT: Any = _Omit()


class EventError(ValueError):
    """A record cannot be an event: not a mapping, or its ``event`` is not a non-empty string."""


@dataclass(frozen=True, kw_only=True)
class Event:
    """One journal record. ``ts``: when it was written (None for one not written yet); ``extra``: fields the
    class does not declare (see the module docstring)."""

    NAME: ClassVar[str] = ""
    ts: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_record(self) -> dict[str, Any]:
        """``{"event": NAME, **fields}`` without ``ts`` and without fields that are :data:`OMIT`."""
        out: dict[str, Any] = {"event": self.NAME}
        for f in fields(self):
            if f.name in ("ts", "extra"):
                continue
            v = getattr(self, f.name)
            if v is not OMIT:
                out[f.name] = v
        out.update(self.extra)
        return out

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> "Event":
        """The event of journal record ``rec`` (fields missing from it take their defaults). Pure."""
        names = {f.name for f in fields(cls)} - {"ts", "extra"}
        kw = {k: v for k, v in rec.items() if k in names}
        extra = {k: v for k, v in rec.items() if k not in names and k not in ("ts", "event")}
        ts = rec.get("ts")
        return cls(ts=None if ts is None else float(ts), extra=extra, **kw)


@dataclass(frozen=True, kw_only=True)
class UnknownEvent(Event):
    """A record whose ``event`` no class here declares (a newer writer, or a foreign line)."""
    name: str = ""

    def to_record(self) -> dict[str, Any]:
        return {"event": self.name, **self.extra}


@dataclass(frozen=True, kw_only=True)
class JobEnd(Event):
    """A record that ends the job. ``JOB_STATE``: the job's final state; ``message``: how to continue."""

    JOB_STATE: ClassVar[str] = "failed"
    reason: Any = OMIT
    message: Any = OMIT


def event(name: str):
    """Class decorator: a frozen keyword-only event named ``name``, in the registry."""
    def wrap(cls):
        cls.NAME = name
        cls = dataclass(frozen=True, kw_only=True)(cls)
        if REGISTRY.setdefault(name, cls) is not cls:
            raise ValueError(f"journal event {name!r} declared twice")
        return cls
    return wrap


REGISTRY: dict[str, type[Event]] = {}


def from_record(rec: Mapping[str, Any]) -> Event:
    """The typed event of one journal record; an :class:`UnknownEvent` for a name no class declares. Pure.

    Raises:
        EventError: ``rec`` is not a mapping, or its ``event`` is not a non-empty string.
    """
    if not isinstance(rec, Mapping):
        raise EventError(f"a journal record is a JSON object, got {type(rec).__name__}")
    name = rec.get("event")
    if not isinstance(name, str) or not name:
        raise EventError(f"a journal record needs a non-empty string 'event', got {name!r}")
    cls = REGISTRY.get(name)
    if cls is None:
        ts = rec.get("ts")
        return UnknownEvent(name=name, ts=ts if isinstance(ts, (int, float)) else None,
                            extra={k: v for k, v in rec.items() if k not in ("ts", "event")})
    return cls.from_record(rec)


def name_of(event: type[Event] | Event | str) -> str:
    """The event name of a class, an event or a name (checked against the registry).

    Raises:
        EventError: a name no class declares.
    """
    if isinstance(event, str):
        if event not in REGISTRY:
            raise EventError(f"no journal event is named {event!r}")
        return event
    return event.NAME

