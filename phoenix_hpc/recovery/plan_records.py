"""The recovery plan's records (:mod:`phoenix_hpc.recovery.plan`): what the coordinator decides and every rank
receives (:class:`RecoveryPlan` and its parts, frozen; :meth:`RecoveryPlan.to_json` is the wire and journal
form, :meth:`RecoveryPlan.from_json` reads it back on a rank), and what the three planners start from
(:class:`PlanInput`).

Shard ids are ``opt/pp{pp}/tp{tp}/dp{dp}`` (``GridCoord.shard_prefix``); ranks are *logical* ranks unless a
name says ``world``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Mapping, Sequence

from phoenix_hpc.errors import RecoveryError
from phoenix_hpc.topology import Grid, GridCoord

ALL_INVARIANTS = ("I1", "I2", "I3", "I4", "I5")


@dataclass(frozen=True)
class Join:
    """A standby slot taking a dead logical rank."""

    world_rank: int
    node: str
    logical_rank: int
    coord: GridCoord
    replaces_world_rank: int


@dataclass(frozen=True)
class Transfer:
    """One restore message. ``kind`` is ``"params"`` (the ``param/pp/tp`` shard) or ``"optimizer"`` (the
    ``opt/...`` shard plus its envelope). Ranks are world ranks of the *new* generation's slots."""

    kind: str
    shard_id: str
    sender_world: int
    receiver_world: int
    step: int


@dataclass(frozen=True)
class ReplicaPair:
    """Replication to re-establish: ``owner`` logical rank sends its shard to ``holder`` logical rank."""

    shard_id: str
    owner: int
    holder: int


