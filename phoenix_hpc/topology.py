"""Pure grid and topology maths: logical rank <-> grid coordinate, parallel group members.

Logical rank order is Megatron's (``megatron.core.parallel_state``): tp varies fastest, then dp, then pp::

    rank = (pp * dp_size + dp) * tp_size + tp

so the ``tp`` ranks of one (pp, dp) are contiguous, the ``dp`` ranks of one (pp, tp) are ``tp_size`` apart,
and the ``pp`` ranks of one (dp, tp) are ``dp_size * tp_size`` apart. All functions here are pure; they raise
:class:`ValueError` on sizes < 1 or ranks/coordinates out of range (internal misuse, not user input).
"""

from __future__ import annotations

from phoenix_hpc.engines.base import GridCoord

# --- grid maths ------------------------------------------------------------------------------------------


def _check_sizes(tp: int, pp: int, dp: int) -> None:
    for name, v in (("tp", tp), ("pp", pp), ("dp", dp)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} size must be an int >= 1, got {v!r}")


def world_size_of(tp: int, pp: int, dp: int) -> int:
    """Number of logical ranks of a ``tp x pp x dp`` grid."""
    _check_sizes(tp, pp, dp)
    return tp * pp * dp


def coord_of(rank: int, tp: int, pp: int, dp: int) -> GridCoord:
    """The grid coordinate of logical ``rank`` (Megatron order: tp fastest, then dp, then pp)."""
    n = world_size_of(tp, pp, dp)
    if not 0 <= rank < n:
        raise ValueError(f"rank {rank} out of range for a grid of {n} ranks (tp={tp}, pp={pp}, dp={dp})")
    return GridCoord(pp=rank // (tp * dp), dp=(rank // tp) % dp, tp=rank % tp)


def rank_of(coord: GridCoord, tp: int, pp: int, dp: int) -> int:
    """The logical rank of ``coord``; inverse of :func:`coord_of`."""
    _check_sizes(tp, pp, dp)
    if not (0 <= coord.pp < pp and 0 <= coord.dp < dp and 0 <= coord.tp < tp):
        raise ValueError(f"{coord} out of range for tp={tp}, pp={pp}, dp={dp}")
    return (coord.pp * dp + coord.dp) * tp + coord.tp


def dp_group_ranks(coord: GridCoord, tp: int, pp: int, dp: int) -> list[int]:
    """Logical ranks of the DP group of ``coord`` (same pp, tp), ordered by dp index."""
    return [rank_of(GridCoord(coord.pp, d, coord.tp), tp, pp, dp) for d in range(dp)]


def pp_group_ranks(coord: GridCoord, tp: int, pp: int, dp: int) -> list[int]:
    """Logical ranks of the pipeline of ``coord`` (same dp, tp), ordered by stage."""
    return [rank_of(GridCoord(p, coord.dp, coord.tp), tp, pp, dp) for p in range(pp)]


def tp_group_ranks(coord: GridCoord, tp: int, pp: int, dp: int) -> list[int]:
    """Logical ranks of the TP group of ``coord`` (same pp, dp), ordered by tp index."""
    return [rank_of(GridCoord(coord.pp, coord.dp, t), tp, pp, dp) for t in range(tp)]


def all_dp_groups(tp: int, pp: int, dp: int) -> list[list[int]]:
    """Every DP group of the grid, in (pp, tp) order. torch's ``new_group`` must be called by every rank
    for every group in the same order; this is that order."""
    return [dp_group_ranks(GridCoord(p, 0, t), tp, pp, dp) for p in range(pp) for t in range(tp)]


def all_pp_groups(tp: int, pp: int, dp: int) -> list[list[int]]:
    """Every pipeline group of the grid, in (dp, tp) order."""
    return [pp_group_ranks(GridCoord(0, d, t), tp, pp, dp) for d in range(dp) for t in range(tp)]


def all_tp_groups(tp: int, pp: int, dp: int) -> list[list[int]]:
    """Every TP group of the grid, in (pp, dp) order."""
    return [tp_group_ranks(GridCoord(p, d, 0), tp, pp, dp) for p in range(pp) for d in range(dp)]
