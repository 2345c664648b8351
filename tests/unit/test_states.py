"""Slot and job lifecycles: allowed transitions work, everything else raises."""

import itertools

import pytest

from phoenix_hpc.control.states import (
    JOB_TRANSITIONS,
    SLOT_TRANSITIONS,
    IllegalTransition,
    JobState,
    SlotState,
    job_machine,
    slot_machine,
)


def test_spare_lifecycle_and_history():
    m = slot_machine("slot 12")
    m.to(SlotState.STANDBY, "registered")
    m.to(SlotState.JOINING, "replaces world rank 3")
    m.to(SlotState.ACTIVE, "restored")
    m.to(SlotState.QUIESCED, "recovery")
    m.to(SlotState.ACTIVE, "resumed")
    m.to(SlotState.DEAD, "heartbeat timeout")
    assert [h[1] for h in m.history] == ["standby", "joining", "active", "quiesced", "active", "dead"]


def test_job_lifecycle():
    j = job_machine()
    for s in (JobState.RUNNING, JobState.RECOVERING, JobState.RUNNING, JobState.FALLBACK, JobState.RUNNING, JobState.DONE):
        j.to(s)
    assert j.state is JobState.DONE


@pytest.mark.parametrize("table,enum", [(SLOT_TRANSITIONS, SlotState), (JOB_TRANSITIONS, JobState)])
def test_every_pair_not_in_the_table_raises(table, enum):
    from phoenix_hpc.control.states import StateMachine

    for a, b in itertools.product(enum, enum):
        m = StateMachine(a, table, "x")
        if b in table[a]:
            m.to(b)
            assert m.state is b
        else:
            with pytest.raises(IllegalTransition, match=f"illegal transition {a.value} -> {b.value}"):
                m.to(b, "because")
            assert m.state is a


def test_specific_illegal_transitions():
    m = slot_machine("slot 1", SlotState.DEAD)
    with pytest.raises(IllegalTransition, match="terminal"):
        m.to(SlotState.ACTIVE)  # a dead slot never comes back (fencing)
    m = slot_machine("slot 2", SlotState.STANDBY)
    with pytest.raises(IllegalTransition):
        m.to(SlotState.ACTIVE)  # a spare must go through JOINING (restore) first
    with pytest.raises(IllegalTransition):
        job_machine(JobState.DONE).to(JobState.RUNNING)
