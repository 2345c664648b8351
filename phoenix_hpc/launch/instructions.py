"""A member's reading of the coordinator's instructions (:class:`phoenix_hpc.control.client.CoordinatorClient`:
its queue ``instructions``, filled by the quiesce watchdog's ``pump`` and by ``wait_instruction``).

Three ways, for three places: :func:`poll` at every step boundary (never waits), :func:`wait_for` where the
member waits for one instruction (a plan, a resume, a quiesce after an error), :func:`take_newer_quiesce` in
the restore's waits on the other members (a re-plan), and :func:`drain_pause` at a drain's commit fence. A
``stop`` always wins: :class:`~phoenix_hpc.launch.signals.StopRequested`.
"""

from __future__ import annotations

import time
from typing import Any

from phoenix_hpc.errors import ControlError, RecoveryError
from phoenix_hpc.launch.signals import StopRequested

#: how often the restore's waits look for a newer quiesce, seconds (at each doorbell ring; every FULL_POLL_S
#: they read the coordinator's store even without one, as ``CoordinatorClient.wait_instruction`` does)
ARRIVE_CHECK_S = 0.05
FULL_POLL_S = 2.0


def poll(client, watchdog) -> dict[str, Any] | None:
    """The first ``quiesce`` queued, taken out (the instructions before it are dropped), or None; the doorbell
    is read first through the watchdog (one lock with it: instructions keep their order). A coordinator that
    cannot be reached is left to the coordinator watchdog, which ends the process if it is really gone.

    Raises:
        StopRequested: a ``stop`` comes first."""
    try:
        watchdog.pump(only_if_rung=True)
    except ControlError:
        return None
    while client.instructions:
        msg = client.instructions.popleft()
        if msg["type"] == "quiesce":
            return msg
        if msg["type"] == "stop":
            raise StopRequested(msg)
    return None


def wait_for(client, types: tuple[str, ...], what: str, wait_s: float) -> dict[str, Any]:
    """The first instruction of ``types`` (those before it are dropped), waiting up to ``wait_s`` seconds;
    while the coordinator restarts (``client.away``) its absence is not its silence: the wait starts again
    (the slot's watchdog bounds the absence).

    Raises:
        StopRequested: a ``stop`` comes first; RecoveryError: nothing within ``wait_s`` (named by ``what``)."""
    deadline = time.monotonic() + wait_s
    while True:
        while client.instructions:
            msg = client.instructions.popleft()
            if msg["type"] == "stop":
                raise StopRequested(msg)
            if msg["type"] in types:
                return msg
        if getattr(client, "away", False):
            deadline = time.monotonic() + wait_s
        left = deadline - time.monotonic()
        if left <= 0:
            raise RecoveryError(f"no {what} from the coordinator within {wait_s:g} s")
        msg = client.wait_instruction(types, min(left, 1.0))
        if msg is not None:
            client.instructions.appendleft(msg)


def take_newer_quiesce(client, watchdog, generation: int, full: bool) -> dict[str, Any] | None:
    """A ``quiesce`` of a generation after ``generation`` that the coordinator queued, taken out of the
    instructions (other instructions stay, in order); None when there is none. The watchdog is disarmed in a
    recovery, so only the member's thread reads the instructions; ``full``: read the store even without a
    ring (one may be lost).

    Raises:
        StopRequested: a ``stop`` is queued."""
    try:
        watchdog.pump(only_if_rung=not full)
    except ControlError:
        return None  # the coordinator watchdog ends the process if the coordinator is really gone
    for msg in list(client.instructions):
        if msg["type"] == "stop":
            client.instructions.remove(msg)
            raise StopRequested(msg)
        if msg["type"] == "quiesce" and int(msg.get("generation", -1)) > int(generation):
            client.instructions.remove(msg)
            return msg
    return None


def drain_pause(member, s: int) -> dict[str, Any] | None:
    """A planned drain armed for iteration ``s``: ``member`` is at its commit fence (``S(s-1)`` committed and
    acknowledged, no update of ``s`` applied), so live step == committed step. It reports ``drain_reached``
    and waits, its groups and protector intact (peers may still need its acks), for the coordinator's
    ``quiesce`` (the hot swap, zero steps replayed), which it returns, or ``stop`` (a drained slot). None when
    no drain is armed for ``s``.

    Raises:
        StopRequested: the ``stop``; RecoveryError: neither within the member's instruction timeout."""
    c, e = member.env.client, member.env
    d = c.take_drain(s)
    if d is None:
        return None
    member.phase = "drain"
    try:
        c.send({"type": "drain_reached", "world_rank": e.world_rank, "pid": c.pid,
                "request_id": d["request_id"], "step": int(member.engine.step)})
    except Exception:  # noqa: BLE001 -- the coordinator then misses the drain or a peer's fault ends it
        pass
    e.log(f"[phoenix] rank {member.logical} gen {member.generation}: paused at the commit fence of "
          f"iteration {s} for drain {d['request_id']}")
    h2h = getattr(member.protector, "h2h", None)
    if h2h is None or getattr(h2h, "_thread", None) is not None:
        return wait_for(c, ("quiesce",), "quiesce for the drain", member.wait_s)
    # MPI_THREAD_FUNNELED/SINGLE: no engine thread; this thread keeps the H2H engine (a peer's replica
    # and its acknowledgement, the commit fence) moving while it waits
    deadline = time.monotonic() + member.wait_s
    while time.monotonic() < deadline:
        h2h.poll()
        while c.instructions:
            msg = c.instructions.popleft()
            if msg["type"] == "stop":
                raise StopRequested(msg)
            if msg["type"] == "quiesce":
                return msg
        msg = c.wait_instruction(("quiesce",), 0.05)
        if msg is not None:
            c.instructions.appendleft(msg)
    raise RecoveryError(f"no quiesce from the coordinator within {member.wait_s:g} s of the drain's pause")
