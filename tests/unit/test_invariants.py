"""I1-I5 as pure checks over evidence: every invariant can fail, bad evidence is rejected with a reason."""

import dataclasses

import pytest

from phoenix_hpc.errors import RecoveryError
from phoenix_hpc.recovery.invariants import (
    Expected, HeldCopy, MemberReport, assert_invariants, check_all, report_from_json, verify_recovery,
)

# grid tp=1, pp=1, dp=2; generation 2 after a hot swap: logical 1 moved from world 1 to the spare, world 5
RANK_MAP = ((0, 0), (1, 5))
S0, S1 = "opt/pp0/tp0/dp0", "opt/pp0/tp0/dp1"
H0, H1, HP = "0a0a0a0a", "1b1b1b1b", "cccc0000"
EXP = Expected(
    generation=2, rank_map=RANK_MAP, shard_owner={S0: 0, S1: 1}, step=7,
    param_of={0: "param/pp0/tp0", 1: "param/pp0/tp0"},
    sources={S1: 0},  # the spare's optimizer shard came from world rank 0's replica
    sent={(S1, 1): frozenset({0}), (S0, 1): frozenset({1})},
    committed={(S0, 7): H0, (S1, 7): H1},
)


def _good():
    return {
        0: MemberReport(0, 0, 2, RANK_MAP, 7, False, S0, H0, "param/pp0/tp0", HP,
                        (HeldCopy(S1, 7, 1, H1), HeldCopy(S1, 6, 1, "16161616"))),
        5: MemberReport(5, 1, 2, RANK_MAP, 7, False, S1, H1, "param/pp0/tp0", HP, ()),
    }


def _broken(world, **changes):
    reps = _good()
    reps[world] = dataclasses.replace(reps[world], **changes)
    return reps


def test_consistent_evidence_passes():
    assert verify_recovery(EXP, _good()) == ([], [])
    assert_invariants(EXP, _good())


@pytest.mark.parametrize(
    "reports,inv,text",
    [
        (_broken(5, rank_map=((0, 0), (1, 1))), "I1", "different rank map"),
        ({0: _good()[0]}, "I1", "world rank 5 is a member of generation 2 but has no accepted report"),
        (_broken(5, logical_rank=0), "I1", "believes it is logical rank 0"),
        (_broken(5, opt_shard=S0), "I2", f"shard {S0} has 2 owners [logical 0 (world 0), logical 1 (world 5)]"),
        (_broken(5, opt_shard=""), "I2", f"shard {S1} has 0 owners"),
        # the spare's restored shard differs from the replica it was restored from
        (_broken(5, opt_hash="deadbeef"), "I2",
         f"shard {S1}: owner world rank 5 has optimizer hash deadbeef at step 7, the replica it was restored from "
         "held by world rank 0 has 1b1b1b1b"),
        # a survivor's live shard differs from what it committed for the step
        (_broken(0, opt_hash="deadbeef"), "I2", f"shard {S0}: owner world rank 0 has optimizer hash deadbeef at step 7, "
                                                "its owner committed 0a0a0a0a"),
        # the source shows no replica of the shard at R
        (_broken(0, held=(HeldCopy(S1, 6, 1, "16161616"),)), "I3",
         f"shard {S1} was restored from world rank 0, which shows no verified replica of it at step 7"),
        (_broken(0, step=8), "I4", "world rank 0 is at step 8"),
        (_broken(5, partial=True), "I4", "partial step"),
        (_broken(5, param_hash="cccc0001"), "I5", "param shard param/pp0/tp0: DP peers disagree"),
        (_broken(5, param_shard="param/pp1/tp0"), "I5", "holds param shard 'param/pp1/tp0'"),
    ],
)
def test_each_violation_is_found_and_named(reports, inv, text):
    _, bad = verify_recovery(EXP, reports)
    assert any(v.invariant == inv and text in v.message for v in bad), bad
    with pytest.raises(RecoveryError, match=inv):
        assert_invariants(EXP, reports)


def test_a_replica_that_disagrees_with_the_restored_shard_is_a_violation_even_when_not_the_source():
    # logical 1 held S0 in generation 1; its copy of step 7 differs from the owner's restored state (no
    # commit hash known for step 7 here, so screening lets it through and I2 catches it)
    exp = dataclasses.replace(EXP, committed={})
    reps = _good()
    reps[5] = dataclasses.replace(reps[5], held=(HeldCopy(S0, 7, 1, "0a0a0a0b"),))
    _, bad = verify_recovery(exp, reps)
    assert [str(v) for v in bad] == [
        f"I2: shard {S0}: owner world rank 0 has optimizer hash 0a0a0a0a at step 7, a replica held by world rank 5 has 0a0a0a0b"]


def test_checkpoint_restart_skips_replica_comparisons_but_not_ownership():
    exp = dataclasses.replace(EXP, from_memory=False, sources={})
    reps = _broken(0, opt_hash="deadbeef", held=())
    assert verify_recovery(exp, reps) == ([], [])
    assert any(v.invariant == "I2" for v in verify_recovery(exp, _broken(5, opt_shard=S0))[1])


# --- bad evidence: rejected with a reason; the recovery goes on with what is left or stops -------------
def test_a_report_of_an_old_generation_is_rejected_and_its_member_counts_as_missing():
    rejected, bad = verify_recovery(EXP, _broken(5, generation=1))
    assert rejected == ["report of world rank 5 rejected: it is of generation 1, the recovery builds generation 2"]
    assert "world rank 5 is a member of generation 2 but has no accepted report" in " ".join(map(str, bad))


@pytest.mark.parametrize("field_,value", [("opt_hash", "1b1b1b1"), ("param_hash", "cccc00000"), ("opt_hash", "1B1B1B1B"),
                                          ("opt_hash", "")])
