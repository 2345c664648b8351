"""Drill planning and targeting (pure): the batch host rule, outcome matching."""

from __future__ import annotations

import pytest

from phoenix_hpc.errors import FaultError
from phoenix_hpc.drills.drill import (VERIFIED_KINDS, DrillFault, DrillOutcome, match_outcome, plan_drill,
                                      quiesce_by_generation, resolve_target)
from phoenix_hpc.status.model import InjectionStatus, RecoveryStatus


def test_default_kinds_are_the_verified_ones():
    assert set(VERIFIED_KINDS) == {"crash", "kill-node", "hang", "transient"}
    for seed in range(40):
        plan = plan_drill(3, seed, steps=60, world=4, gpus_per_node=1, spare_nodes=2)
        assert {f.kind for f in plan} <= set(VERIFIED_KINDS)


class _Slot:
    def __init__(self, w, node, r, state="active"):
        self.world_rank, self.node, self.logical_rank, self.state = w, node, r, state


class _Job:
    batch_host = "nid00001"


class _St:
    def __init__(self, slots, injections=(), recoveries=()):
        self.slots, self.job = slots, _Job()
        self.injections, self.recoveries = list(injections), list(recoveries)


SLOTS = [_Slot(0, "nid00001", 0), _Slot(1, "nid00002", 1), _Slot(2, "nid00003", None, "standby")]


def test_kill_node_is_moved_off_the_batch_host_other_kinds_are_not():
    assert resolve_target(DrillFault(0, "kill-node", "forward", 9, 0), _St(SLOTS)) == (1, 1, "nid00002")
    assert resolve_target(DrillFault(0, "crash", "forward", 9, 0), _St(SLOTS)) == (0, 0, "nid00001")
    assert resolve_target(DrillFault(0, "kill-node", "forward", 9, 1), _St(SLOTS)) == (1, 1, "nid00002")
    with pytest.raises(FaultError, match="outside the batch host"):
        resolve_target(DrillFault(0, "kill-node", "forward", 9, 0), _St(SLOTS[:1]))
    with pytest.raises(FaultError, match="no active slot holds logical rank 1"):
        resolve_target(DrillFault(0, "crash", "forward", 9, 1), _St(SLOTS[:1]))


def _rec(gen, t0, action="hot_swap"):
    return RecoveryStatus(generation=gen, action=action, state="done", started_at=t0, finished_at=t0 + 5,
                          reason=None, dead_slots=[1], joins=[], detect_s=4.0, total_s=9.0,
                          phases={"detect": 4.0, "reconfigure": 1.0, "params": 0.5, "optimizer": 0.5, "replay": 0.5},
                          steps_replayed=1, recoverable_step=5)


def test_outcome_takes_the_recovery_between_its_landing_and_the_next_fault():
    inj = [InjectionStatus("a", 1.0, "crash", "forward", 7, [1], [{"world_rank": 1, "step": 7, "phase": "forward",
                                                                   "ts": 10.0}]),
           InjectionStatus("b", 20.0, "crash", "forward", 20, [1], [{"world_rank": 2, "step": 20,
                                                                     "phase": "forward", "ts": 30.0}])]
    st = _St(SLOTS, inj, [_rec(1, 31.0)])  # fault a caused no recovery; the only one follows fault b
    a = match_outcome(DrillOutcome(DrillFault(0, "crash", "forward", 7, 1), request_id="a", at_step=7), st,
                      before_ts=30.0)
    assert a.landed_as_requested and a.recovery_state is None and not a.passed
    b = match_outcome(DrillOutcome(DrillFault(1, "crash", "forward", 20, 1), request_id="b", at_step=20), st)
    assert b.passed and b.generation == 1
    # a transient fault expects a local recovery: a hot swap is reported, not passed
    t = match_outcome(DrillOutcome(DrillFault(1, "transient", "forward", 20, 1), request_id="b", at_step=20), st)
    assert t.recovered and t.expected_action == "local_recovery" and not t.passed


def test_quiesce_is_start_to_plan_per_generation():
    recs = [{"ts": 10.0, "event": "recovery_start", "generation": 1}, {"ts": 13.5, "event": "recovery_plan",
                                                                       "generation": 1},
            {"ts": 20.0, "event": "recovery_start", "generation": 2}]
    assert quiesce_by_generation(recs) == {1: 3.5}


def test_plan_leaves_half_a_segment_between_faults():
    for seed in range(40):
        steps = [f.at_step for f in plan_drill(2, seed, steps=60, world=2, gpus_per_node=1, spare_nodes=2)]
        assert steps[1] - steps[0] >= 14 and 3 <= steps[0] and steps[1] <= 58
