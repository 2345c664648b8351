"""The per-rank quiesce watchdog: hears the coordinator's ``quiesce`` while the training thread is blocked
in a collective, and aborts the generation's communicators (docs/design.md section 12).

The training thread looks for instructions only between phases (``Member._poll``). A thread blocked in a
collective with a hung or disconnected peer would hear the quiesce only after
``resilience.collective_timeout_s``. While training runs (:meth:`QuiesceWatchdog.arm` ..
:meth:`disarm`), the watchdog thread ``phoenix-quiesce-{world_rank}`` sleeps on the slot's doorbell
(``client.wait_ring``: the coordinator rings it over the liveness connection when it queues an instruction,
:mod:`phoenix_hpc.control.liveness`) and then pops the slot's instructions (:meth:`pump`, also used by the
training thread, under one lock so that instructions keep their order in ``client.instructions``). Nothing
is read from the coordinator's store while no instruction waits, so the watchdog adds no load that grows
with ranks x time; a client without a doorbell (no liveness connection) is polled every ``interval_s``
instead. On the first ``quiesce`` or ``stop`` it calls ``on_quiesce(msg)``
(the member's :class:`phoenix_hpc.launch.abort.GenerationAbort`), once per arming; the message stays in
``client.instructions`` and is returned by :meth:`take_fired` so that the training thread, whose collective
then fails, treats the error as the quiesce it is instead of reporting a new fault.

The watchdog makes no MPI call and no collective; it uses the client's store connection under the client's
own lock, like the training thread.

Before the first training step, while the generation is built (process groups, engine, restore, protector:
seconds, tens of seconds on a loaded host), the training thread reads no instructions. :meth:`listen` makes
the thread pump them then without firing, so a slot answers an ``inject`` (arms or refuses it,
:meth:`phoenix_hpc.control.client.CoordinatorClient.poll`) while it starts up instead of after it; a
``quiesce`` or ``stop`` heard then waits in ``client.instructions`` for the first step's poll, as before.
Nothing else may poll the client while the watchdog listens or is armed.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from phoenix_hpc.errors import ControlError

FIRES_ON = ("quiesce", "stop")


class QuiesceWatchdog:
    """Args:
        client: the slot's :class:`phoenix_hpc.control.client.CoordinatorClient` (``poll()``,
            ``poll_if_rung()``, ``wait_ring(timeout_s)`` and the ``instructions`` deque).
        on_quiesce: called from the watchdog thread with the first ``quiesce``/``stop`` message of an
            arming; must be thread-safe and idempotent. It may be replaced before the first :meth:`arm`
            (a watchdog that listens from registration on is handed to the member that arms it).
        interval_s: the longest sleep on the doorbell while armed or listening (the poll interval without
            one), seconds (> 0).
        name: thread name.
    """

    def __init__(self, client: Any, on_quiesce: Callable[[dict[str, Any]], Any], interval_s: float = 0.1,
                 name: str = "phoenix-quiesce"):
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.client = client
        self.on_quiesce = on_quiesce
        self.interval_s = interval_s
        self.name = name
        self._pump_lock = threading.Lock()
        self._cv = threading.Condition()
        self._armed = False
        self._listening = False  # pump without firing (the generation is being built)
        self._closed = False
        self._fired: dict[str, Any] | None = None
        self._thread: threading.Thread | None = None

    # --- instruction pump (either thread) ---------------------------------------------------------------
    def pump(self, only_if_rung: bool = False) -> list[dict[str, Any]]:
        """Move every pending instruction from the coordinator into ``client.instructions`` (in order);
        return the ones moved. With ``only_if_rung`` the store is read only when the doorbell rang since the
        last read. Raises ControlError when the coordinator cannot be reached."""
        with self._pump_lock:
            msgs = self.client.poll_if_rung() if only_if_rung else self.client.poll()
            self.client.instructions.extend(msgs)
            return msgs

    # --- arming (training thread) --------------------------------------------------------------------------
    def listen(self) -> None:
        """Pump instructions at every doorbell ring (every ``interval_s`` without a doorbell) without firing
        (starts the thread on first use), until :meth:`arm` or :meth:`disarm`."""
        with self._cv:
            if self._closed:
                return
            self._listening = True
            self._start()

    def arm(self) -> None:
        """Start watching (starts the thread on first use); clears the last firing."""
        with self._cv:
            if self._closed:
                return
            self._armed, self._listening, self._fired = True, False, None
            self._start()

    def _start(self) -> None:  # under self._cv
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        self._cv.notify_all()

    def disarm(self) -> None:
        """Stop watching and listening. When this returns no pump of the watchdog is in progress, so every
        instruction it took is in ``client.instructions``."""
        with self._cv:
            self._armed = self._listening = False
        with self._pump_lock:
            pass

    def take_fired(self, remove: bool = True) -> dict[str, Any] | None:
        """The message the watchdog fired on since the last :meth:`arm`, or None; with ``remove`` it is
        taken out of ``client.instructions`` (the caller acts on it), else left there for whoever reads
        the instructions next."""
        with self._cv:
            msg, self._fired = self._fired, None
        if msg is not None and remove:
            try:
                self.client.instructions.remove(msg)
            except ValueError:  # the training thread took it already
                pass
        return msg

    @property
    def fired(self) -> bool:
        return self._fired is not None

    def close(self, timeout_s: float = 5.0) -> None:
        """End the thread (waits for it)."""
        with self._cv:
            self._closed, self._armed, self._listening = True, False, False
            self._cv.notify_all()
        t, self._thread = self._thread, None
        if t is not None and t is not threading.current_thread():
            t.join(timeout_s)

    # --- thread --------------------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cv:
                while not (self._armed or self._listening) and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
            self.client.wait_ring(self.interval_s)  # returns at a ring (or after interval_s)
            with self._cv:
                if not (self._armed or self._listening) or self._closed:
                    continue
            try:
                msgs = self.pump(only_if_rung=True)
            except ControlError:  # the coordinator watchdog ends the process if the coordinator is gone
                msgs = []
                with self._cv:
                    self._cv.wait(self.interval_s)
            hit = next((m for m in msgs if m.get("type") in FIRES_ON), None)
            fire = None
            with self._cv:
                if hit is not None and self._armed and self._fired is None:
                    self._fired = fire = hit
            if fire is not None:
                try:
                    self.on_quiesce(fire)
                except Exception:  # noqa: BLE001 -- the training thread still hears the quiesce itself
                    pass
