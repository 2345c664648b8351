"""The shrink plan: when no standby slot is left, remove the DP replica(s) of the lost slots and go on.

A pure function from the same inputs as :func:`phoenix_hpc.recovery.plan.plan_recovery` (plus the size of
each stage's flat optimizer vector) to a :class:`~phoenix_hpc.recovery.plan.RecoveryPlan` with
``action == "shrink"`` (docs/design.md section 6, "Shrink"):

- the removed replicas ``H`` are the DP indices of the lost slots (dead, or drained with ``--shrink``: a
  drained slot has stopped at the drain's commit fence and counts as dead here, its shard served by a holder);
  ``dp' = dp - |H|``; the kept replicas keep their order and are numbered ``0 .. dp' - 1``, so the logical
  rank of a kept slot becomes ``(pp * dp' + d') * tp + tp_index`` and its world rank stays;
- the recoverable step ``R`` is computed as for a hot swap over the *old* grid (every old shard must have a
  copy at ``R`` on a live slot: its owner, or a holder of its replica);
- the healthy slots of the removed replicas are *leavers*: members of the recovery's exchange communicator
  that send what they hold, then go back to standby;
- the optimizer state is re-partitioned: for every stage ``(pp, tp)`` the flat fp32 vector of ``numel``
  elements was cut into ``dp`` slices of ``ceil(numel / dp)`` (:mod:`phoenix_hpc.engines.zero`); the new
  member ``d'`` owns ``[d' L', (d' + 1) L')`` with ``L' = ceil(numel / dp')`` and needs every old slice that
  intersects it (:func:`overlapping`). Each old slice comes from one *source*: its owner when alive (its own
  copy of ``S(R)``), else a live holder of its replica at ``R``. One ``reshard`` transfer per (old slice,
  member) pair whose source is another slot, in a fixed order every member computes the same way;
- parameters are not moved: every member keeps its stage's parameters of ``S(R)`` (DP peers hold identical
  parameters, docs/design.md section 3); every member takes the rebuild path (its engine's dp changes).

The result depends only on ``S(R)`` and ``dp'``, not on which replica was removed or why: a shrink after a
fault and a ``phoenix drain --shrink`` at the same step give bit-identical state.

Checked afterwards: I1, I2 (one owner per new shard), I4, I5; I3 (restored from a verified replica) does
not apply as such: every old slice is verified (CRC-32 per tensor) when it is received and the engine
checks that the received slices cover its new slice exactly once.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from phoenix_hpc.errors import RecoveryError
from phoenix_hpc.recovery.plan import (FallbackRequired, PlanInput, RecoveryPlan, Transfer, holder_at, recoverable_of,
                                       takes_plan_input)
from phoenix_hpc.topology import Grid, coord_of

SHRINK_INVARIANTS = ("I1", "I2", "I4", "I5")


def overlapping(numel: int, old_dp: int, new_dp: int, new_d: int) -> list[int]:
    """The old DP indices whose ZeRO-1 slice (``ceil(numel / old_dp)`` elements each) intersects the slice of
    new DP index ``new_d`` (``ceil(numel / new_dp)`` each, cut at ``numel``). Empty for an empty slice."""
    if numel <= 0:
        return []
    l_new = -(-numel // new_dp)
    lo, hi = new_d * l_new, min((new_d + 1) * l_new, numel)
    if hi <= lo:
        return []
    l_old = -(-numel // old_dp)
    return list(range(lo // l_old, (hi - 1) // l_old + 1))


def shrinks_when_spares_run_out(*, enabled: bool, mode: str, spares_exhausted: str, engine: str) -> bool:
    """Whether a fault that needs a replacement when no spare is left shrinks the job (dp - 1) instead of
    stopping it. Pure; the coordinator's policy (docs/design.md section 6, "Shrink").

    True with PHOENIX protection on (``resilience.enabled``, ``resilience.mode`` ``phoenix``) and
    ``resilience.spares_exhausted`` ``shrink``, or ``auto`` with engine ``torch`` (the only engine that can
    re-partition its optimizer). Whether the grid then allows the shrink is :func:`shrink_refusal`'s to say."""
    return bool(enabled and mode == "phoenix"
                and (spares_exhausted == "shrink" or (spares_exhausted == "auto" and engine == "torch")))


def removed_replicas(grid: tuple[int, int, int], lost_logical: Iterable[int]) -> list[int]:
    """The DP indices of the replicas that hold ``lost_logical`` ranks (sorted)."""
    tp, pp, dp = grid
    return sorted({coord_of(r, tp, pp, dp).dp for r in lost_logical})


def shrink_refusal(grid: tuple[int, int, int], lost_logical: Iterable[int],
                   node_of_logical: Mapping[int, str] | None = None, k: int = 1) -> str | None:
    """Why a shrink that removes the replicas of ``lost_logical`` is impossible, or None. Pure.

    Impossible when no whole model replica would remain (dp' < 1), or (with ``node_of_logical``, the node of
    every logical rank) when the kept slots span fewer than ``k + 1`` nodes: each shard's ``k`` replicas must
    be on nodes other than its owner's (e.g. pp=1, k=1: dp' = 1 leaves one node)."""
    tp, pp, dp = grid
    h = removed_replicas(grid, lost_logical)
    if dp - len(h) < 1:
        return (f"a shrink would remove DP replica(s) {h} of {dp} and leave dp = {dp - len(h)}; at least one whole "
                "model replica must remain")
    if node_of_logical is not None:
        gone = set(h)
        kept = {node_of_logical[r] for r in range(tp * pp * dp) if coord_of(r, tp, pp, dp).dp not in gone}
        if len(kept) < k + 1:
            return (f"a shrink to dp = {dp - len(h)} would leave {len(kept)} node(s), too few for k = {k} "
                    f"replica(s) of each shard on a node other than its owner's (needs {k + 1} nodes)")
    return None