def test_a_state_hash_of_the_wrong_form_rejects_the_report(field_, value):
    rejected, bad = verify_recovery(EXP, _broken(5, **{field_: value}))
    assert rejected == [f"report of world rank 5 rejected: {field_} {value!r} is not 8 lowercase hex digits"]
    assert any(v.invariant == "I1" for v in bad)


def test_a_held_copy_with_a_hash_of_the_wrong_length_is_rejected_and_the_source_check_then_fails():
    rejected, bad = verify_recovery(EXP, _broken(0, held=(HeldCopy(S1, 7, 1, "1b1b"),)))
    assert rejected == [f"replica of {S1} step 7 (generation 1) held by world rank 0 (logical 0) rejected: "
                        "hash '1b1b' is not 8 lowercase hex digits"]
    assert [v.invariant for v in bad] == ["I3"]


def test_a_holder_claiming_a_shard_it_was_never_sent_is_rejected_and_the_rest_is_used():
    reps = _good()
    reps[5] = dataclasses.replace(reps[5], held=(HeldCopy(S0, 7, 1, H0),))  # world 5 is a fresh spare
    reps[0] = dataclasses.replace(reps[0], held=reps[0].held + (HeldCopy(S0, 7, 1, H0),))  # its own shard
    exp = dataclasses.replace(EXP, rank_maps={1: ((0, 0), (1, 1))})
    rejected, bad = verify_recovery(exp, reps)
    assert len(rejected) == 2, rejected
    assert "held by world rank 0 (logical 0)" in rejected[0] and "its owner never sent it to logical rank 0" in rejected[0]
    assert "held by world rank 5 (logical 1)" in rejected[1]
    assert "world rank 5 was not logical rank 1 in generation 1 (world rank 1 was)" in rejected[1]
    assert bad == []


# the owner of S1 (logical 1, world 1) died after world 0 verified its step 7 and before its commit report
# reached the coordinator: no statement of where S1 went in generation 1
DEAD_OWNER = dataclasses.replace(EXP, sent={(S0, 1): frozenset({1})}, committed={(S0, 7): H0},
                                 rank_maps={1: ((0, 0), (1, 1))})


def test_a_dead_owners_replica_is_accepted_on_the_holders_evidence_when_the_placement_gives_it_that_shard():
    exp = dataclasses.replace(DEAD_OWNER, placement={(S1, 1): frozenset({0}), (S0, 1): frozenset({1})})
    assert verify_recovery(exp, _good()) == ([], [])


def test_without_the_owners_statement_or_a_placement_the_claim_is_rejected_and_the_source_check_fails():
    rejected, bad = verify_recovery(DEAD_OWNER, _good())
    assert len(rejected) == 2 and all("made no statement of its holders in generation 1 and that generation's "
                                      "placement is not known" in r for r in rejected), rejected
    assert [v.invariant for v in bad] == ["I3"]


def test_a_claim_the_placement_says_could_never_have_been_received_is_rejected():
    exp = dataclasses.replace(DEAD_OWNER, placement={(S1, 1): frozenset({1})})  # S1 never went to logical 0
    rejected, bad = verify_recovery(exp, _good())
    assert rejected[0].endswith(f"the placement of generation 1 gives {S1} to logical ranks [1], so logical rank 0 "
                                "could never have received it"), rejected
    assert [v.invariant for v in bad] == ["I3"]


def test_a_dead_owners_replica_still_has_to_match_the_restored_shard():
    exp = dataclasses.replace(DEAD_OWNER, placement={(S1, 1): frozenset({0})})
    rejected, bad = verify_recovery(exp, _broken(5, opt_hash="22222222"))
    assert rejected == [] and [v.invariant for v in bad] == ["I2"]
    assert "owner world rank 5 has optimizer hash 22222222" in str(bad[0])


def test_a_replica_differing_from_its_owners_commit_is_rejected_as_corrupt_and_another_replica_serves():
    exp = dataclasses.replace(EXP, sent={(S1, 1): frozenset({0, 7})})
    reps = _good()
    reps[0] = dataclasses.replace(reps[0], held=(HeldCopy(S1, 7, 1, "ffffffff"),))
    rejected, bad = verify_recovery(exp, reps)
    assert rejected == [f"replica of {S1} step 7 (generation 1) held by world rank 0 (logical 0) rejected: hash ffffffff "
                        "differs from 1b1b1b1b, the hash its owner committed for step 7 (corrupt copy)"]
    assert [v.invariant for v in bad] == ["I3"]  # it was the source: the job stops, never resumes on it


def test_a_copy_claiming_the_new_generation_is_rejected():
    rejected, _ = verify_recovery(EXP, _broken(0, held=(HeldCopy(S1, 7, 2, H1),)))
    assert "a replica of generation 2 cannot exist before generation 2" in rejected[0]


def test_report_roundtrip_from_json_and_malformed_json():
    r = report_from_json({"world_rank": 5, "logical_rank": 1, "generation": 2, "rank_map": [[0, 0], [1, 5]], "step": 7,
                          "opt_shard": S1, "opt_hash": H1, "param_shard": "param/pp0/tp0", "param_hash": HP,
                          "held": []})
    assert r == _good()[5]
    with pytest.raises(ValueError, match="malformed recovery report: KeyError"):
        report_from_json({"world_rank": 5})
    with pytest.raises(ValueError, match="malformed recovery report"):
        report_from_json({"world_rank": 5, "logical_rank": 1, "generation": 2, "rank_map": [[0, 0]], "step": 7,
                          "held": [["x", 1]]})


def test_check_all_runs_only_the_named_checks():
    assert check_all(EXP, _broken(0, step=8), ("I1", "I2")) == []
