"""Registration rules as a table: a ``register`` message, the slots, the job's grid, rank map and state in;
the verdict out (control/admission.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from phoenix_hpc.control.admission import admit, declare_dead
from phoenix_hpc.control.classify import FaultKind
from phoenix_hpc.control.states import JobState, SlotState

GRID = (1, 1, 2)
SLOTS = {0: SimpleNamespace(state=SlotState.ACTIVE, pid=100, node="n0"),
         5: SimpleNamespace(state=SlotState.DEAD, pid=105, node="n2")}


def _reg(**kw):
    body = {"type": "register", "world_rank": 1, "pid": 101, "node": "n1", "role": "active", "grid": [1, 1, 2],
            "logical_rank": 1, "world_size": 8}
    body.update(kw)
    return body


# (name, message fields, job grid, job state) -> (reject reason or "", journal key)
CASES = [
    ("an active slot at start", {}, GRID, JobState.STARTING, ("", None)),
    ("a spare any time", {"role": "standby", "world_rank": 3}, GRID, JobState.RUNNING, ("", None)),
    ("world rank past the world size", {"world_rank": 8}, GRID, JobState.STARTING,
     ("world rank 8 out of range (world size 8)", None)),
    ("an unknown role", {"role": "boss"}, GRID, JobState.STARTING, ("role 'boss' is not 'active' or 'standby'", None)),
    ("registered already", {"world_rank": 0}, GRID, JobState.STARTING,
     ("register: world rank 0 already registered (pid 100 on n0, active)", ("register", 0, 101))),
    ("declared dead: no coming back", {"world_rank": 5, "pid": 205}, GRID, JobState.STARTING,
     ("register: world rank 5 was declared dead; a restarted process cannot rejoin", ("register", 5, 205))),
    ("another grid", {"grid": [2, 1, 1]}, GRID, JobState.STARTING,
     ("register: world rank 1 has grid (2, 1, 1), job grid is (1, 1, 2)", None)),
    ("logical rank outside the grid", {"logical_rank": 2}, GRID, JobState.STARTING,
     ("register: logical rank 2 out of range 0..1", None)),
    ("logical rank taken", {"logical_rank": 0}, GRID, JobState.STARTING,
     ("register: logical rank 0 already held by world rank 0", None)),
    ("an active slot after the start", {}, GRID, JobState.RUNNING,
     ("register: the job is running; active slots register only at start", None)),
    ("malformed placement inputs", {"placement_inputs": {"k": -1, "levels": ["node"]}}, GRID, JobState.STARTING,
     ("register: world rank 1 placement_inputs k -1 is not an integer >= 0", None)),
]


@pytest.mark.parametrize("name,fields,grid,job,expected", CASES, ids=[c[0] for c in CASES])
def test_admission_table(name, fields, grid, job, expected):
    a = admit(_reg(**fields), slots=SLOTS, grid=grid, rank_map={0: 0}, job_state=job)
    assert (a.reject, a.key) == expected


def test_the_first_active_registration_sets_the_grid_and_the_slot_is_described():
    a = admit(_reg(placement_inputs={"k": 1, "levels": ["node"], "domain": {"rack": "r1"}}), slots={}, grid=None,
              rank_map={}, job_state=JobState.STARTING)
    assert a.reject == "" and a.grid == (1, 1, 2)
    assert (a.world_rank, a.pid, a.node, a.role, a.logical_rank, a.domain) == (1, 101, "n1", "active", 1,
                                                                               {"rack": "r1"})
    spare = admit(_reg(role="standby", grid=None, logical_rank=None), slots={}, grid=None, rank_map={},
                  job_state=JobState.RUNNING)
    assert spare.reject == "" and spare.grid is None and spare.logical_rank is None


@pytest.mark.parametrize("fields", [{"world_rank": "x"}, {"pid": None}, {"grid": None}])
def test_a_malformed_registration_raises_for_the_dispatcher_to_reject(fields):
    with pytest.raises((KeyError, TypeError, ValueError)):
        admit(_reg(**fields), slots={}, grid=None, rank_map={}, job_state=JobState.STARTING)


def _members():
    return {w: SimpleNamespace(state=st, node=f"n{w // 2}", last_seen=float(w))
            for w, st in [(0, SlotState.ACTIVE), (1, SlotState.ACTIVE), (2, SlotState.STANDBY),
                          (3, SlotState.STANDBY), (4, SlotState.DEAD), (5, SlotState.DONE)]}


# (name, worlds) -> (worlds that die, record names, fault slots or None, t_fault)
DEATHS = [
    ("a member: a fault to queue", [1], ([1], ["slots_dead"], (1,), 1.0)),
    ("a member and a spare on one node: one fault", [3, 0], ([3, 0], ["slots_dead"], (3, 0), 0.0)),
    ("only a spare: the pool shrinks", [2], ([2], ["slots_dead", "spare_lost"], None, 2.0)),
    ("dead or done already: nothing", [4, 5], None),
]


@pytest.mark.parametrize("name,worlds,expected", DEATHS, ids=[d[0] for d in DEATHS])
def test_declare_dead_table(name, worlds, expected):
    d = declare_dead(worlds, FaultKind.PROCESS_EXIT, "process exited", slots=_members(), members={0, 1})
    if expected is None:
        assert d is None
        return
    dying, names, fault_slots, t_fault = expected
    assert list(d.worlds) == dying and [r.NAME for r in d.records] == names and d.t_fault == t_fault
    assert (d.fault.slots if d.fault else None) == fault_slots
    assert [(f.world_rank, f.body["job_state"]) for f in d.fences] == [(w, "fenced") for w in dying]
    assert d.fences[0].body["reason"] == "this slot was declared dead (process_exit: process exited)"
    if "spare_lost" in names:
        assert d.records[1].spares_left == [3]  # the spare that died is no longer one
