"""Planned drains through the coordinator (``drain``): the request is checked, every active slot is armed
to pause at the commit fence of one iteration, and once all paused, the drained slots leave and spares take
their logical ranks by the hot-swap path with zero steps replayed. The rules, the lifecycle and the drain
itself are :class:`phoenix_hpc.control.drains.DrainBook` (the coordinator's ``drains``); these handlers
(entries of the coordinator's dispatch table) hand it a message, carry out what it returns, and start the
hot swap.
"""

from __future__ import annotations

import uuid
from typing import Any

from phoenix_hpc.control import recovery_machine
from phoenix_hpc.control.drains import PendingDrain
from phoenix_hpc.control.states import JobState, SlotState


def on_drain(c: Any, body: dict) -> None:
    """An operator's ``drain`` request (``c``: the coordinator)."""
    c.transport.carry_out(c.drains.request(
        body, slots=c.slots, rank_map=c.rank_map, grid=c.grid, job_state=c.job.state,
        recovering=c.recovery is not None, shrink_capable=c.t.shrink_capable,
        k=int((c.placement_inputs or {}).get("k", 1)), now=c.clock(), new_id=lambda: uuid.uuid4().hex[:12]))


def on_drain_ack(c: Any, body: dict) -> None:
    """A member armed or refused the drain's current attempt."""
    slot = c._slot_of(body, "drain_ack")
    if slot is not None:
        c.transport.carry_out(c.drains.ack(slot.world_rank, body, live=c._is_live))


def on_drain_reached(c: Any, body: dict) -> None:
    """A member paused at the commit fence of the drain's iteration; the last one starts the move."""
    slot = c._slot_of(body, "drain_reached")
    if slot is None:
        return
    if c.drains.reached(slot.world_rank, body) and c.recovery is None and c.job.state is JobState.RUNNING:
        start_drain(c, c.drains.current)


def start_drain(c: Any, d: PendingDrain) -> None:
    """Every member paused at the fence: the drained slots leave (DONE), the others are quiesced and the
    hot swap gives their logical ranks to spares on other nodes."""
    now = c.clock()
    out, decision, nodes = c.drains.start(c.slots)
    c.drained |= set(d.targets)
    c.drained_nodes |= set(nodes)
    for w in d.targets:
        c.slots[w].machine.to(SlotState.DONE, f"drained (request {d.request_id})")
    c.transport.carry_out(out)
    recovery_machine.start_recovery(c, decision, [], now, now, drain=d)
    d.generation = c.generation
