"""The planner's inputs from the members' quiesce answers, and the fallback's checkpoint: tables of answers in,
inputs out (control/recovery_answers.py)."""

from __future__ import annotations

import pytest

from phoenix_hpc.control.recovery_answers import fallback_checkpoint, gather_quiesced

A0 = {"live_step": 9, "shards": {"s0": [9, 8]}, "replicas": {"s1": 9}, "opt_numel": {"pp0": 100}}
A1 = {"live_step": 9, "dirty": True, "shards": {"s1": [9, 8]}, "replicas": {"s0": [9, 8]}}
CUT = {"live_step": -1, "shards": {"s2": [7]}}  # a spare whose restore was cut short: offers nothing

GATHER = [
    ("two survivors", {0: A0, 1: A1}, {0: 0, 1: 1}, (), None,
     ({"s0": {0: [9, 8], 1: [9, 8]}, "s1": {0: [9], 1: [9, 8]}}, {0: 9, 1: 9}, [1], {"pp0": 100}, set())),
    ("a cut-short spare is restored again in place and offers nothing", {0: A0, 2: CUT}, {0: 0, 2: 2}, (), None,
     ({"s0": {0: [9, 8]}, "s1": {0: [9]}}, {0: 9}, [], {"pp0": 100}, {2})),
    ("a member already pending offers nothing either", {0: A0, 1: A1}, {0: 0, 1: 1}, (1,), None,
     ({"s0": {0: [9, 8]}, "s1": {0: [9]}}, {0: 9}, [], {"pp0": 100}, {1})),
    ("a slot of no logical rank is skipped", {0: A0, 5: A1}, {0: 0, 5: None}, (), None,
     ({"s0": {0: [9, 8]}, "s1": {0: [9]}}, {0: 9}, [], {"pp0": 100}, set())),
    ("replicas differed at step 9: only older copies, every member at 9 dirty", {0: A0, 1: A1}, {0: 0, 1: 1}, (), 9,
     ({"s0": {0: [8], 1: [8]}, "s1": {1: [8]}}, {0: 9, 1: 9}, [0, 1], {"pp0": 100}, set())),
]


@pytest.mark.parametrize("name,answers,logical,pending,bad,expected", GATHER, ids=[g[0] for g in GATHER])
def test_gather_quiesced_table(name, answers, logical, pending, bad, expected):
    q = gather_quiesced(answers, logical, pending, bad)
    assert (q.committed, q.live_steps, q.dirty, q.numel, set(q.restore_pending)) == expected


FALLBACK = [
    ("the newest checkpoint, lost steps to the newest live step", 10, [5, 10], None, {0: 13, 1: 12}, [], (10, 3)),
    ("no checkpoint", None, [], None, {0: 13}, [], (None, None)),
    ("every member lost: their last reported steps", 10, [10], None, {}, [11, 14], (10, 4)),
    ("replicas differed at 10: the checkpoint of 10 may carry it", 10, [5, 10], 10, {0: 12}, [], (5, 7)),
    ("differed at 11: the checkpoint of 10 is from before", 10, [5, 10], 11, {0: 12}, [], (10, 2)),
    ("differed at 4: none from before", 10, [5, 10], 4, {0: 12}, [], (None, None)),
]


@pytest.mark.parametrize("name,newest,complete,bad,live,reported,expected", FALLBACK, ids=[f[0] for f in FALLBACK])
def test_fallback_checkpoint_table(name, newest, complete, bad, live, reported, expected):
    assert fallback_checkpoint(newest, complete, bad, live, reported) == expected
