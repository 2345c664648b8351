"""Failure detection from heartbeats: pure functions of ``now`` and the last-seen times.

The coordinator records, per live slot, the time of the newest heartbeat it accepted (or of the slot's
registration, before any heartbeat). A slot is declared dead when ``now - last_seen > heartbeat_timeout_s``
(strictly greater, so a heartbeat that arrives exactly at the deadline still counts). The same rule, run by
each rank on the coordinator's heartbeat, makes ranks exit when the coordinator is gone
(:func:`coordinator_lost`). Times are seconds on one clock (the coordinator's ``time.monotonic``).

Other detection signals (process exit, collective timeout, exception inside the step) arrive as fault
reports and are handled by :mod:`phoenix_hpc.control.classify`.
"""

from __future__ import annotations

from typing import Hashable, Mapping, Protocol


class HeartbeatConfig(Protocol):
    """Anything with the resilience heartbeat settings (e.g. ``JobConfig.resilience``)."""

    heartbeat_interval_s: float
    heartbeat_timeout_s: float


def detect(
    now: float, heartbeats: Mapping[Hashable, float], cfg: HeartbeatConfig
) -> tuple[tuple[Hashable, ...], str]:
    """Slots whose last heartbeat is older than ``cfg.heartbeat_timeout_s``.

    Args:
        now: current time in seconds (same clock as the values of ``heartbeats``).
        heartbeats: slot id -> time of its last accepted heartbeat (or registration), seconds.
        cfg: provides ``heartbeat_timeout_s`` (seconds, > 0).

    Returns:
        ``(dead, reason)``: the dead slot ids sorted, and a human-readable reason naming each one with its
        silence (``""`` when none is dead).

    Raises:
        ValueError: ``heartbeat_timeout_s`` is not > 0.
    """
    timeout_s = float(cfg.heartbeat_timeout_s)
    if not timeout_s > 0:
        raise ValueError(f"heartbeat_timeout_s must be > 0, got {timeout_s}")
    silent = {slot: now - seen for slot, seen in heartbeats.items() if now - seen > timeout_s}
    if not silent:
        return (), ""
    dead = tuple(sorted(silent, key=lambda s: (str(type(s)), s)))
    parts = ", ".join(f"{s} silent {silent[s]:.1f}s" for s in dead)
    return dead, f"heartbeat timeout ({parts}; heartbeat_timeout_s={timeout_s:g})"


def coordinator_lost(now: float, last_ok: float, timeout_s: float) -> tuple[bool, str]:
    """The rank-side rule: the coordinator is gone when it has not answered for more than ``timeout_s``.

    ``last_ok`` is the time (seconds) of the last successful exchange in which the coordinator's beat
    counter had advanced. Returns ``(lost, reason)``.
    """
    silent = now - last_ok
    if silent > timeout_s:
        return True, f"coordinator silent for {silent:.1f}s > {timeout_s:g}s"
    return False, ""
