"""The coordinator's own load, for the journal's ``heartbeat_summary``: how old heartbeats are when handled.

A heartbeat's *age at handling* is the coordinator's unix time when its handler runs minus the ``sent_at``
the sender stamped into the signed body (:func:`phoenix_hpc.control.protocol.stamp`): the time it waited
in the store's ``ctl/in`` queue behind other messages plus the coordinator's time to reach it. It grows
when the coordinator cannot keep up with the message rate, long before a live slot would be declared dead.
Across nodes it also holds the clock offset between the sender's node and the coordinator's (NTP: about a
millisecond).
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable


def percentile(sorted_values: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) of an ascending list by linear interpolation between closest ranks (numpy's
    default, "linear"). Raises ValueError on an empty list or ``q`` outside [0, 1]."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


class AgeWindow:
    """Ages at handling (seconds) collected since the last :meth:`take`. O(1) per :meth:`add`.

    Args:
        clock: unix time in seconds (the clock ``sent_at`` is stamped with); injectable for tests.
    """

    def __init__(self, clock: Callable[[], float] = time.time):
        self.clock = clock
        self._ages: list[float] = []

    def add(self, sent_at: Any) -> None:
        """Record one message's age; a ``sent_at`` that is not a finite number is ignored."""
        if isinstance(sent_at, (int, float)) and not isinstance(sent_at, bool) and math.isfinite(sent_at):
            self._ages.append(self.clock() - float(sent_at))

    def take(self) -> dict[str, float | int] | None:
        """``{"n", "p50_ms", "p99_ms", "max_ms"}`` of the ages since the last call (milliseconds, 3 decimals),
        or None when there were none; starts a new window."""
        ages, self._ages = sorted(self._ages), []
        if not ages:
            return None
        return {"n": len(ages), "p50_ms": round(1e3 * percentile(ages, 0.5), 3),
                "p99_ms": round(1e3 * percentile(ages, 0.99), 3), "max_ms": round(1e3 * ages[-1], 3)}
