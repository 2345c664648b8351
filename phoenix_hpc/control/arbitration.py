"""Arbitration of the pending faults: which action they call for, and when (docs/design.md section 6).

The coordinator queues every fault (a member's report, a process exit, a heartbeat timeout) as a
:class:`~phoenix_hpc.control.records.PendingFault`. With no recovery in progress and the job running, its
tick calls :func:`arbitrate`, a pure function of the queue, the active slots' last heartbeats and the clock:

- Only collective errors queued (``comm_error``, ``collective_timeout``): they are transient only once every
  active slot heartbeated *after* the newest report (proof that all processes are alive). Until then, and
  for at most ``heartbeat_timeout_s`` after that report, the answer is to wait (``None``): fresh heartbeats
  come, or :func:`phoenix_hpc.control.detect.detect` declares the silent slots dead and queues their fault.
- Otherwise the faults are combined (:func:`phoenix_hpc.control.classify.combine`). A hot swap with no dead
  member and no cut-short restore (e.g. a reported GPU error on a live slot) first *fences* the slots each
  replacement fault names (:attr:`Arbitration.fence`); a peer that only reported the collective error it
  suffered, or a difference of the replicas its commit fence showed, stays a member.

The coordinator carries the result out: declares the fenced slots dead, journals ``decision``, then ends the
job (clean stop, in-job restart) or starts the recovery, dated by :func:`fault_time`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from phoenix_hpc.control.classify import Action, Decision, Fault, FaultKind, classify, combine
from phoenix_hpc.control.records import PendingFault

# Collective errors: a consequence of a peer's loss, or transient when every process proved alive after them.
COMM_KINDS = (FaultKind.COMM_ERROR, FaultKind.COLLECTIVE_TIMEOUT)


@dataclass(frozen=True)
class Fence:
    """Slots to declare dead before the recovery (live slots a replacement fault names), with its kind and
    detail as the reason."""

    slots: tuple[int, ...]
    kind: FaultKind
    reason: str


@dataclass(frozen=True)
class Arbitration:
    """What the pending faults call for: ``decision`` (action and reason) over ``faults`` (the transient
    flag set where every process proved alive), the slots to ``fence`` first, the slots that reported a
    collective error themselves (``reporters``: their node is alive), and the arrival times of the faults
    (``arrived``, coordinator clock, seconds) to date the recovery by (:func:`fault_time`)."""

    decision: Decision
    faults: tuple[Fault, ...]
    fence: tuple[Fence, ...]
    reporters: frozenset[int]
    arrived: tuple[float, ...]


def arbitrate(pending: Sequence[PendingFault], active_last_seen: Iterable[float], *, dead_members: bool,
              restore_pending: bool, members: Iterable[int], now: float,
              heartbeat_timeout_s: float) -> Arbitration | None:
    """The action for the ``pending`` faults, or ``None`` to wait (see the module docstring). Pure.

    Args:
        pending: the queued faults, oldest first (non-empty).
        active_last_seen: the last heartbeat time (coordinator clock, seconds) of every ACTIVE slot.
        dead_members: whether a slot of the current rank map is DEAD.
        restore_pending: whether a spare's cut-short restore waits to be redone.
        members: world ranks of the current rank map (only they are fenced).
        now: coordinator clock, seconds.
        heartbeat_timeout_s: how long a collective error waits for proof that every process is alive.
    """
    pend = list(pending)
    comm = [p for p in pend if p.fault.kind in COMM_KINDS]
    if comm and len(comm) == len(pend):
        t_last = max(p.t for p in comm)
        if not all(t > t_last for t in active_last_seen):
            if now - t_last <= heartbeat_timeout_s:
                return None
        else:
            pend = [PendingFault(Fault(p.fault.kind, p.fault.slots, p.fault.nodes, True, p.fault.detail), p.t)
                    for p in pend]
    faults = tuple(p.fault for p in pend)
    decision = combine(list(faults))
    fence: list[Fence] = []
    if decision.action is Action.HOT_SWAP and not dead_members and not restore_pending:
        member_set = set(members)
        # only the faults that call for a replacement themselves: the ranks that reported a difference
        # of the replicas at their commit fence (a local recovery's fault) are not the culprits
        fence = [Fence(tuple(w for w in f.slots if w in member_set), f.kind, f.detail)
                 for f in faults if f.kind not in COMM_KINDS and classify(f).action is Action.HOT_SWAP]
    reporters = frozenset(w for f in faults if f.kind in COMM_KINDS for w in f.slots)
    return Arbitration(decision, faults, tuple(fence), reporters, tuple(p.t for p in pend))


def fault_time(arrived: Iterable[float], hint: float | None, now: float) -> float:
    """When the faults happened, as well as the coordinator can tell (coordinator clock, seconds): the
    earliest of their arrival times and ``hint`` (the last heartbeat of a slot found dead; ``now`` when
    there is none). Pure."""
    return min([hint if hint is not None else now, *arrived])
