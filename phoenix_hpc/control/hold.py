"""A test-only hold of the coordinator right after one point of the recovery protocol, so that an end-to-end
test can kill it inside a window that otherwise lasts milliseconds.

``PHOENIX_TEST_HOLD_AFTER=EVENT:SECONDS`` (unset: no hold). The only ``EVENT`` is ``recovery_start``: the
coordinator has journalled the start of a recovery and rung its survivors with the ``quiesce``; it then
journals ``test_hold`` {after, hold_s} and sleeps ``SECONDS`` in its loop, once. Only the first coordinator
of a job holds (``restart`` 0): the one its supervisor starts after a crash runs the recovery again without
a pause. Nothing else changes; the knob is for tests and drills on a local cluster, never a production job.
It is read strictly with the other test-only variables (:mod:`phoenix_hpc.test_env`).
"""

from __future__ import annotations

from typing import Mapping

from phoenix_hpc.test_env import HOLD_ENV, HOLD_EVENTS, parse_hold  # noqa: F401 - the hold's reading


def hold_of(environ: Mapping[str, str], restart: int) -> tuple[str, float] | None:
    """The hold a coordinator with restart number ``restart`` applies: :func:`parse_hold` of the variable for
    the first coordinator (``restart == 0``), None for a restarted one. Raises ValueError as parse_hold."""
    hold = parse_hold(environ.get(HOLD_ENV))
    return hold if restart == 0 else None
