"""Fault injection through the coordinator (``inject``): the request is checked, its target resolved to
slots and forwarded to them; they arm or refuse it (``inject_ack``) and report when it fired
(``inject_fired``). The request is answered once every target confirmed; armed requests that can no longer
land (the target died, the job ended) are journalled missed. The rules and the requests are
:class:`phoenix_hpc.control.injects.InjectBook` (the coordinator's ``injects``); these handlers (entries of
the coordinator's dispatch table) hand it a message and carry out what it returns.
"""

from __future__ import annotations

import uuid
from typing import Any


def on_inject(c: Any, body: dict) -> None:
    """An operator's ``inject`` request (``c``: the coordinator)."""
    c.transport.carry_out(c.injects.request(
        body, slots=c.slots, rank_map=c.rank_map, grid=c.grid, job_state=c.job.state, holder_of=c._holder_of,
        now=c.clock(), new_id=lambda: uuid.uuid4().hex[:12]))


def on_inject_ack(c: Any, body: dict) -> None:
    """A target armed or refused an injection (or answered a ``disarm``)."""
    slot = c._slot_of(body, "inject_ack")
    if slot is not None:
        c.transport.carry_out(c.injects.ack(slot.world_rank, body, live=c._is_live))


def on_inject_fired(c: Any, body: dict) -> None:
    """A target's injection fired (sent just before the effect; the landing file is written first)."""
    slot = c._slot_of(body, "inject_fired")
    if slot is not None:
        c.transport.carry_out(c.injects.fired(slot.world_rank, body))
