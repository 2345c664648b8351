"""A standby slot takes the plan that names it as soon as its client hands it over (launch/execute.py
``wait_for_join``): it waits only inside ``wait_instruction`` (on the doorbell), never in a sleep of its own,
skips a plan that does not name it, and ends on ``stop``; a ``stop`` that fences it is an error."""

import time

import pytest

from phoenix_hpc.launch.execute import StopRequested, wait_for_join
from phoenix_hpc.recovery.plan import Join, RecoveryPlan
from phoenix_hpc.topology import GridCoord


class _Client:
    world_rank = 2

    def __init__(self, answers):
        self.answers = list(answers)
        self.timeouts = []

    def wait_instruction(self, types, timeout_s):
        assert types == ("recover",)
        self.timeouts.append(timeout_s)
        return self.answers.pop(0)


def _plan(generation: int, joining: list[int]) -> dict:
    """A plan as a rank receives it, in which world ranks ``joining`` take logical ranks 1, 2, ..."""
    joins = tuple(Join(w, f"n{w}", i + 1, GridCoord(pp=0, dp=i + 1, tp=0), 10 + i) for i, w in enumerate(joining))
    return RecoveryPlan(action="hot_swap", old_generation=generation - 1, generation=generation,
                        rank_map=((0, 0),) + tuple((j.logical_rank, j.world_rank) for j in joins), dead_world=(),
                        released_spares=(), joins=joins, transfers=(), recoverable_step=4, rollbacks=(),
                        replication=(), steps_replayed=0, grid=(1, 1, 1 + len(joins))).to_json()


def _no_sleep(monkeypatch):
    def sleep(_s):
        raise AssertionError("wait_for_join slept outside wait_instruction")

    monkeypatch.setattr(time, "sleep", sleep)


def test_the_plan_naming_this_slot_is_taken_after_timeouts_and_other_plans_without_a_sleep(monkeypatch):
    _no_sleep(monkeypatch)
    other = {"type": "recover", "plan": _plan(1, [3])}
    mine = {"type": "recover", "plan": _plan(2, [3, 2])}
    c = _Client([None, other, None, mine])
    assert wait_for_join(c) == RecoveryPlan.from_json(mine["plan"])
    assert c.timeouts == [1.0] * 4 and c.answers == []


def test_stop_ends_the_wait_and_a_deadline_bounds_it(monkeypatch):
    _no_sleep(monkeypatch)
    assert wait_for_join(_Client([None, {"type": "stop", "reason": "job done"}])) is None
    c = _Client([None] * 100)
    assert wait_for_join(c, wait_s=0.0) is None and c.timeouts == [0.0]


def test_a_stop_that_fences_the_spare_is_raised_with_its_reason(monkeypatch):
    _no_sleep(monkeypatch)
    fence = {"type": "stop", "reason": "this slot was declared dead (heartbeat_timeout: silent 6.0 s)",
             "job_state": "fenced"}
    with pytest.raises(StopRequested, match="declared dead") as e:
        wait_for_join(_Client([None, fence]))
    assert e.value.job_state == "fenced"
