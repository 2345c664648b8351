"""Failure detection from heartbeats: pure functions of ``now`` and the last-seen times.

The coordinator records, per live slot, the time of the newest heartbeat it accepted (or of the slot's
registration, before any heartbeat). A slot is declared dead when ``now - last_seen > heartbeat_timeout_s``
(strictly greater, so a heartbeat that arrives exactly at the deadline still counts). Times are seconds on
one clock (the coordinator's ``time.monotonic``); time in which the coordinator itself was not running
(stopped, starved of CPU) is not counted as the slots' silence (:mod:`phoenix_hpc.control.pause`).

Ranks judge the coordinator differently (:func:`coordinator_verdict`): from evidence that it is gone (its
connection closed), or from no answer for ``resilience.coordinator_timeout_s``, much longer than the
heartbeat timeout, after a start-up grace period: a busy coordinator answers late, it is not dead.

Other detection signals (process exit, collective timeout, exception inside the step) arrive as fault
reports and are handled by :mod:`phoenix_hpc.control.classify`.
"""

from __future__ import annotations

from typing import Any, Container, Hashable, Mapping, Protocol


class HeartbeatConfig(Protocol):
    """Anything with the resilience heartbeat settings (e.g. ``JobConfig.resilience``)."""

    heartbeat_interval_s: float
    heartbeat_timeout_s: float


def detect(
    now: float, heartbeats: Mapping[Hashable, float], cfg: HeartbeatConfig
) -> tuple[tuple[Hashable, ...], str]:
    """Slots whose last heartbeat is older than ``cfg.heartbeat_timeout_s``.

    Args:
        now: current time in seconds (same clock as the values of ``heartbeats``).
        heartbeats: slot id -> time of its last accepted heartbeat (or registration), seconds.
        cfg: provides ``heartbeat_timeout_s`` (seconds, > 0).

    Returns:
        ``(dead, reason)``: the dead slot ids sorted, and a human-readable reason naming each one with its
        silence (``""`` when none is dead).

    Raises:
        ValueError: ``heartbeat_timeout_s`` is not > 0.
    """
    timeout_s = float(cfg.heartbeat_timeout_s)
    if not timeout_s > 0:
        raise ValueError(f"heartbeat_timeout_s must be > 0, got {timeout_s}")
    silent = {slot: now - seen for slot, seen in heartbeats.items() if now - seen > timeout_s}
    if not silent:
        return (), ""
    dead = tuple(sorted(silent, key=lambda s: (str(type(s)), s)))
    parts = ", ".join(f"{s} silent {silent[s]:.1f}s" for s in dead)
    return dead, f"heartbeat timeout ({parts}; heartbeat_timeout_s={timeout_s:g})"


def watched(now: float, slots: Mapping[int, Any], *, grace_s: float, training_since: float | None,
            live_states: Container[Any]) -> dict[int, float]:
    """Live slot -> the time its silence counts from, for the slots whose heartbeats are judged now (the
    input of :func:`detect`). Pure, O(slots).

    Start-up grace (``resilience.coordinator_grace_s``, ``grace_s``): a slot that has not reported a step may
    be starved by imports and set-up on a loaded node, so it is judged only once it reports a step above 0
    or the grace since its registration has passed. A member (a slot holding a logical rank) is also judged
    once any member reported a step above 0 (``training_since``, coordinator clock): a training step ends
    only after the step's collectives with every member (the DP gradient reduction, the pipeline's sends),
    so every member has finished its set-up; its silence counts from that moment at the earliest. Without
    this a member that hangs in its first steps, before one of its heartbeats carried a step, would be found
    only at the end of the grace. Its process exit counts at once in any case (liveness).

    Args:
        now: coordinator clock, seconds.
        slots: world rank -> slot (``state``, ``step``, ``last_seen``, ``registered_at``, ``logical_rank``).
        live_states: the slot states whose processes are expected to heartbeat.
    """
    out = {}
    for w, s in slots.items():
        if s.state not in live_states:
            continue
        if s.step > 0 or now - s.registered_at > grace_s:
            out[w] = s.last_seen
        elif training_since is not None and s.logical_rank is not None:
            out[w] = max(s.last_seen, training_since)
    return out


def coordinator_lost(now: float, last_ok: float, timeout_s: float) -> tuple[bool, str]:
    """Silence alone: the coordinator has not answered for more than ``timeout_s`` seconds since ``last_ok``
    (the time of the last exchange in which its beat counter had advanced). Returns ``(lost, reason)``.
    The rank's watchdog uses :func:`coordinator_verdict`, which adds the evidence rules around this one."""
    silent = now - last_ok
    if silent > timeout_s:
        return True, f"coordinator silent for {silent:.1f}s > {timeout_s:g}s"
    return False, ""


def coordinator_verdict(now: float, *, started: float, last_ok: float, last_unanswered: float | None,
                        closed: str | None, timeout_s: float, grace_s: float, ending: bool = False,
                        asking_since: float | None = None, answer_timeout_s: float = 0.0) -> tuple[bool, str]:
    """The rank-side rule: is the coordinator gone? A late answer is not evidence, only these are:

    1. ``closed``: the slot's liveness connection to the coordinator was closed by the other end (its
       process ended: the kernel closes a dead process's sockets; :mod:`phoenix_hpc.control.liveness`).
       Lost at once, with that reason.
    2. No answer for longer than ``timeout_s`` (``resilience.coordinator_timeout_s``, much longer than the
       heartbeat timeout the coordinator applies to slots): ``now - last_ok > timeout_s``, *and* an exchange
       attempted after ``last_ok`` went unanswered (``last_unanswered > last_ok``: the slot's own heartbeat
       thread really asked: a failed exchange, or one still waiting for its answer after
       ``answer_timeout_s``; a slot that was itself stopped or starved of CPU has no such evidence), *and*
       the start-up grace period is over (``now - started > grace_s``: imports, rendezvous and engine
       construction on a loaded node may starve both sides for a while).

    Args:
        now, started, last_ok, last_unanswered: seconds on one monotonic clock (the slot's); ``started``:
            when the watchdog started; ``last_ok``: the last exchange in which the coordinator's beat counter
            had advanced (``started`` before the first); ``last_unanswered``: the start of the newest
            exchange that failed or timed out, or in which the beat had not advanced (None: none yet).
        asking_since: start of the exchange in flight (None: none); a store operation to a stopped
            coordinator may wait without limit, so it counts as unanswered once older than
            ``answer_timeout_s`` (the heartbeat timeout).
        closed: why the liveness connection is gone (None: open, or never opened).
        timeout_s: seconds (> 0). grace_s: seconds (>= 0).
        ending: the job is ending (this slot received ``stop`` or is closing): nothing is lost any more.

    Returns:
        ``(lost, reason)``; the reason names the evidence and the numbers.
    """
    if ending:
        return False, ""
    if closed is not None:
        return True, f"the coordinator closed its connection ({closed})"
    if asking_since is not None and now - asking_since > answer_timeout_s:
        last_unanswered = asking_since if last_unanswered is None else max(last_unanswered, asking_since)
    if now - started <= grace_s or last_unanswered is None or last_unanswered <= last_ok:
        return False, ""
    silent = now - last_ok
    if silent > timeout_s:
        return True, (f"no answer from the coordinator for {silent:.1f}s > coordinator_timeout_s={timeout_s:g}s "
                      "while its connection stayed open")
    return False, ""
