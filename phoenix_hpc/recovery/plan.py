"""The recovery plan: a pure function from the job's membership and replica state to frozen records.

Given who is dead, which standby slots are free, where every optimizer shard's replicas live and which step
each copy holds, :func:`plan_recovery` decides (docs/design.md section 6, steps 1, 4, 5, 6):

- the new generation (``old + 1``) and the new rank map: a standby slot takes each dead logical rank, so
  the logical rank, grid coordinate and logical shard id of the lost slot move to the spare unchanged;
- the recoverable step ``R``: the newest step that *every* shard can provide from memory. A live owner can
  provide its live state (``live_steps``) or its committed local snapshot; a dead owner's shard only a
  replica on a live holder. ``R = min over shards of (newest step that shard can provide)`` and every shard
  must be able to provide exactly ``R`` (the per-step protocol of docs/design.md section 4 guarantees it when
  replicas are committed: every copy keeps S(R) in its committed or its previous ping-pong buffer, and both
  count; otherwise the plan fails over to the persistent checkpoint);
- who sends what to whom: parameters from a live DP peer at the same ``(pp, tp)`` (they are identical on all
  DP ranks of a ``(pp, tp)``, docs/design.md section 3); the optimizer shard + envelope from a live holder
  whose committed replica is at step ``R``;
- which survivors roll back (live step > ``R``) from their committed local snapshot, and the replication
  pairs to re-establish for and to the new members;
- the invariants to assert afterwards (I1-I5, :mod:`phoenix_hpc.recovery.invariants`).

With no dead slot it plans a *local recovery* (new generation, rollback, no spare). When memory cannot cover
the loss (no standby slot left, owner and every holder of a shard dead, no live DP peer for parameters) it
raises :class:`FallbackRequired` whose message says why; the caller then restarts from the newest persistent
checkpoint.

Shard ids are ``opt/pp{pp}/tp{tp}/dp{dp}`` (``GridCoord.shard_prefix``); ranks are *logical* ranks unless a
name says ``world``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable, Mapping, Sequence

from phoenix_hpc.errors import RecoveryError
from phoenix_hpc.recovery.plan_records import (  # noqa: F401 -- the records, also read from here
    ALL_INVARIANTS, Join, PlanInput, RecoveryPlan, ReplicaPair, Transfer, takes_plan_input)
from phoenix_hpc.recovery.steps import recoverable_step, shards_without
from phoenix_hpc.topology import Grid, GridCoord, coord_of, rank_of, world_size_of


class FallbackRequired(RecoveryError):
    """Memory replicas cannot cover the loss: restart from the newest persistent checkpoint.

    ``reason`` is the user-facing explanation; ``lost_shards`` the shard ids with no usable copy.
    """

    def __init__(self, reason: str, lost_shards: Sequence[str] = ()):
        self.reason = reason
        self.lost_shards = tuple(lost_shards)
        super().__init__(f"recovery from memory impossible: {reason}; falling back to the persistent checkpoint")


def shard_id_of(logical_rank: int, tp: int, pp: int, dp: int) -> str:
    """The logical optimizer-shard id of ``logical_rank``: ``opt/pp{pp}/tp{tp}/dp{dp}``."""
    return coord_of(logical_rank, tp, pp, dp).shard_prefix()


def _membership(grid, rank_map, dead, spares, nodes):
    """Check the inputs shared by both plans and derive ``(n, dead world ranks, world -> logical map,
    dead logical ranks, live standby world ranks)``.

    Raises:
        RecoveryError: the rank map does not cover the grid, or a world rank has no known node.
    """
    tp, pp, dp = grid
    n = world_size_of(tp, pp, dp)
    if sorted(rank_map) != list(range(n)):
        raise RecoveryError(f"rank map covers logical ranks {sorted(rank_map)}, grid needs 0..{n - 1}")
    dead_set = set(dead)
    for w in list(dead_set) + list(rank_map.values()) + list(spares):
        if w not in nodes:
            raise RecoveryError(f"world rank {w} has no known node")
    world_to_logical = {w: r for r, w in rank_map.items()}
    dead_logical = sorted(world_to_logical[w] for w in dead_set if w in world_to_logical)
    live_spares = [w for w in spares if w not in dead_set and w not in world_to_logical]
    return n, dead_set, world_to_logical, dead_logical, live_spares


def _assign_spares(dead_logical, live_spares, rank_map, nodes):
    """Give every dead logical rank a standby slot; returns ``(assignment, new rank map)``.

    Raises:
        FallbackRequired: fewer live standby slots than dead logical ranks.
    """
    if len(dead_logical) > len(live_spares):
        raise FallbackRequired(
            f"no spare left: {len(dead_logical)} dead slot(s) ({', '.join(str(rank_map[r]) for r in dead_logical)})"
            f" but {len(live_spares)} standby slot(s)"
        )
    dead_by_node: dict[str, list[int]] = defaultdict(list)
    for r in dead_logical:
        dead_by_node[nodes[rank_map[r]]].append(r)
    assignment = _choose_spares(dead_by_node, live_spares, nodes)
    new_map = dict(rank_map)
    new_map.update(assignment)
    return assignment, new_map


def _choose_spares(
    dead_by_node: Mapping[str, list[int]], spares: Sequence[int], nodes: Mapping[int, str]
) -> dict[int, int]:
    """dead logical rank -> spare world rank. The ranks of one dead node go to one spare node when it has
    room (keeps TP groups and the node's failure domain together); otherwise they are spread in order."""
    free: dict[str, list[int]] = defaultdict(list)
    for w in spares:
        free[nodes[w]].append(w)
    out: dict[int, int] = {}
    for dnode in sorted(dead_by_node):
        ranks = sorted(dead_by_node[dnode])
        fit = [n for n in free if len(free[n]) >= len(ranks)]
        if fit:
            n = min(fit, key=lambda n: (len(free[n]), n))  # best fit, then name
            for r in ranks:
                out[r] = free[n].pop(0)
        else:
            pool = [w for n in sorted(free) for w in free[n]]
            for r, w in zip(ranks, pool):
                out[r] = w
                free[nodes[w]].remove(w)
        for n in [n for n in free if not free[n]]:
            del free[n]
    return out


def params_source(peers: list[int], holder: int, sends: dict[int, int]) -> int:
    """The DP peer a spare takes its parameters from: among ``peers`` (the live DP peers at its (pp, tp), in
    dp order; any of them holds the same parameters), the one with the fewest transfers to send in the plan
    so far (``sends``, logical rank -> count), counting the optimizer transfer that ``holder`` sends this
    spare; on a tie a peer that is not ``holder``, then dp order. So the parameters and the optimizer shard come from two senders where the
    DP group allows it (a spare then receives both at once, launch/transfers.py), and several spares do not
    all drain one peer. Pure."""
    # O(len(peers)): the position comes with the peer (a key that looked it up with peers.index was quadratic:
    # 1.0 s of a 16k-rank plan's 1.04 s, BENCHMARKS.md section 5)
    return min(enumerate(peers), key=lambda ip: (sends.get(ip[1], 0) + (ip[1] == holder), ip[1] == holder, ip[0]))[1]


@takes_plan_input
def plan_recovery(inputs: PlanInput, *, restore: Iterable[int] = (), params_from_optimizer: bool = False
                  ) -> RecoveryPlan:
    """Plan a hot swap (some active slot dead) or a local recovery (no active slot dead).

    Args:
        inputs: the generation's membership and copies (:class:`PlanInput`).
        restore: logical ranks whose slot is alive but whose state cannot be trusted (a spare whose
            restore was cut short by a second fault): restored again in place, never used as a source.
        params_from_optimizer: the engine can rebuild a stage's parameters from its optimizer slice when that
            slice is the whole stage (dp == 1, ZeRO-1 main copy in fp32: the parameters are its cast to the
            model dtype after every step, docs/design.md section 6): a dead rank with no live DP peer then gets
            the ``optimizer`` transfer followed by a local ``params_from_optimizer`` instead of a fallback.

    Returns:
        A frozen :class:`RecoveryPlan`.

    Raises:
        FallbackRequired: not enough standby slots, a shard has no usable copy at the recoverable step, or a
            dead rank has no live DP peer to take parameters from.
        RecoveryError: inconsistent input (rank map does not cover the grid, unknown world rank).
    """
    generation, grid, rank_map, nodes = inputs.generation, inputs.grid, inputs.rank_map, inputs.nodes
    placement, committed, live_steps = inputs.placement, inputs.committed, inputs.live_steps
    tp, pp, dp = grid
    n, dead_set, world_to_logical, dead_logical, live_spares = _membership(grid, rank_map, inputs.dead,
                                                                           inputs.spares, nodes)
    released = tuple(sorted(w for w in dead_set if w not in world_to_logical))
    restore_set = set(restore) - set(dead_logical)
    dirty_set = set(inputs.dirty)
    alive = [r for r in range(n) if r not in dead_logical and r not in restore_set]
    alive_set = set(alive)  # membership tests: a list would make the plan O(ranks^2) (seconds at 16k ranks)

    # --- spares for the dead logical ranks --------------------------------------------------------
    assignment, new_map = _assign_spares(dead_logical, live_spares, rank_map, nodes)

    # --- the recoverable step ----------------------------------------------------------------------
    recoverable, sid_of = recoverable_of(grid, rank_map, nodes, placement, committed, live_steps,
                                         set(dead_logical) | restore_set, alive_set, dirty_set)

    # --- transfers ---------------------------------------------------------------------------------
    transfers: list[Transfer] = []
    joins: list[Join] = []
    sends: dict[int, int] = {}  # logical rank -> transfers it sends in this plan so far
    for r in sorted(set(dead_logical) | restore_set):
        c = coord_of(r, tp, pp, dp)
        sid = c.shard_prefix()
        spare = new_map[r]
        if r in assignment:
            joins.append(Join(spare, nodes[spare], r, c, rank_map[r]))
        peers = [d * tp + c.pp * tp * dp + c.tp for d in range(dp)  # the DP group, in dp order (topology)
                 if d != c.dp and d * tp + c.pp * tp * dp + c.tp in alive_set]
        if not peers and not (params_from_optimizer and dp == 1):
            raise FallbackRequired(
                f"no live DP peer of logical rank {r} at (pp={c.pp}, tp={c.tp}) to restore parameters from",
                [sid],
            )
        holder = holder_at(sid, recoverable, placement, committed, alive_set)
        peer = params_source(peers, holder, sends) if peers else None
        if peer is not None:
            transfers.append(Transfer("params", c.param_shard(), new_map[peer], spare, recoverable))
            sends[peer] = sends.get(peer, 0) + 1
        transfers.append(Transfer("optimizer", sid, new_map[holder], spare, recoverable))
        sends[holder] = sends.get(holder, 0) + 1
        if peer is None:  # dp == 1: the one optimizer slice holds every parameter's fp32 main copy
            transfers.append(Transfer("params_from_optimizer", c.param_shard(), spare, spare,
                                      recoverable))

    rollbacks = tuple((r, live_steps[r]) for r in alive if live_steps[r] > recoverable or r in dirty_set)
    newest = max([live_steps[r] for r in alive] + [recoverable])
    dead_set_l = set(dead_logical)
    dead_sids = {sid_of(r) for r in dead_set_l if 0 <= r < n}
    replication = tuple(
        ReplicaPair(sid, _owner(sid, tp, pp, dp), h)
        for sid in sorted(placement)
        for h in placement[sid]
        if h in dead_set_l or sid in dead_sids
    )
    return RecoveryPlan(
        action="hot_swap" if dead_logical or restore_set else "local_recovery",
        old_generation=generation,
        generation=generation + 1,
        rank_map=tuple(sorted(new_map.items())),
        dead_world=tuple(sorted(dead_set)),
        released_spares=released,
        joins=tuple(joins),
        transfers=tuple(transfers),
        recoverable_step=recoverable,
        rollbacks=rollbacks,
        replication=replication,
        steps_replayed=newest - recoverable,
        grid=Grid(tp, pp, dp),
    )


def recoverable_of(grid, rank_map, nodes, placement, committed, live_steps, unavailable, alive_set, dirty_set):
    """The recoverable step ``R`` of a grid (module doc) and the grid's shard-id function ``sid_of(r)``.

    ``unavailable``: logical ranks whose own state cannot serve (dead, or restored again in place): their
    shard counts only through a copy on a live holder (``alive_set``); ``dirty_set``: live ranks whose live
    state holds a partial update (only their committed local snapshot counts).

    Raises:
        FallbackRequired: a shard has no usable copy at all, or none at the recoverable step.
        RecoveryError: a live logical rank reported no step.
    """
    tp, pp, dp = grid
    n = tp * pp * dp

    # O(ranks) with a small constant: one pass, shard ids from the grid arithmetic of topology.coord_of, and a
    # copy's steps converted only where they are read (16k ranks: 0.8 s before, see BENCHMARKS.md)
    def sid_of(r: int) -> str:  # = shard_id_of(r, tp, pp, dp), without the per-call checks
        return f"opt/pp{r // (tp * dp)}/tp{r % tp}/dp{(r // tp) % dp}"

    candidates: dict[str, set[int]] = {}
    no_copies: Mapping[int, Any] = {}
    for r in range(n):
        sid = sid_of(r)
        copies = committed.get(sid, no_copies)
        if r in unavailable:
            cand = {s for h, st in copies.items() if h != r and h in alive_set for s in _steps(st)}
        else:
            if r not in live_steps:
                raise RecoveryError(f"live logical rank {r} reported no step")
            cand = set() if r in dirty_set else {live_steps[r]}
            own = copies.get(r)
            if own is not None:
                cand |= _steps(own)
        if not cand:
            holders = [h for h in placement.get(sid, ()) if h != r]
            raise FallbackRequired(
                f"shard {sid} lost: owner (logical rank {r}, {nodes[rank_map[r]]}) and all holders "
                f"({', '.join(f'{h} on {nodes[rank_map[h]]}' for h in holders) or 'none'}) are dead"
                " or hold no committed replica",
                [sid],
            )
        candidates[sid] = cand
    recoverable = recoverable_step(candidates)
    missing = shards_without(candidates, recoverable)
    if missing:
        raise FallbackRequired(
            f"shard(s) {', '.join(missing)} have no copy at the recoverable step {recoverable} "
            f"(copies: {', '.join(f'{s}={sorted(candidates[s])}' for s in missing)})",
            missing,
        )
    return recoverable, sid_of


def holder_at(sid: str, step: int, placement: Mapping[str, Sequence[int]], committed: Mapping[str, Mapping[int, Any]],
              alive: set[int]) -> int:
    """The live holder (logical rank) whose copy of shard ``sid`` serves step ``step``: the placement's holders
    first, in placement order, then any other live copy, lowest rank first. :func:`recoverable_of` has made
    sure one exists."""
    copies = {h: _steps(v) for h, v in committed.get(sid, {}).items()}
    order = [h for h in placement.get(sid, ()) if h in alive] + sorted(h for h in copies if h in alive)
    return next(h for h in order if step in copies.get(h, ()))


def _steps(copy: int | Iterable[int]) -> set[int]:
    """The steps one copy can provide: a single step, or the steps of its (committed, previous) buffers."""
    if isinstance(copy, int):
        return {copy}
    return {int(s) for s in copy if s is not None}


def _owner(shard_id: str, tp: int, pp: int, dp: int) -> int:
    parts = dict((p[:2], int(p[2:])) for p in shard_id.split("/")[1:4])
    return rank_of(GridCoord(pp=parts["pp"], dp=parts["dp"], tp=parts["tp"]), tp, pp, dp)


@takes_plan_input
def plan_checkpoint_restart(inputs: PlanInput, *, checkpoint_step: int) -> RecoveryPlan:
    """The in-job fallback of docs/design.md section 6 when memory replicas cannot cover a loss: standby slots
    take the dead logical ranks (as in :func:`plan_recovery`), generation ``g + 1`` is built, and *every*
    member loads the persistent checkpoint of ``checkpoint_step`` (no memory transfer). The work since that
    checkpoint is lost and trained again: ``steps_replayed = newest live step - checkpoint_step``.

    Args:
        inputs: as :func:`plan_recovery` (``placement``, ``committed`` and ``dirty`` are not read).
        checkpoint_step: the newest complete persistent checkpoint.

    Returns:
        A :class:`RecoveryPlan` with ``action == "checkpoint_restart"``, no transfers,
        ``recoverable_step == checkpoint_step`` and every live member in ``rollbacks``.

    Raises:
        FallbackRequired: fewer live standby slots than dead active slots (the job cannot go on in this
            allocation: the caller stops it cleanly and names the checkpoint to resubmit from).
        RecoveryError: inconsistent input (as :func:`plan_recovery`).
    """
    generation, grid, rank_map, nodes, live_steps = (inputs.generation, inputs.grid, inputs.rank_map, inputs.nodes,
                                                     inputs.live_steps)
    tp, pp, dp = grid
    n, dead_set, world_to_logical, dead_logical, live_spares = _membership(grid, rank_map, inputs.dead,
                                                                           inputs.spares, nodes)
    assignment, new_map = _assign_spares(dead_logical, live_spares, rank_map, nodes)
    joins = tuple(Join(assignment[r], nodes[assignment[r]], r, coord_of(r, tp, pp, dp), rank_map[r])
                  for r in dead_logical)
    alive = [r for r in range(n) if r not in dead_logical]
    newest = max([live_steps.get(r, checkpoint_step) for r in alive] + [checkpoint_step])
    return RecoveryPlan(
        action="checkpoint_restart",
        old_generation=generation,
        generation=generation + 1,
        rank_map=tuple(sorted(new_map.items())),
        dead_world=tuple(sorted(dead_set)),
        released_spares=tuple(sorted(w for w in dead_set if w not in world_to_logical)),
        joins=joins,
        transfers=(),
        recoverable_step=int(checkpoint_step),
        rollbacks=tuple((r, live_steps.get(r, checkpoint_step)) for r in alive),
        replication=(),
        steps_replayed=newest - int(checkpoint_step),
        grid=Grid(tp, pp, dp),
    )
