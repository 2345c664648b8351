"""What a journal event is (:mod:`phoenix_hpc.control.events` declares every one): a frozen dataclass
with a ``NAME``, turned into a journal record and back, and the registry of the names.

:meth:`Event.to_record` gives ``{"event": NAME, **fields}`` without ``ts`` (the journal stamps it) and
without the fields that are :data:`OMIT` (written only sometimes); :meth:`Event.from_record` and
:func:`from_record` take a record back (see :mod:`phoenix_hpc.control.events` for the rules). The fields'
types are checked by pydantic: one strict validator per annotation (:func:`_validator`, built once), which only
checks; the event is built from the record's own values.
"""

from __future__ import annotations

import functools
import json
import types
from dataclasses import dataclass, field, fields
from typing import Annotated, Any, ClassVar, Iterable, Mapping, Union, get_args, get_origin, get_type_hints

from annotated_types import Ge
from pydantic import ConfigDict, TypeAdapter
from pydantic_core import SchemaValidator


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
    """A record cannot be an event: not a mapping, its ``event`` is not a non-empty string, its ``ts`` is not a
    finite number, a field of the class's ``REQUIRED`` is missing, or a field's value is not of the field's type
    (:func:`allowed` says what is, in words)."""


NON_NEGATIVE = Ge(0)  # an Annotated marker (pydantic checks it): the number is >= 0
Nat = Annotated[int, NON_NEGATIVE]  # a step, a rank, a generation, a count, a PID: an integer >= 0
Grid = Union[list[Nat], dict[str, Nat]]  # [tp, pp, dp] or {"tp", "pp", "dp"}
RankMap = list[list[Nat]]  # [[logical rank, world rank], ...]

# A field's value is checked as JSON gave it: strict (a bool is not an integer, a string is not a number, a
# tuple is not a list; an integer is a number) and finite (json.loads reads NaN and Infinity; no field takes
# them).
_JSON = ConfigDict(strict=True, allow_inf_nan=False)


def allowed(tp: Any) -> str:
    """What a field annotated ``tp`` allows, in words (the end of an :class:`EventError` message). JSON's types
    only: ``int`` (not a bool), ``float`` (an int or a float, finite: no NaN or infinity), ``str``, ``bool``,
    ``None``, ``list[T]``, ``dict[str, T]``, unions of them, ``Annotated[int | float, NON_NEGATIVE]`` (>= 0) and
    ``Any``. The check itself is pydantic's (:func:`_validator`). Pure.

    Raises:
        TypeError: an annotation outside that vocabulary (a declaration error, found when the class is first
            read: pydantic would take types a JSON line cannot hold, and constraints these words do not say).
    """
    if tp is Any:
        return "anything"
    origin = get_origin(tp)
    if origin is Annotated:
        base, *meta = get_args(tp)
        if base not in (int, float) or meta != [NON_NEGATIVE]:
            raise TypeError(f"no journal rule for the annotation {tp!r}: only int or float >= 0 is annotated")
        return f"{allowed(base)} >= 0"
    if origin is Union or origin is types.UnionType:
        args = get_args(tp)
        words = [allowed(a) for a in args if a is not type(None)]
        if "anything" in words:
            return "anything"
        return " or ".join(words) + (" or null" if type(None) in args else "")
    if tp is type(None):
        return "null"
    if tp is bool:
        return "true or false"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a finite number"
    if tp is str:
        return "a string"
    if origin is list:
        (elem,) = get_args(tp)
        what = allowed(elem)
        return "a list" if what == "anything" else f"a list of ({what})"
    if origin is dict:
        key, val = get_args(tp)
        if key is not str:
            raise TypeError(f"a journal object's keys are strings, not {key!r}")
        what = allowed(val)
        return "an object" if what == "anything" else f"an object of ({what})"
    raise TypeError(f"no journal rule for the annotation {tp!r}")


def _short(x: Any) -> str:
    """``x`` as the journal spells it (JSON), cut to 60 characters."""
    try:
        r = json.dumps(x)
    except (TypeError, ValueError):
        r = repr(x)
    return r if len(r) <= 60 else r[:57] + "..."


@functools.cache
def _validator(tp: Any) -> SchemaValidator:
    """pydantic's strict validator of annotation ``tp`` (:data:`_JSON`), built once per annotation (the event
    classes share about twenty)."""
    return TypeAdapter(tp, config=_JSON).validator


# a field's check: (its validator, what it allows in words)
_Check = tuple[SchemaValidator, str]
_CHECKS: dict[type, dict[str, _Check]] = {}


def _checks(cls: type) -> dict[str, _Check]:
    """The check of every field of event class ``cls`` but ``ts`` and ``extra``, built once.

    Raises:
        TypeError: a field annotation outside :func:`allowed`'s vocabulary, or a ``REQUIRED`` name that is no
            field of ``cls``.
    """
    got = _CHECKS.get(cls)
    if got is None:
        hints = get_type_hints(cls, include_extras=True)
        names = [f.name for f in fields(cls) if f.name not in ("ts", "extra")]
        if set(cls.REQUIRED) - set(names):
            raise TypeError(f"{cls.__name__}.REQUIRED names no field: {sorted(set(cls.REQUIRED) - set(names))}")
        words = {n: allowed(hints[n]) for n in names}  # first: pydantic takes more than JSON holds
        got = _CHECKS[cls] = {n: (_validator(hints[n]), words[n]) for n in names}
    return got


@dataclass(frozen=True, kw_only=True)
class Event:
    """One journal record. ``ts``: when it was written (None for one not written yet); ``extra``: fields the
    class does not declare (see the module docstring)."""

    NAME: ClassVar[str] = ""
    REQUIRED: ClassVar[tuple[str, ...]] = ()  # fields a record must have (the others take their default)
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
        """The event of journal record ``rec``: fields missing from it take their defaults; each field it has
        is checked against the field's annotation (pydantic, strict: :func:`_validator`) and passed on as the
        record holds it (an integer in a ``float`` field stays an integer). Pure.

        Raises:
            EventError: ``ts`` is not a finite number (unix seconds), a field of :attr:`REQUIRED` is missing,
                or a field's value is not what its annotation allows (the message names the field, the value
                and what is allowed).
        """
        checks = _checks(cls)
        kw, extra = {}, {}
        for k, v in rec.items():
            check = checks.get(k)
            if check is not None:
                if not check[0].isinstance_python(v):  # only checks: the event gets v itself
                    raise EventError(f"field {k!r} is {_short(v)}: allowed {check[1]}")
                kw[k] = v
            elif k != "ts" and k != "event":
                extra[k] = v
        ts = rec.get("ts")
        if ts is not None and not _validator(float).isinstance_python(ts):
            raise EventError(f"field 'ts' is {_short(ts)}: allowed a finite number (unix seconds)")
        for name in cls.REQUIRED:
            if name not in kw:
                raise EventError(f"field {name!r} is missing: it is required")
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
    reason: str | None = OMIT
    message: str | None = OMIT


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
        return UnknownEvent(name=name, ts=float(ts) if _validator(float).isinstance_python(ts) else None,
                            extra={k: v for k, v in rec.items() if k not in ("ts", "event")})
    return cls.from_record(rec)


def well_typed(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The records :func:`from_record` takes, in order (one of an unknown event name too: it has no declared
    fields); the others are left out (the fold skips and names them), so that a reader of raw records after
    the fold sees no wrong type either. Pure."""
    out = []
    for rec in records:
        try:
            from_record(rec)
        except EventError:
            continue
        out.append(rec)
    return out


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

