"""What a journal event is (:mod:`phoenix_hpc.control.events` declares every one): a frozen dataclass
with a ``NAME``, turned into a journal record and back, and the registry of the names.

:meth:`Event.to_record` gives ``{"event": NAME, **fields}`` without ``ts`` (the journal stamps it) and
without the fields that are :data:`OMIT` (written only sometimes); :meth:`Event.from_record` and
:func:`from_record` take a record back (see :mod:`phoenix_hpc.control.events` for the rules).
"""

from __future__ import annotations

import json
import math
import types
from dataclasses import dataclass, field, fields
from typing import Annotated, Any, Callable, ClassVar, Iterable, Mapping, Union, get_args, get_origin, get_type_hints


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
    finite number, or a field's value is not of the field's type (:func:`field_rule`)."""


NON_NEGATIVE = "non-negative"  # an Annotated marker: the number is >= 0
Nat = Annotated[int, NON_NEGATIVE]  # a step, a rank, a generation, a count, a PID: an integer >= 0
Grid = Union[list[Nat], dict[str, Nat]]  # [tp, pp, dp] or {"tp", "pp", "dp"}
RankMap = list[list[Nat]]  # [[logical rank, world rank], ...]

# a rule: (does the value conform, what is allowed in words)
Rule = tuple[Callable[[Any], bool], str]


def _finite(x: Any) -> bool:
    return (type(x) is int) or (type(x) is float and math.isfinite(x))


def _nat(x: Any) -> bool:
    return type(x) is int and x >= 0


def _any_of(oks: tuple[Callable[[Any], bool], ...]) -> Callable[[Any], bool]:
    def ok(x: Any) -> bool:
        for one in oks:
            if one(x):
                return True
        return False
    return ok


def field_rule(tp: Any) -> Rule | None:
    """The check of a field annotated ``tp`` (None: anything goes). JSON's types only: ``int`` (not a bool),
    ``float`` (an int or a float, finite: no NaN or infinity), ``str``, ``bool``, ``None``, ``list[T]``,
    ``dict[str, T]``, unions of them, ``Annotated[int | float, NON_NEGATIVE]`` (>= 0) and ``Any``. Pure.

    Raises:
        TypeError: an annotation outside that vocabulary (a declaration error, found when the class is first
            read).
    """
    if tp is Any:
        return None
    origin = get_origin(tp)
    if origin is Annotated:
        base, *meta = get_args(tp)
        rule = field_rule(base)
        if NON_NEGATIVE not in meta or rule is None:
            return rule
        ok, what = rule
        if base is int:
            return _nat, f"{what} >= 0"
        return (lambda x: ok(x) and x >= 0), f"{what} >= 0"
    if origin is Union or origin is types.UnionType:
        args = get_args(tp)
        rules = [field_rule(a) for a in args if a is not type(None)]
        if any(r is None for r in rules):
            return None
        what = " or ".join(w for _, w in rules) + (" or null" if type(None) in args else "")
        ok = rules[0][0] if len(rules) == 1 else _any_of(tuple(r[0] for r in rules))
        return ((lambda x: x is None or ok(x)) if type(None) in args else ok), what
    if tp is type(None):
        return (lambda x: x is None), "null"
    if tp is bool:
        return (lambda x: type(x) is bool), "true or false"
    if tp is int:
        return (lambda x: type(x) is int), "an integer"
    if tp is float:
        return _finite, "a finite number"
    if tp is str:
        return (lambda x: type(x) is str), "a string"
    if origin is list:
        (elem,) = get_args(tp) or (Any,)
        rule = field_rule(elem)
        if rule is None:
            return (lambda x: type(x) is list), "a list"
        ok, what = rule
        return (lambda x: type(x) is list and all(map(ok, x))), f"a list of ({what})"
    if origin is dict:
        key, val = get_args(tp) or (str, Any)
        if key is not str:
            raise TypeError(f"a journal object's keys are strings, not {key!r}")
        rule = field_rule(val)
        if rule is None:
            return (lambda x: type(x) is dict), "an object"
        ok, what = rule
        return (lambda x: type(x) is dict and all(map(ok, x.values()))), f"an object of ({what})"
    raise TypeError(f"no journal rule for the annotation {tp!r}")


def _short(x: Any) -> str:
    """``x`` as the journal spells it (JSON), cut to 60 characters."""
    try:
        r = json.dumps(x)
    except (TypeError, ValueError):
        r = repr(x)
    return r if len(r) <= 60 else r[:57] + "..."


_ANYTHING: Rule = (lambda x: True, "anything")
_RULES: dict[type, dict[str, Rule]] = {}


def _rules(cls: type) -> dict[str, Rule]:
    """The rule of every field of event class ``cls`` but ``ts`` and ``extra``, built once."""
    got = _RULES.get(cls)
    if got is None:
        hints = get_type_hints(cls, include_extras=True)
        got = _RULES[cls] = {f.name: field_rule(hints[f.name]) or _ANYTHING for f in fields(cls)
                             if f.name not in ("ts", "extra")}
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
        is checked against the field's annotation (:func:`field_rule`). Pure.

        Raises:
            EventError: ``ts`` is not a finite number (unix seconds), a field of :attr:`REQUIRED` is missing,
                or a field's value is not what its annotation allows (the message names the field, the value
                and what is allowed).
        """
        rules = _rules(cls)
        kw, extra = {}, {}
        for k, v in rec.items():
            rule = rules.get(k)
            if rule is not None:
                if not rule[0](v):
                    raise EventError(f"field {k!r} is {_short(v)}: allowed {rule[1]}")
                kw[k] = v
            elif k != "ts" and k != "event":
                extra[k] = v
        ts = rec.get("ts")
        if ts is not None and not _finite(ts):
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
        return UnknownEvent(name=name, ts=float(ts) if _finite(ts) else None,
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

