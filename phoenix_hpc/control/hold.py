"""A test-only hold of the coordinator right after one point of the recovery protocol, so that an end-to-end
test can kill it inside a window that otherwise lasts milliseconds.

``PHOENIX_TEST_HOLD_AFTER=EVENT:SECONDS`` (unset: no hold). The only ``EVENT`` is ``recovery_start``: the
coordinator has journalled the start of a recovery and rung its survivors with the ``quiesce``; it then
journals ``test_hold`` {after, hold_s} and sleeps ``SECONDS`` in its loop, once. Only the first coordinator
of a job holds (``restart`` 0): the one its supervisor starts after a crash runs the recovery again without
a pause. Nothing else changes; the knob is for tests and drills on a local cluster, never a production job.
"""

from __future__ import annotations

from typing import Mapping

HOLD_ENV = "PHOENIX_TEST_HOLD_AFTER"
HOLD_EVENTS = ("recovery_start",)


def parse_hold(value: str | None) -> tuple[str, float] | None:
    """``"EVENT:SECONDS"`` -> ``(event, seconds)``; None or ``""`` -> None. Pure.

    Raises:
        ValueError: not two parts, an event not in :data:`HOLD_EVENTS`, or seconds not a number in (0, 3600].
    """
    if not value:
        return None
    event, sep, secs = value.partition(":")
    if not sep or event not in HOLD_EVENTS:
        raise ValueError(f"{HOLD_ENV}={value!r}: expected EVENT:SECONDS with EVENT one of {list(HOLD_EVENTS)}")
    try:
        s = float(secs)
    except ValueError:
        s = float("nan")
    if not 0 < s <= 3600:
        raise ValueError(f"{HOLD_ENV}={value!r}: SECONDS must be a number in (0, 3600], got {secs!r}")
    return event, s


def hold_of(environ: Mapping[str, str], restart: int) -> tuple[str, float] | None:
    """The hold a coordinator with restart number ``restart`` applies: :func:`parse_hold` of the variable for
    the first coordinator (``restart == 0``), None for a restarted one. Raises ValueError as parse_hold."""
    hold = parse_hold(environ.get(HOLD_ENV))
    return hold if restart == 0 else None
