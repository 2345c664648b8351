"""Planned drains through the coordinator (``drain``): the request is checked, every active slot is armed
to pause at the commit fence of one iteration, and once all paused, the drained slots leave and spares take
their logical ranks by the hot-swap path with zero steps replayed. The rules, the lifecycle and the drain
itself are :class:`phoenix_hpc.control.drains.DrainBook`; this shell hands it its inputs, carries out what
it returns, and starts the hot swap.

:class:`DrainRelayMixin` is part of :class:`phoenix_hpc.control.coordinator.Coordinator`.
"""

from __future__ import annotations

import uuid

from phoenix_hpc.control.drains import PendingDrain
from phoenix_hpc.control.states import JobState, SlotState


class DrainRelayMixin:
    """Planned drain requests for the coordinator (one at a time, ``self.drains``, a DrainBook)."""

    @property
    def drain(self) -> PendingDrain | None:
        """The newest planned drain (None before the first)."""
        return self.drains.current

    def _on_drain(self, body: dict) -> None:
        self._carry_out(self.drains.request(
            body, slots=self.slots, rank_map=self.rank_map, grid=self.grid, job_state=self.job.state,
            recovering=self.recovery is not None, shrink_capable=self.t.shrink_capable,
            k=int((self.placement_inputs or {}).get("k", 1)), now=self.clock(), new_id=lambda: uuid.uuid4().hex[:12]))

    def _on_drain_ack(self, body: dict) -> None:
        slot = self._slot_of(body, "drain_ack")
        if slot is not None:
            self._carry_out(self.drains.ack(slot.world_rank, body, live=self._is_live))

    def _on_drain_reached(self, body: dict) -> None:
        """A member paused at the commit fence of the drain's iteration."""
        slot = self._slot_of(body, "drain_reached")
        if slot is None:
            return
        if self.drains.reached(slot.world_rank, body) and self.recovery is None and self.job.state is JobState.RUNNING:
            self._start_drain(self.drains.current)

    def _start_drain(self, d: PendingDrain) -> None:
        """Every member paused at the fence: the drained slots leave (DONE), the others are quiesced and the
        hot swap gives their logical ranks to spares on other nodes."""
        now = self.clock()
        out, decision, nodes = self.drains.start(self.slots)
        self.drained |= set(d.targets)
        self.drained_nodes |= set(nodes)
        for w in d.targets:
            self.slots[w].machine.to(SlotState.DONE, f"drained (request {d.request_id})")
        self._carry_out(out)
        self._start_recovery(decision, [], now, now, drain=d)
        d.generation = self.generation

    def _drain_finished(self, rec, now: float) -> None:
        """The drain's hot swap is done (called from the recovery machine)."""
        self._carry_out(self.drains.finished(rec, now, standby=lambda w: self.slots[w].state is SlotState.STANDBY))

    def _drain_missed(self, reason: str) -> None:
        """Something came first (a fault, a lost slot, the end of the job): see DrainBook.missed."""
        self._carry_out(self.drains.missed(reason, live=self._is_live))

    def _drains_tick(self, now: float) -> None:
        self._carry_out(self.drains.tick(now, live=self._is_live))
