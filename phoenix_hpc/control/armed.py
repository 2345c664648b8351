"""A slot's armed instructions: the fault injections and the planned drain it accepted, and the step it is in.

The coordinator relays ``inject``, ``disarm``, ``drain`` and ``undrain`` to a slot
(:mod:`phoenix_hpc.control.inject_relay`, :mod:`phoenix_hpc.control.drain_relay`); the slot's client
(:class:`phoenix_hpc.control.client.CoordinatorClient`) hands each one to :class:`ArmedInstructions`, which
arms it only when this slot has not started the step it is for (:attr:`ArmedInstructions.started_step`, kept
by the training loop) and answers the coordinator either way (``inject_ack``, ``drain_ack``). The training
thread takes what is due (:meth:`ArmedInstructions.take_injection`, :meth:`ArmedInstructions.take_drain`);
the fault trigger (:class:`phoenix_hpc.faults.trigger.FaultTrigger`) reads :attr:`ArmedInstructions.injections`
under :attr:`ArmedInstructions.lock`.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from phoenix_hpc.faults.trigger import Injection


class ArmedInstructions:
    """The injections and the drain this slot armed.

    Args:
        world_rank: this slot's MPI world rank (named in the answers).
        pid: the process id presented to the coordinator (named in the answers).
        send: sends a signed message to the coordinator (the client's ``send``); an answer that cannot be
            sent is dropped (the coordinator refuses the request when it times out).
    """

    def __init__(self, world_rank: int, pid: int, send: Callable[[dict[str, Any]], None]):
        self.world_rank, self.pid, self._send = world_rank, pid, send
        self.injections: list[dict] = []  # armed injections (inject instructions this slot accepted)
        self.lock = threading.Lock()  # shared with the FaultTrigger that takes them
        self.drain: dict | None = None  # an armed planned drain {request_id, at_step} (under lock)
        self.started_step = 0  # the iteration this slot is in (set by the training loop), for arming
        self.last_step: int | None = None  # the job's last step, when known

    def handle(self, msg: dict[str, Any]) -> bool:
        """Take ``msg`` if it is an ``inject``, ``disarm``, ``drain`` or ``undrain`` instruction (armed,
        disarmed or refused, and answered). Returns whether it was one of them."""
        t = msg["type"]
        if t == "inject":
            self._arm(msg)
        elif t == "disarm":
            self._disarm(msg)
        elif t in ("drain", "undrain"):
            self._arm_drain(msg)
        else:
            return False
        return True

    def _ack(self, msg: dict[str, Any], armed: bool, at_step: int | None, reason: str) -> None:
        try:
            self._send({"type": "inject_ack", "world_rank": self.world_rank, "pid": self.pid,
                        "request_id": str(msg.get("request_id", "")), "armed": armed, "at_step": at_step,
                        "started_step": self.started_step, "reason": reason})
        except Exception:  # noqa: BLE001 -- no answer: the coordinator refuses the request when it times out
            pass

    def _arm(self, msg: dict[str, Any]) -> None:
        """An ``inject`` instruction: arm it if this slot has not started its step
        (:func:`phoenix_hpc.faults.trigger.arm_decision`), else refuse it; answer ``inject_ack`` either way."""
        from phoenix_hpc.faults.trigger import arm_decision

        try:
            step, why = arm_decision(int(msg["at_step"]), str(msg["phase"]), self.started_step, self.last_step,
                                     msg.get("steps_ahead"))
        except (KeyError, TypeError, ValueError) as exc:
            return self._ack(msg, False, None, f"malformed inject instruction: {exc}")
        if step is not None:
            with self.lock:
                self.injections.append({**msg, "at_step": step})
        self._ack(msg, step is not None, step, why)

    def _arm_drain(self, msg: dict[str, Any]) -> None:
        """A ``drain`` instruction: arm it (pause at the commit fence of iteration ``at_step``) if this slot
        has not started that iteration (:func:`phoenix_hpc.control.drains.arm_drain`), else refuse it;
        answer ``drain_ack`` {request_id, attempt, armed, late, at_step, started_step, reason}. ``undrain``
        drops the armed drain ``request_id`` (no answer)."""
        from phoenix_hpc.control.drains import arm_drain

        rid = str(msg.get("request_id", ""))
        if msg["type"] == "undrain":
            with self.lock:
                if self.drain is not None and self.drain.get("request_id") == rid:
                    self.drain = None
            return
        try:
            at_step = int(msg["at_step"])
        except (KeyError, TypeError, ValueError) as exc:
            armed, late, why, at_step = False, False, f"malformed drain instruction: {exc}", None
        else:
            armed, late, why = arm_drain(at_step, self.started_step, self.last_step)
        if armed:
            with self.lock:
                self.drain = {"request_id": rid, "at_step": at_step}
        try:
            self._send({"type": "drain_ack", "world_rank": self.world_rank, "pid": self.pid, "request_id": rid,
                        "attempt": msg.get("attempt"), "armed": armed, "late": late, "at_step": at_step,
                        "started_step": self.started_step, "reason": why})
        except Exception:  # noqa: BLE001 -- no answer: the coordinator refuses the drain when it times out
            pass

    def take_drain(self, step: int) -> dict[str, Any] | None:
        """The armed drain due at the commit fence of iteration ``step`` (removed), or None."""
        with self.lock:
            d = self.drain
            if d is not None and int(d["at_step"]) == step:
                self.drain = None
                return d
            return None

    def _disarm(self, msg: dict[str, Any]) -> None:
        """A ``disarm`` instruction: drop the pending injection ``request_id`` (unless it already fired)."""
        rid = str(msg.get("request_id", ""))
        with self.lock:
            keep = [i for i in self.injections if not (isinstance(i, dict) and i.get("request_id") == rid)]
            dropped = len(keep) != len(self.injections)
            self.injections[:] = keep
        self._ack(msg, False, None, "disarmed" if dropped else "disarm: not pending (already fired or never armed)")

    def take_injection(self, step: int, phase: str) -> "Injection | None":
        """The injection due at ``(step, phase)`` (:func:`phoenix_hpc.faults.trigger.take_due`, under
        :attr:`lock`: the same rule and the same lock as the fault trigger), removed from the pending list, or
        None."""
        from phoenix_hpc.faults.trigger import take_due

        with self.lock:
            return take_due(self.injections, step, phase)
