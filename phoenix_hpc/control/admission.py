"""Who may join the job and what declaring slots dead means: the membership rules (docs/design.md
section 2) as pure functions.

:func:`admit` judges one registration against the slots, the job's grid and rank map and the job's state:

- the world rank within the world size, the role ``active`` or ``standby``;
- a world rank registers once (a slot declared dead cannot come back: its restarted process is refused);
- an active slot brings the job's grid (the first one sets it) and a free logical rank in it, and only while
  the job starts (a spare registers any time);
- the placement inputs (``k``, levels, the node's failure domains) must be well formed
  (:func:`phoenix_hpc.control.evidence.placement_inputs_problem`).

The coordinator's membership shell (:mod:`phoenix_hpc.control.membership`) creates the slot, journals
``registered`` and answers, or rejects with :attr:`Admission.reject`.

:func:`declare_dead` judges slots found dead (process exit, heartbeat timeout, a fault naming them): those
still alive are marked DEAD (``slots_dead``); a member among them is a fault to queue for arbitration,
dated by the earliest last heartbeat among them; only spares lost shrink the spare pool (``spare_lost``);
each is *fenced*, told to stop, in case its process still runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from phoenix_hpc.control import events as E
from phoenix_hpc.control.classify import Fault, FaultKind
from phoenix_hpc.control.commands import Send
from phoenix_hpc.control.evidence import placement_inputs_problem
from phoenix_hpc.control.states import JobState, SlotState


@dataclass(frozen=True)
class Admission:
    """The verdict on one registration. ``grid``: the job's grid ``(tp, pp, dp)`` after it (the first active
    registration sets it, also when a later check refuses it); ``reject``: why it is refused ("" when
    admitted) with the rejection's journal ``key`` (None: one record per reason); the rest describes the
    slot to create: ``logical_rank`` (None for a spare), the node's failure ``domain``, and ``inputs``, the
    registration's placement inputs (None when it sent none)."""

    grid: tuple[int, int, int] | None
    reject: str = ""
    key: tuple | None = None
    world_rank: int = -1
    pid: int = 0
    node: str = ""
    role: str = ""
    logical_rank: int | None = None
    domain: dict[str, str] | None = None
    inputs: dict[str, Any] | None = None


def admit(body: Mapping[str, Any], *, slots: Mapping[int, Any], grid: tuple[int, int, int] | None,
          rank_map: Mapping[int, int], job_state: JobState) -> Admission:
    """Judge the ``register`` message ``body`` (see the module docstring). ``slots``: world rank -> slot
    (``state``, ``pid``, ``node``); ``rank_map``: logical -> world rank. Pure.

    Raises:
        KeyError, TypeError, ValueError: a field missing or of the wrong type (the caller rejects the message
            as malformed).
    """
    w, pid, node, role = int(body["world_rank"]), int(body["pid"]), str(body["node"]), str(body["role"])

    def refuse(why: str, key: tuple | None = None) -> Admission:
        return Admission(grid, why, key)

    if w < 0 or (body.get("world_size") is not None and w >= int(body["world_size"])):
        return refuse(f"world rank {w} out of range (world size {body.get('world_size')})")
    if role not in ("active", "standby"):
        return refuse(f"role {role!r} is not 'active' or 'standby'")
    old = slots.get(w)
    if old is not None:
        why = "was declared dead; a restarted process cannot rejoin" if old.state is SlotState.DEAD else (
            f"already registered (pid {old.pid} on {old.node}, {old.state.value})")
        return refuse(f"register: world rank {w} {why}", ("register", w, pid))
    logical = None
    if role == "active":
        theirs = tuple(int(x) for x in body["grid"])
        if grid is None:
            grid = theirs  # type: ignore[assignment]
        elif theirs != tuple(grid):
            return refuse(f"register: world rank {w} has grid {theirs}, job grid is {tuple(grid)}")
        logical = int(body["logical_rank"])
        n = grid[0] * grid[1] * grid[2]
        if not 0 <= logical < n:
            return refuse(f"register: logical rank {logical} out of range 0..{n - 1}")
        if logical in rank_map:
            return refuse(f"register: logical rank {logical} already held by world rank {rank_map[logical]}")
    if job_state is not JobState.STARTING and role == "active":
        return refuse(f"register: the job is {job_state.value}; active slots register only at start")
    inputs = body.get("placement_inputs")
    domain = None
    if inputs is not None:  # what the coordinator recomputes each generation's placement from
        why = placement_inputs_problem(inputs)
        if why:
            return refuse(f"register: world rank {w} placement_inputs {why}")
        domain = dict(inputs["domain"]) if inputs.get("domain") else None
    return Admission(grid, world_rank=w, pid=pid, node=node, role=role, logical_rank=logical, domain=domain,
                     inputs=inputs)


@dataclass(frozen=True)
class Death:
    """What declaring slots dead means (:func:`declare_dead`): the ``worlds`` that die now, the
    ``records`` to journal (``slots_dead``; ``spare_lost`` when no member is among them), the ``fault`` to
    queue (None: only spares), ``t_fault``, the earliest last heartbeat among them (coordinator clock,
    seconds), and ``fences``, the ``stop`` to each."""

    worlds: tuple[int, ...]
    records: tuple[E.Event, ...]
    fault: Fault | None
    t_fault: float
    fences: tuple[Send, ...]


def declare_dead(worlds: list[int], kind: FaultKind, reason: str, *, slots: Mapping[int, Any],
                 members: set[int]) -> Death | None:
    """Slots ``worlds`` found dead for ``reason`` (a ``kind`` of fault): None when all of them are dead or
    done already. ``slots``: world rank -> slot (``state``, ``node``, ``last_seen``); ``members``: world
    ranks of the current rank map. Pure."""
    worlds = [w for w in worlds if slots[w].state not in (SlotState.DEAD, SlotState.DONE)]
    if not worlds:
        return None
    nodes = tuple(sorted({slots[w].node for w in worlds}))
    records: list[E.Event] = [E.SlotsDead(slots=worlds, nodes=list(nodes), kind=kind.value, reason=reason)]
    fault = None
    if any(w in members for w in worlds):
        fault = Fault(kind, tuple(worlds), nodes, False, reason)
    else:  # only standby slots died: the spare pool shrinks, training is not affected
        spares = sorted(w for w, s in slots.items() if s.state is SlotState.STANDBY and w not in worlds)
        records.append(E.SpareLost(slots=worlds, spares_left=spares))
    fences = tuple(Send(w, {"type": "stop", "reason": f"this slot was declared dead ({kind.value}: {reason})",
                            "job_state": "fenced"}) for w in worlds)
    return Death(tuple(worlds), tuple(records), fault, min(slots[w].last_seen for w in worlds), fences)
