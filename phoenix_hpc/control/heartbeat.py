"""A slot's heartbeat thread and its coordinator watchdog.

Coordinator watchdog (docs/design.md section 7: ranks must not keep a dead job's allocation busy, and a
busy coordinator is not a dead one): :class:`Heartbeat`'s heartbeat thread runs one *beat* every
``heartbeat_interval_s`` (the client's: this slot's heartbeat, or the node's through its board,
:mod:`phoenix_hpc.control.node_beats`) and reads the coordinator's beat counter: a counter that moved is
proof that the coordinator's loop runs. While the coordinator is *away* (its connection closed and a restart
is expected, :mod:`phoenix_hpc.control.client`) the thread tries to rejoin a restarted one instead. A
separate watchdog thread calls ``on_lost(reason)`` once on evidence that the coordinator is gone
(:func:`phoenix_hpc.control.detect.coordinator_verdict`): the liveness connection closed by the
coordinator's end, or no answer for ``coordinator_timeout_s`` (much longer than ``heartbeat_timeout_s``)
while this slot's own heartbeats kept asking, after a start-up grace period; or an away coordinator that
did not come back within the restart timeout. The default ``on_lost`` prints the reason and ends the
process with exit code :data:`EXIT_COORDINATOR_LOST` (``os._exit``: the main thread may be blocked in a
collective that will never finish). Once the slot received ``stop`` (or closes) nothing is lost any more:
the coordinator exits after the job's end.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable

from phoenix_hpc.control.detect import coordinator_verdict

EXIT_COORDINATOR_LOST = 75  # EX_TEMPFAIL: the job's control plane is gone


def default_on_lost(reason: str) -> None:
    """Print ``reason`` (and how the run continues) and end the process with :data:`EXIT_COORDINATOR_LOST`."""
    from phoenix_hpc.control.ending import resume_hint

    run_dir = os.environ.get("RUN_DIR")  # exported by the batch script
    hint = (f"; the run continues in the chain's next job, if one is queued, or with {resume_hint(run_dir)}"
            if run_dir else "")
    print(f"[phoenix] coordinator lost ({reason}); exiting so the allocation is not held by an orphaned step{hint}",
          file=sys.stderr, flush=True)
    os._exit(EXIT_COORDINATOR_LOST)


class Heartbeat:
    """The heartbeat and watchdog threads of one slot (world rank ``world_rank``, named in thread names)."""

    def __init__(self, world_rank: int):
        self.world_rank = world_rank
        self._stop = threading.Event()
        self._hb_thread: threading.Thread | None = None
        self._wd_thread: threading.Thread | None = None
        self.last_ok = time.monotonic()
        self.last_unanswered: float | None = None  # start of the newest heartbeat exchange without proof of life
        self._asking_since: float | None = None  # start of the heartbeat exchange in flight
        self.answer_timeout_s = 10.0
        self._watch_started = self.last_ok
        self._lost_after_s = 60.0
        self._grace_s = 0.0
        self._on_lost: Callable[[str], None] | None = None
        self._lost_once = threading.Lock()
        self.lost_reason: str | None = None
        self._away: Callable[[], tuple[float, str] | None] = lambda: None
        self._closed: Callable[[], str | None] = lambda: None
        self._ending: Callable[[], bool] = lambda: False
        self._restart_timeout_s = 0.0

    @property
    def watching(self) -> bool:
        """Whether heartbeats were started and not stopped on purpose."""
        return self._on_lost is not None and not self._stop.is_set()

    def start(self, interval_s: float, timeout_s: float, *, connect: Callable[[float], Any],
              beat: Callable[[Any], int | None], rejoin: Callable[[], bool],
              away: Callable[[], tuple[float, str] | None], closed: Callable[[], str | None],
              ending: Callable[[], bool], on_lost: Callable[[str], None], lost_after_s: float,
              grace_s: float, restart_timeout_s: float) -> None:
        """Start both threads.

        Args:
            interval_s: seconds between beats (and the watchdog's longest sleep).
            timeout_s: a store operation slower than this counts as no answer.
            connect: ``connect(timeout_s)`` opens a store connection for the heartbeat thread.
            beat: ``beat(store)`` sends one beat; returns the coordinator's beat counter (None: none read).
            rejoin: while away, tries to rejoin a restarted coordinator.
            away: ``(since, reason)`` while the coordinator is away, else None.
            closed: why the liveness connection closed, when that means lost (None otherwise).
            ending: whether the slot heard its ``stop`` (nothing is lost from then on).
            on_lost: called once with the reason the coordinator is judged gone.
            lost_after_s, grace_s: :func:`coordinator_verdict`'s timeout and start-up grace.
            restart_timeout_s: how long an away coordinator may take to come back.
        """
        self._stop.clear()
        self.last_ok = self._watch_started = time.monotonic()
        self.last_unanswered = self._asking_since = None
        self._lost_after_s, self._grace_s, self._on_lost = lost_after_s, grace_s, on_lost
        self.answer_timeout_s = timeout_s
        self._away, self._closed, self._ending = away, closed, ending
        self._restart_timeout_s = restart_timeout_s

        def beat_loop() -> None:
            store = None
            last_beat = None
            while not self._stop.is_set():
                if away() is not None:  # no heartbeats to a dead store: look for its successor
                    store = last_beat = None
                    rejoin()
                    self._stop.wait(interval_s)
                    continue
                t_try = self._asking_since = time.monotonic()
                proof = False
                try:
                    if store is None:  # short timeout: an answer later than timeout_s proves nothing
                        store = connect(timeout_s)
                    b = beat(store)
                    if b is not None and b != last_beat:
                        last_beat = b
                        proof = True
                        self.last_ok = time.monotonic()
                except Exception:  # noqa: BLE001 - any store failure just means "no proof of life this round"
                    store = None
                self._asking_since = None
                if not proof:  # asked, and got no proof that the coordinator's loop runs
                    self.last_unanswered = t_try
                self._stop.wait(interval_s)

        def watch() -> None:
            while not self._stop.wait(min(interval_s, lost_after_s / 4)):
                if self.judge():
                    return

        self._hb_thread = threading.Thread(target=beat_loop, name=f"phoenix-heartbeat-{self.world_rank}",
                                           daemon=True)
        self._wd_thread = threading.Thread(target=watch, name=f"phoenix-watchdog-{self.world_rank}", daemon=True)
        self._hb_thread.start()
        self._wd_thread.start()

    def alive_now(self) -> None:
        """Proof of life outside a beat (a restarted coordinator took this slot back)."""
        self.last_ok = time.monotonic()
        self.last_unanswered = None

    def judge(self) -> bool:
        """Apply :func:`coordinator_verdict` now; on a loss call ``on_lost`` (once). Returns whether lost.
        Called by the watchdog thread, and by the liveness reader when the connection closed."""
        if not self.watching:  # heartbeats not started, or stopped on purpose
            return False
        away = self._away()
        if away is not None:
            since, why = away
            if self._ending() or time.monotonic() - since <= self._restart_timeout_s:
                return False
            return self.lose(f"{why}, and no restarted coordinator came back within "
                             f"coordinator_restart_timeout_s={self._restart_timeout_s:g}s")
        lost, reason = coordinator_verdict(
            time.monotonic(), started=self._watch_started, last_ok=self.last_ok,
            last_unanswered=self.last_unanswered, closed=self._closed(),
            timeout_s=self._lost_after_s, grace_s=self._grace_s, ending=self._ending(),
            asking_since=self._asking_since, answer_timeout_s=self.answer_timeout_s)
        if not lost:
            return False
        return self.lose(reason)

    def lose(self, reason: str) -> bool:
        """Call ``on_lost(reason)`` once. Returns True."""
        if not self._lost_once.acquire(blocking=False):
            return True
        self.lost_reason = reason
        self._on_lost(reason)
        return True

    def stop(self, join_timeout_s: float = 15.0) -> None:
        """Stop both threads (waits for them, except the calling one)."""
        self._stop.set()
        for t in (self._hb_thread, self._wd_thread):
            if t is not None and t is not threading.current_thread():
                t.join(join_timeout_s)
        self._hb_thread = self._wd_thread = None
