"""Time in which the coordinator was not running: a pause (SIGSTOP), or a starved or swapped-out process.

While the coordinator's process does not run it reads no heartbeat, so on waking every slot would look
silent for the length of the pause and be declared dead. Silence is therefore counted only while the
coordinator was looking: :class:`PauseMeter` runs one daemon thread that wakes every ``tick_s`` and adds up
the part of each wake-up gap that exceeds ``threshold_s`` (:func:`unobserved_s`); the coordinator's loop
observes too, right before it judges silence (:meth:`PauseMeter.observe`, so a pause that just ended is
counted even if the thread has not woken yet; both share one last-observation time, nothing is counted
twice), collects that time (:meth:`PauseMeter.take`) and moves every live slot's last-seen time, every
pending fault's time and the recovery deadline forward by it. A process that is merely busy (handling a burst of messages) keeps the thread
running, so its slots' silence still counts and a dead slot is still found.
"""

from __future__ import annotations

import threading
import time
from typing import Callable


def unobserved_s(gap_s: float, tick_s: float, threshold_s: float) -> float:
    """The part of one wake-up gap during which the process did not run: ``gap_s - tick_s`` when the gap
    exceeds ``threshold_s`` (the thread overslept: stopped or starved), else 0 (normal scheduling jitter).

    Args:
        gap_s: seconds between two wake-ups of the meter thread.
        tick_s: the interval it sleeps, seconds.
        threshold_s: gaps up to this many seconds are jitter (>= ``tick_s``).
    """
    return max(0.0, gap_s - tick_s) if gap_s > threshold_s else 0.0


class PauseMeter:
    """Measures the coordinator's own pauses (see the module docstring).

    Args:
        tick_s: sleep interval of the meter thread, seconds (> 0).
        threshold_s: a wake-up gap longer than this counts as a pause (default ``4 * tick_s``).
        clock: monotonic seconds (injectable for tests).
    """

    def __init__(self, tick_s: float = 0.05, threshold_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not tick_s > 0:
            raise ValueError(f"tick_s must be > 0, got {tick_s!r}")
        self.tick_s = tick_s
        self.threshold_s = 4 * tick_s if threshold_s is None else threshold_s
        self.clock = clock
        self._lock = threading.Lock()
        self._pending = 0.0
        self._last = clock()
        self.longest_s = 0.0  # the longest single pause seen
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def observe(self) -> float:
        """Count the gap since the last observation (by either thread); returns the time counted."""
        with self._lock:
            now = self.clock()
            lost = unobserved_s(now - self._last, self.tick_s, self.threshold_s)
            self._last = now
            self._pending += lost
            self.longest_s = max(self.longest_s, lost)
        return lost

    def take(self) -> float:
        """Seconds of pause accumulated since the last call."""
        with self._lock:
            out, self._pending = self._pending, 0.0
        return out

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="phoenix-pause-meter", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            self.observe()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1.0)
