"""Fault injection through the coordinator (``inject``): the request is checked, its target resolved to
slots and forwarded to them; they arm or refuse it (``inject_ack``) and report when it fired
(``inject_fired``). The request is answered once every target confirmed; armed requests that can no longer
land (the target died, the job ended) are journalled missed. The rules and the requests are
:class:`phoenix_hpc.control.injects.InjectBook`; this shell hands it its inputs and carries out what it
returns.

:class:`InjectRelayMixin` is part of :class:`phoenix_hpc.control.coordinator.Coordinator`.
"""

from __future__ import annotations

import uuid

from phoenix_hpc.control.injects import fired_path
from phoenix_hpc.control.states import LIVE_SLOT_STATES, JobState


class InjectRelayMixin:
    """Fault-injection requests for the coordinator (``self.injects``, an InjectBook)."""

    def _on_inject(self, body: dict) -> None:
        self._carry_out(self.injects.request(
            body, slots=self.slots, rank_map=self.rank_map, grid=self.grid, job_state=self.job.state,
            holder_of=self._holder_of, now=self.clock(), new_id=lambda: uuid.uuid4().hex[:12]))

    def _on_inject_ack(self, body: dict) -> None:
        """A target armed or refused an injection (or answered a ``disarm``)."""
        slot = self._slot_of(body, "inject_ack")
        if slot is not None:
            self._carry_out(self.injects.ack(slot.world_rank, body, live=self._is_live))

    def _on_inject_fired(self, body: dict) -> None:
        """A target's injection fired (sent just before the effect; the landing file is written first)."""
        slot = self._slot_of(body, "inject_fired")
        if slot is not None:
            self._carry_out(self.injects.fired(slot.world_rank, body))

    def _injects_lost(self, worlds: list[int], why: str) -> None:
        self._carry_out(self.injects.lost(worlds, why, live=self._is_live, has_fired=self._has_fired))

    def _injects_tick(self, now: float) -> None:
        self._carry_out(self.injects.tick(now, live=self._is_live))

    def _injects_at_end(self, state: JobState) -> None:
        self._carry_out(self.injects.at_end(state, live=self._is_live, has_fired=self._has_fired))

    def _is_live(self, w: int) -> bool:
        return self.slots[w].state in LIVE_SLOT_STATES

    def _has_fired(self, request_id: str, w: int) -> bool:
        """Whether slot ``w`` wrote the landing record of ``request_id`` (it does so before the effect)."""
        return fired_path(self.run_dir, request_id, w).exists()
