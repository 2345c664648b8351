"""The recoverable step's one definition (phoenix_hpc/recovery/steps.py) and its users agree."""

from __future__ import annotations

import pytest

from phoenix_hpc.control.ending import choose_step
from phoenix_hpc.recovery.plan import FallbackRequired, plan_recovery
from phoenix_hpc.recovery.steps import committed_step, newest_common_step, recoverable_step, shards_without


def test_recoverable_step_is_the_minimum_over_shards_of_the_newest_step_each_can_provide():
    assert recoverable_step({"a": 7, "b": 5, "c": 6}) == 5
    assert recoverable_step({"a": {7, 6}, "b": [6, 5], "c": (9,)}) == 6
    assert recoverable_step({"a": 7, "b": None}) is None  # a shard without a copy
    assert recoverable_step({"a": 7, "b": []}) is None
    assert recoverable_step({}) is None


def test_shards_without_names_the_shards_that_cannot_provide_the_step():
    steps = {"a": {7, 6}, "b": {6, 5}, "c": {8, 7}}
    assert recoverable_step(steps) == 6
    assert shards_without(steps, 6) == ["c"]
    assert shards_without({"a": 3, "b": [3, 2]}, 3) == []


def test_committed_step_is_the_oldest_copy_and_newest_common_step_the_intersection():
    assert committed_step({0: 12, 1: 11, 3: 12}) == 11
    assert committed_step({}) is None
    assert newest_common_step({0: [288, 287], 1: [287, 286]}) == 287
    assert newest_common_step({0: [5], 1: [7, 6]}) is None
    assert newest_common_step({}) is None
    assert choose_step({0: [288, 287], 1: [288]}) == newest_common_step({0: [288, 287], 1: [288]}) == 288


def _plan(committed, live_steps, dead=()):
    # dp=2 grid, one rank per node, one spare (world 2)
    return plan_recovery(generation=0, grid=(1, 1, 2), rank_map={0: 0, 1: 1}, nodes={0: "n0", 1: "n1", 2: "n2"},
                         dead=list(dead), spares=[2], placement={"opt/pp0/tp0/dp0": [1], "opt/pp0/tp0/dp1": [0]},
                         committed=committed, live_steps=live_steps)


def test_the_plan_uses_the_same_recoverable_step():
    # rank 1 dead: its shard only from rank 0's replica (steps 9, 8); rank 0's own shard: live 10, snapshot 9
    committed = {"opt/pp0/tp0/dp0": {0: [9, 8]}, "opt/pp0/tp0/dp1": {0: [9, 8], 1: [9, 8]}}
    plan = _plan(committed, {0: 10}, dead=[1])
    assert plan.recoverable_step == recoverable_step({"opt/pp0/tp0/dp0": {10, 9, 8}, "opt/pp0/tp0/dp1": {9, 8}}) == 9


def test_the_plan_falls_back_when_a_shard_cannot_provide_the_recoverable_step():
    # rank 0 live at 10 with snapshot 10 only; rank 1's replica on rank 0 holds 8 and 7: R = 8, rank 0 lacks 8
    committed = {"opt/pp0/tp0/dp0": {0: [10]}, "opt/pp0/tp0/dp1": {0: [8, 7]}}
    with pytest.raises(FallbackRequired, match="opt/pp0/tp0/dp0"):
        _plan(committed, {0: 10}, dead=[1])