@takes_plan_input
def plan_shrink(inputs: PlanInput, *, numel: Mapping[str, int], k: int = 1) -> RecoveryPlan:
    """Plan a shrink (module doc).

    Args:
        inputs: as :func:`phoenix_hpc.recovery.plan.plan_recovery` (``dead``: world ranks; a slot drained with
            ``--shrink`` is among them; ``spares`` is not read).
        numel: ``"pp{pp}/tp{tp}"`` -> elements of that stage's flat optimizer vector (every stage).
        k: replicas per shard: the members must span at least ``k + 1`` nodes (the new grid's placement
            takes holders beyond the DP peers where it must, :func:`phoenix_hpc.topology.place_replicas`).

    Returns:
        A frozen :class:`RecoveryPlan` with ``action == "shrink"``, ``grid`` the new grid, ``old_grid``,
        ``leavers``, ``needs``, ``sources`` and ``reshard`` transfers.

    Raises:
        FallbackRequired: the shrink is impossible (:func:`shrink_refusal`), an old shard has no copy at the
            recoverable step, or a stage's ``numel`` is missing (no member of it could report one).
        RecoveryError: inconsistent input (rank map does not cover the grid, no lost active slot).
    """
    generation, grid, rank_map, nodes, dead = inputs.generation, inputs.grid, inputs.rank_map, inputs.nodes, inputs.dead
    placement, committed, live_steps, dirty = inputs.placement, inputs.committed, inputs.live_steps, inputs.dirty
    tp, pp, dp = grid
    n = tp * pp * dp
    if sorted(rank_map) != list(range(n)):
        raise RecoveryError(f"rank map covers logical ranks {sorted(rank_map)}, grid needs 0..{n - 1}")
    w2l = {w: r for r, w in rank_map.items()}
    dead_set = set(dead)
    lost = sorted(w2l[w] for w in dead_set if w in w2l)
    if not lost:
        raise RecoveryError("a shrink needs a lost (dead or drained) active slot")
    why = shrink_refusal(grid, lost, {r: nodes[w] for r, w in rank_map.items()}, k)
    if why:
        raise FallbackRequired(why)
    gone = set(removed_replicas(grid, lost))
    new_dp = dp - len(gone)
    dirty_set = set(dirty)
    alive_set = set(range(n)) - set(lost)
    recoverable, sid_of = recoverable_of(grid, rank_map, nodes, placement, committed, live_steps,
                                         set(lost), alive_set, dirty_set)

    kept = [d for d in range(dp) if d not in gone]
    new_index = {d: i for i, d in enumerate(kept)}
    new_map: dict[int, int] = {}
    leavers: list[int] = []
    for r in range(n):
        c = coord_of(r, tp, pp, dp)
        if c.dp in gone:
            if r in alive_set:
                leavers.append(rank_map[r])
            continue
        new_map[(c.pp * new_dp + new_index[c.dp]) * tp + c.tp] = rank_map[r]

    # an old slice comes from its owner when it is alive, else from a live holder of its replica at R
    sources = {sid_of(r): rank_map[r if r in alive_set else
                                    holder_at(sid_of(r), recoverable, placement, committed, alive_set)]
               for r in range(n)}

    transfers: list[Transfer] = []
    needs: list[tuple[int, tuple[str, ...]]] = []
    for p in range(pp):
        for t in range(tp):
            key = f"pp{p}/tp{t}"
            if key not in numel:  # its engine cannot re-partition (or every member of the stage is lost)
                raise FallbackRequired(f"no spare left and no shrink: no member reported the optimizer size of "
                                       f"stage {key}")
            for d_new in range(new_dp):
                w = new_map[(p * new_dp + d_new) * tp + t]
                sids = tuple(f"opt/pp{p}/tp{t}/dp{d}" for d in overlapping(int(numel[key]), dp, new_dp, d_new))
                needs.append((w, sids))
                transfers += [Transfer("reshard", sid, sources[sid], w, recoverable) for sid in sids
                              if sources[sid] != w]

    rollbacks = tuple((r, live_steps[r]) for r in sorted(alive_set) if live_steps[r] > recoverable or r in dirty_set)
    newest = max([live_steps[r] for r in alive_set] + [recoverable])
    return RecoveryPlan(
        action="shrink",
        old_generation=generation,
        generation=generation + 1,
        rank_map=tuple(sorted(new_map.items())),
        dead_world=tuple(sorted(dead_set)),
        released_spares=tuple(sorted(w for w in dead_set if w not in w2l)),
        joins=(),
        transfers=tuple(transfers),
        recoverable_step=recoverable,
        rollbacks=rollbacks,
        replication=(),
        steps_replayed=newest - recoverable,
        grid=Grid(tp, pp, new_dp),
        invariants=SHRINK_INVARIANTS,
        old_grid=Grid(tp, pp, dp),
        leavers=tuple(leavers),
        needs=tuple(needs),
        sources=tuple(sorted(sources.items())),
        lost=tuple(sorted(rank_map[r] for r in lost)),
    )
