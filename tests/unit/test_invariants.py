"""I1-I4 as pure checks over member reports."""

import dataclasses

import pytest

from phoenix_hpc.errors import RecoveryError
from phoenix_hpc.recovery.invariants import Expected, MemberReport, assert_invariants, check_all, report_from_json

RANK_MAP = ((0, 0), (1, 5))
SHARDS = {"opt/pp0/tp0/dp0": 0, "opt/pp0/tp0/dp1": 1}
EXP = Expected(generation=2, rank_map=RANK_MAP, shard_owner=SHARDS, step=7)


def _good():
    return {
        0: MemberReport(0, 0, 2, RANK_MAP, 7, False, ("opt/pp0/tp0/dp0",), (("opt/pp0/tp0/dp0", 7), ("opt/pp0/tp0/dp1", 7))),
        5: MemberReport(5, 1, 2, RANK_MAP, 7, False, ("opt/pp0/tp0/dp1",), (("opt/pp0/tp0/dp1", 7),)),
    }


def test_consistent_state_passes():
    assert check_all(EXP, _good()) == []
    assert_invariants(EXP, _good())


def _broken(world, **changes):
    reps = _good()
    reps[world] = dataclasses.replace(reps[world], **changes)
    return reps


@pytest.mark.parametrize(
    "reports,inv,text",
    [
        (_broken(5, generation=1), "I1", "generation 1, expected 2"),
        (_broken(5, rank_map=((0, 0), (1, 1))), "I1", "different rank map"),
        ({0: _good()[0]}, "I1", "world rank 5 is a member of generation 2 but did not report"),
        (_broken(5, owned_shards=("opt/pp0/tp0/dp0",)), "I2", "2 owners"),
        (_broken(5, owned_shards=()), "I2", "0 owners"),
        (_broken(0, copies=()) | {5: dataclasses.replace(_good()[5], copies=(("opt/pp0/tp0/dp1", 7),))}, "I3", "opt/pp0/tp0/dp0 has no verified"),
        (_broken(0, step=8), "I4", "world rank 0 is at step 8"),
        (_broken(5, partial=True), "I4", "partial step"),
    ],
)
def test_each_violation_is_found_and_named(reports, inv, text):
    bad = check_all(EXP, reports)
    assert any(v.invariant == inv and text in v.message for v in bad), bad
    with pytest.raises(RecoveryError, match=inv):
        assert_invariants(EXP, reports)


def test_report_roundtrip_from_json():
    r = report_from_json({"world_rank": 5, "logical_rank": 1, "generation": 2, "rank_map": [[0, 0], [1, 5]], "step": 7,
                          "owned_shards": ["opt/pp0/tp0/dp1"], "copies": [["opt/pp0/tp0/dp1", 7]]})
    assert r == _good()[5]