@dataclass(frozen=True)
class RecoveryPlan:
    """What a recovery will do. ``rank_map`` is ``((logical, world), ...)`` sorted by logical rank."""

    action: str  # "hot_swap" | "local_recovery"
    old_generation: int
    generation: int
    rank_map: tuple[tuple[int, int], ...]
    dead_world: tuple[int, ...]
    released_spares: tuple[int, ...]
    joins: tuple[Join, ...]
    transfers: tuple[Transfer, ...]
    recoverable_step: int
    rollbacks: tuple[tuple[int, int], ...]  # (logical rank, live step before the rollback)
    replication: tuple[ReplicaPair, ...]
    steps_replayed: int
    grid: Grid = Grid(1, 1, 1)
    invariants: tuple[str, ...] = field(default=ALL_INVARIANTS)
    # a shrink (recovery/shrink.py) only: the grid before it, the healthy slots of the removed DP replicas
    # that go back to standby after sending what they hold, and for each member the old optimizer shards it
    # re-partitions its new shard from
    old_grid: Grid | None = None
    leavers: tuple[int, ...] = ()
    needs: tuple[tuple[int, tuple[str, ...]], ...] = ()  # (world rank, old shard ids)
    sources: tuple[tuple[str, int], ...] = ()  # (old shard id, world rank that provides it)
    lost: tuple[int, ...] = ()  # world ranks of the active slots lost (dead or drained) that caused the shrink

    def __post_init__(self) -> None:  # a (tp, pp, dp) tuple is taken as the grid it is
        object.__setattr__(self, "grid", Grid(*self.grid))
        if self.old_grid is not None:
            object.__setattr__(self, "old_grid", Grid(*self.old_grid))

    def world_of(self) -> dict[int, int]:
        """logical rank -> world rank of the new generation."""
        return dict(self.rank_map)

    @property
    def shrink(self) -> bool:
        """True for a shrink's plan (:mod:`phoenix_hpc.recovery.shrink`)."""
        return self.action == "shrink"

    @property
    def from_checkpoint(self) -> bool:
        """True when every member loads the persistent checkpoint (memory could not cover the loss)."""
        return self.action == "checkpoint_restart"

    def member_of(self, world_rank: int) -> int | None:
        """The logical rank of ``world_rank`` in the new generation, or None when it is not a member.

        Raises:
            RecoveryError: the rank map names ``world_rank`` more than once."""
        mine = [r for r, w in self.rank_map if w == world_rank]
        if len(mine) > 1:
            raise RecoveryError(f"generation {self.generation}'s rank map names world rank {world_rank} "
                                f"{len(mine)} times")
        return mine[0] if mine else None

    def recovery_step(self) -> int:
        """The iteration the job was in when the recovery began: the recoverable step plus the steps the plan
        replays, plus one, the same for every member (a joining spare included). A fault armed for a phase of
        a recovery (``recovery``, ``restore``) is judged at it: an injection armed for step ``S`` lands in the
        first recovery that begins in iteration ``S`` or later (:func:`phoenix_hpc.faults.trigger.is_due`)."""
        return self.recoverable_step + self.steps_replayed + 1

    def replay_target(self) -> tuple[int, int] | None:
        """``(generation, step)`` a member reports reaching at once when it gets there: the newest step the
        plan replays (``recovery_step() - 1``); None when it replays none (the recovery ends at the resume)."""
        return (self.generation, self.recovery_step() - 1) if self.steps_replayed > 0 else None

    def to_json(self) -> dict:
        """A JSON-serialisable summary (for the journal and for the instructions sent to ranks)."""
        return {
            "action": self.action,
            "old_generation": self.old_generation,
            "generation": self.generation,
            "grid": self.grid.to_json(),
            "rank_map": [[r, w] for r, w in self.rank_map],
            "dead_world": list(self.dead_world),
            "released_spares": list(self.released_spares),
            "joins": [
                {
                    "world_rank": j.world_rank,
                    "node": j.node,
                    "logical_rank": j.logical_rank,
                    "coord": [j.coord.pp, j.coord.dp, j.coord.tp],
                    "replaces_world_rank": j.replaces_world_rank,
                }
                for j in self.joins
            ],
            "transfers": [
                {"kind": t.kind, "shard_id": t.shard_id, "sender": t.sender_world,
                 "receiver": t.receiver_world, "step": t.step}
                for t in self.transfers
            ],
            "recoverable_step": self.recoverable_step,
            "rollbacks": [[r, s] for r, s in self.rollbacks],
            "replication": [[p.shard_id, p.owner, p.holder] for p in self.replication],
            "steps_replayed": self.steps_replayed,
            "invariants": list(self.invariants),
            **({"shrink": {"old_grid": self.old_grid.to_json(),
                           "leavers": list(self.leavers),
                           "needs": [[w, list(sids)] for w, sids in self.needs],
                           "sources": [[sid, w] for sid, w in self.sources], "lost": list(self.lost)}}
               if self.old_grid is not None else {}),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "RecoveryPlan":
        """The plan :meth:`to_json` wrote (what a rank receives in ``recover``), as frozen records.

        Raises:
            RecoveryError: ``d`` is not such a plan: a field missing or of the wrong type, named with its
                value."""
        try:
            return _plan_of(d)
        except RecoveryError:
            raise
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise RecoveryError(f"recovery plan is malformed ({type(exc).__name__}: {exc}): "
                                f"{str(dict(d) if isinstance(d, Mapping) else d)[:300]}") from None


def _grid_of(d: Mapping[str, Any], name: str) -> Grid:
    g = d[name]
    if not isinstance(g, Mapping):
        raise RecoveryError(f"recovery plan: {name} must be {{tp, pp, dp}}, got {g!r}")
    return Grid.of(g)


def _transfer_of(t: Mapping[str, Any]) -> Transfer:
    return Transfer(str(t["kind"]), str(t["shard_id"]), int(t["sender"]), int(t["receiver"]), int(t["step"]))


def _join_of(j: Mapping[str, Any]) -> Join:
    pp, dp, tp = (int(x) for x in j["coord"])
    return Join(int(j["world_rank"]), str(j["node"]), int(j["logical_rank"]), GridCoord(pp=pp, dp=dp, tp=tp),
                int(j["replaces_world_rank"]))


def _plan_of(d: Mapping[str, Any]) -> RecoveryPlan:
    """:meth:`RecoveryPlan.from_json` without the wrapping of its errors."""
    if not isinstance(d, Mapping):
        raise RecoveryError(f"recovery plan must be a JSON object, got {type(d).__name__}")
    missing = [k for k in _PLAN_FIELDS if k not in d]
    if missing:
        raise RecoveryError(f"recovery plan lacks {', '.join(missing)} (it has {', '.join(sorted(d))})")
    sh = d.get("shrink")
    return RecoveryPlan(
        action=str(d["action"]),
        old_generation=int(d["old_generation"]),
        generation=int(d["generation"]),
        rank_map=tuple((int(r), int(w)) for r, w in d["rank_map"]),
        dead_world=tuple(int(w) for w in d["dead_world"]),
        released_spares=tuple(int(w) for w in d["released_spares"]),
        joins=tuple(_join_of(j) for j in d["joins"]),
        transfers=tuple(_transfer_of(t) for t in d["transfers"]),
        recoverable_step=int(d["recoverable_step"]),
        rollbacks=tuple((int(r), int(s)) for r, s in d["rollbacks"]),
        replication=tuple(ReplicaPair(str(sid), int(o), int(h)) for sid, o, h in d["replication"]),
        steps_replayed=int(d["steps_replayed"]),
        grid=_grid_of(d, "grid"),
        invariants=tuple(str(i) for i in d["invariants"]),
        **({} if sh is None else {
            "old_grid": _grid_of(sh, "old_grid"),
            "leavers": tuple(int(w) for w in sh["leavers"]),
            "needs": tuple((int(w), tuple(str(x) for x in sids)) for w, sids in sh["needs"]),
            "sources": tuple((str(sid), int(w)) for sid, w in sh["sources"]),
            "lost": tuple(int(w) for w in sh["lost"])}),
    )


#: the fields of :meth:`RecoveryPlan.to_json` every plan has (``shrink`` only a shrink's)
_PLAN_FIELDS = ("action", "old_generation", "generation", "grid", "rank_map", "dead_world", "released_spares",
                "joins", "transfers", "recoverable_step", "rollbacks", "replication", "steps_replayed",
                "invariants")


@dataclass(frozen=True)
class PlanInput:
    """What the three planners (:func:`plan_recovery`, :func:`plan_checkpoint_restart`,
    :func:`phoenix_hpc.recovery.shrink.plan_shrink`) start from: generation ``g``'s membership and the copies
    of its state.

    Fields:
        generation: the current generation ``g``; the plan's is ``g + 1``.
        grid: generation ``g``'s :class:`~phoenix_hpc.topology.Grid` (a ``(tp, pp, dp)`` tuple is taken as one).
        rank_map: logical rank -> world rank of every active slot of generation ``g`` (dead ones included).
        nodes: world rank -> node name, for every slot (active and standby).
        dead: world ranks of the dead slots (active or standby; a drained active slot counts as dead).
        spares: world ranks of live standby slots, in order of preference.
        live_steps: logical rank -> step of its live model state (number of optimizer steps applied), for
            every live active slot.
        placement: shard id -> logical ranks of its replica holders (k of them, docs/design.md section 5).
        committed: shard id -> {logical rank: step or steps} of the verified copies of that shard: the
            owner's local snapshot and each holder's replica. A copy is one step (the committed buffer) or
            a collection of steps (committed and previous buffer of the ping-pong pair, docs/design.md section
            4: the runtime keeps both, so a survivor that committed S(k) while a dead rank's replica is at
            S(k-1) can still provide S(k-1) from its previous buffer).
        dirty: live logical ranks whose live state holds a partially applied update (the fault hit inside
            ``optimizer_step``): only their committed local snapshot counts, and they always roll back.
    """

    generation: int
    grid: Grid
    rank_map: Mapping[int, int]
    nodes: Mapping[int, str]
    dead: Iterable[int]
    live_steps: Mapping[int, int]
    spares: Sequence[int] = ()
    placement: Mapping[str, Sequence[int]] = field(default_factory=dict)
    committed: Mapping[str, Mapping[int, Any]] = field(default_factory=dict)
    dirty: Iterable[int] = ()

    def __post_init__(self) -> None:  # a (tp, pp, dp) tuple is taken as the grid it is
        object.__setattr__(self, "grid", Grid(*self.grid))


def takes_plan_input(planner):
    """A planner called as ``planner(PlanInput(...), **its own options)``, or with the fields of
    :class:`PlanInput` as keywords among its options (they are gathered into the record first)."""
    names = {f.name for f in fields(PlanInput)}

    @functools.wraps(planner)
    def call(inputs: PlanInput | None = None, /, **kw):
        if inputs is None:
            inputs = PlanInput(**{k: kw.pop(k) for k in list(kw) if k in names})
        return planner(inputs, **kw)

    return call
