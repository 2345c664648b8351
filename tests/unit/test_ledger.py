"""The training reports' rules as tables: a ``fault`` report and the job's situation in, the journal record
and the fault to queue out; the ``done`` reports in, whether the job is done and its final record out
(control/ledger.py)."""

from __future__ import annotations

import hashlib

import pytest

from phoenix_hpc.control.classify import FaultKind
from phoenix_hpc.control.ledger import all_done, fault_report, job_done
from phoenix_hpc.control.states import JobState, RecoveryPhase

# (name, report fields, slot generation, job generation, stopping) -> (kind, superseded)
FAULTS = [
    ("a known kind", {"kind": "gpu_memory", "generation": 2}, 2, 2, False, (FaultKind.GPU_MEMORY, False)),
    ("the kind read from the exception", {"exc_type": "RuntimeError", "message": "NCCL error: remote process exited",
                                          "generation": 2}, 2, 2, False, None),
    ("an older generation's collectives", {"kind": "comm_error", "generation": 1}, 1, 2, False,
     (FaultKind.COMM_ERROR, True)),
    ("without a generation: the slot's", {"kind": "comm_error"}, 1, 2, False, (FaultKind.COMM_ERROR, True)),
    ("during a stop", {"kind": "comm_error", "generation": 2}, 2, 2, True, (FaultKind.COMM_ERROR, True)),
    ("the slot got the signal", {"kind": "comm_error", "generation": 2, "signalled": "TERM"}, 2, 2, False,
     (FaultKind.COMM_ERROR, True)),
    ("an unknown kind name: read from the exception", {"kind": "meteor", "exc_type": "FloatingPointError",
                                                       "message": "nan", "generation": 0}, 0, 0, False, None),
]


@pytest.mark.parametrize("name,fields,slot_g,g,stopping,expected", FAULTS, ids=[f[0] for f in FAULTS])
def test_fault_report_table(name, fields, slot_g, g, stopping, expected):
    body = {"type": "fault", "world_rank": 3, "step": 7, "phase": "forward", **fields}
    record, fault = fault_report(body, world_rank=3, node="n1", slot_generation=slot_g, generation=g,
                                 stopping=stopping)
    assert (record.NAME, record.world_rank, record.node, record.step) == ("fault", 3, "n1", 7)
    assert record.superseded is (fault is None)
    if expected is not None:
        kind, superseded = expected
        assert (record.kind, record.superseded) == (kind.value, superseded)
    if fault is not None:
        assert (fault.kind.value, fault.slots, fault.nodes, fault.all_alive) == (record.kind, (3,), ("n1",), False)
        assert fault.detail == f"{body.get('exc_type', '')}: {body.get('message', '')}"


@pytest.mark.parametrize("fields, bad, agreed", [
    ({"kind": "silent_corruption", "corrupt_step": 11, "agreed_step": 10}, 11, 10),
    ({"kind": "silent_corruption", "corrupt_step": 11, "agreed_step": None}, 11, None),
    ({"kind": "silent_corruption", "corrupt_step": 11, "agreed_step": 11}, None, None),  # not below: ignored
    ({"kind": "silent_corruption", "corrupt_step": "11", "agreed_step": 10}, None, None),  # not an int
    ({"kind": "silent_corruption", "corrupt_step": -1}, None, None),
    ({"kind": "silent_corruption", "corrupt_step": True}, None, None),
    ({"kind": "comm_error", "corrupt_step": 11}, None, None),  # only a difference of the replicas names one
])
def test_a_fence_disagreement_names_the_step_to_roll_back_before(fields, bad, agreed):
    body = {"type": "fault", "world_rank": 3, "step": 13, "phase": "wait_commit", "generation": 0, **fields}
    _, fault = fault_report(body, world_rank=3, node="n1", slot_generation=0, generation=0, stopping=False)
    assert (fault.bad_step, fault.agreed_step) == (bad, agreed)


def test_a_long_message_is_cut_in_the_record_and_the_fault():
    body = {"kind": "software_bug", "exc_type": "E", "message": "x" * 2000, "generation": 0}
    record, fault = fault_report(body, world_rank=0, node="n0", slot_generation=0, generation=0, stopping=False)
    assert len(record.message) == 500 and len(fault.detail) == 300


D = {0: {"step": 10, "state_hash": "aa"}, 1: {"step": 10, "state_hash": "bb"}}

# (name, done, members, grid, job state, recovery phase) -> all done?
DONE = [
    ("every member done while running", D, 2, (1, 1, 2), JobState.RUNNING, None, True),
    ("one member left", {0: D[0]}, 2, (1, 1, 2), JobState.RUNNING, None, False),
    ("during a recovery's replay", D, 2, (1, 1, 2), JobState.RUNNING, RecoveryPhase.REPLAY, True),
    ("during a recovery's restore", D, 2, (1, 1, 2), JobState.RUNNING, RecoveryPhase.RESTORE, False),
    ("while recovering", D, 2, (1, 1, 2), JobState.RECOVERING, None, False),
    ("no grid yet", D, 2, None, JobState.RUNNING, None, False),
]


@pytest.mark.parametrize("name,done,members,grid,job,phase,expected", DONE, ids=[d[0] for d in DONE])
def test_all_done_table(name, done, members, grid, job, phase, expected):
    assert all_done(done, members=members, grid=grid, job_state=job, phase=phase) is expected


def test_the_final_record_hashes_the_members_in_logical_order():
    ev = job_done({1: {"step": 9, "state_hash": "bb"}, 0: {"step": 10, "state_hash": "aa"}}, grid=(1, 1, 2),
                  generation=3)
    assert ev.final_hash == hashlib.sha256(b"aabb").hexdigest()
    assert (ev.step, ev.steps_agree, ev.rank_hashes, ev.grid, ev.generation) == (10, False, ["aa", "bb"],
                                                                                 [1, 1, 2], 3)
