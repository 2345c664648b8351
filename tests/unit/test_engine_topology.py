"""Grid maths: logical rank <-> coordinate in Megatron order, group member lists."""

import itertools

import pytest

from phoenix_hpc.engines.base import GridCoord
from phoenix_hpc.topology import (
    all_dp_groups,
    all_pp_groups,
    all_tp_groups,
    coord_of,
    dp_group_ranks,
    pp_group_ranks,
    rank_of,
    tp_group_ranks,
)


@pytest.mark.parametrize("tp,pp,dp", [(1, 1, 1), (1, 2, 2), (2, 2, 3), (4, 1, 2), (2, 4, 1)])
def test_rank_coord_roundtrip_and_groups_partition(tp, pp, dp):
    n = tp * pp * dp
    coords = [coord_of(r, tp, pp, dp) for r in range(n)]
    assert len(set(coords)) == n
    for r, c in enumerate(coords):
        assert rank_of(c, tp, pp, dp) == r
        assert r in dp_group_ranks(c, tp, pp, dp)
        assert r in pp_group_ranks(c, tp, pp, dp)
        assert r in tp_group_ranks(c, tp, pp, dp)
    for groups, size in ((all_dp_groups(tp, pp, dp), dp), (all_pp_groups(tp, pp, dp), pp), (all_tp_groups(tp, pp, dp), tp)):
        flat = list(itertools.chain.from_iterable(groups))
        assert sorted(flat) == list(range(n))
        assert all(len(g) == size for g in groups)


def test_megatron_order_tp_fastest_then_dp_then_pp():
    # tp=2, pp=2, dp=2: rank 1 = tp1, rank 2 = dp1, rank 4 = pp1 (megatron.core.parallel_state order).
    assert coord_of(1, 2, 2, 2) == GridCoord(pp=0, dp=0, tp=1)
    assert coord_of(2, 2, 2, 2) == GridCoord(pp=0, dp=1, tp=0)
    assert coord_of(4, 2, 2, 2) == GridCoord(pp=1, dp=0, tp=0)
    assert dp_group_ranks(GridCoord(1, 0, 1), 2, 2, 2) == [5, 7]
    assert pp_group_ranks(GridCoord(0, 1, 0), 2, 2, 2) == [2, 6]
    assert tp_group_ranks(GridCoord(1, 1, 0), 2, 2, 2) == [6, 7]


def test_out_of_range_rejected():
    with pytest.raises(ValueError, match="out of range"):
        coord_of(8, 2, 2, 2)
    with pytest.raises(ValueError, match="out of range"):
        rank_of(GridCoord(2, 0, 0), 1, 2, 2)
    with pytest.raises(ValueError, match="size"):
        coord_of(0, 0, 1, 1)
