"""Which live slots an operator's target names (``inject``, ``drain``), and the check of a request's step
fields. Pure.

A target is one of ``{"world_rank": W}``, ``{"logical_rank": R}`` (the slot holding R now), ``{"node": N}``
(every live slot on N) or ``{"coord": [pp, dp, tp]}`` (the slot at that grid position: logical rank
``(pp * DP + dp) * TP + tp``, :func:`phoenix_hpc.topology.coord_of`'s order).
"""

from __future__ import annotations

from typing import Any, Mapping

from phoenix_hpc.control.records import Slot
from phoenix_hpc.control.states import LIVE_SLOT_STATES


def resolve_target(target: Any, slots: Mapping[int, Slot], rank_map: Mapping[int, int],
                   grid: tuple[int, int, int] | None) -> tuple[list[int], str]:
    """``(world ranks, "")`` of the live slots ``target`` names, or ``([], why)`` naming what is wrong and
    what is allowed. ``rank_map``: logical -> world rank; ``grid``: ``(tp, pp, dp)`` or None before the first
    registration. Pure.

    Raises:
        ValueError: a rank or coordinate that is not an integer (the caller refuses the request).
    """
    live = {w: s for w, s in slots.items() if s.state in LIVE_SLOT_STATES}
    if not isinstance(target, dict) or len(target) != 1:
        return [], (f"target {target!r} must be one of {{world_rank}}, {{logical_rank}}, {{node}}, "
                    "{coord: [pp, dp, tp]}")
    (k, v), = target.items()
    if k == "world_rank":
        return ([int(v)], "") if int(v) in live else ([], f"no live slot with world rank {v} (live: {sorted(live)})")
    if k == "logical_rank":
        w = rank_map.get(int(v))
        return ([w], "") if w in live else ([], f"no live slot holds logical rank {v} "
                                                f"(grid has {len(rank_map)})")
    if k == "node":
        ws = sorted(w for w, s in live.items() if s.node == v)
        return (ws, "") if ws else ([], f"no live slot on node {v!r} (nodes: {sorted({s.node for s in live.values()})})")
    if k == "coord" and grid:
        pp, dp, tp = (int(x) for x in v)
        T, PP, D = grid
        if not (0 <= pp < PP and 0 <= dp < D and 0 <= tp < T):
            return [], f"coord {list(v)} outside the grid tp={T} pp={PP} dp={D}"
        w = rank_map.get((pp * D + dp) * T + tp)
        return ([w], "") if w in live else ([], f"no live slot at coord {list(v)}")
    return [], f"unknown target key {k!r}"


def step_count_refusal(name: str, value: Any) -> str:
    """Why ``value`` of the request field ``name`` (an iteration or a number of iterations) is refused: not an
    integer (a bool is not one) or below 1; ``""`` when it is allowed. Pure."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        return f"{name} {value!r} must be an integer >= 1"
    return ""
