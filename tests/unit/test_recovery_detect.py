"""A recovery's detect time (``recovery_start`` ``detect_s``, ``recovery_done`` ``phases.detect``) counts from
the earliest fault that this recovery is the first to handle: never from a fault an earlier recovery handled.
Driven in-process on a fake clock, with a store that records what is sent (test_drain)."""

from __future__ import annotations

from test_drain import _Store, _events

from phoenix_hpc.control import recovery_machine
from phoenix_hpc.control.classify import FaultKind
from phoenix_hpc.control.coordinator import Coordinator, Timing
from phoenix_hpc.control.journal import Journal
from phoenix_hpc.control.records import Slot
from phoenix_hpc.control.states import JobState, SlotState, slot_machine


def _coordinator(tmp_path, clock: list[float]) -> Coordinator:
    """dp = 2 (world ranks 0, 1) with two spares (2, 3) on a clock the test moves."""
    c = Coordinator(tmp_path, grid=(1, 1, 2), timing=Timing(heartbeat_interval_s=0.5, heartbeat_timeout_s=4.0),
                    clock=lambda: clock[0])
    c.journal, c.secret, c.store = Journal(tmp_path), b"s" * 32, _Store()
    c.job.to(JobState.RUNNING)
    for w, node, role in ((0, "n1", "active"), (1, "n2", "active"), (2, "n3", "standby"), (3, "n4", "standby")):
        c.slots[w] = Slot(w, node, 100 + w, role, slot_machine(f"slot {w}", SlotState.ACTIVE if role == "active"
                                                                else SlotState.STANDBY), clock[0],
                          logical_rank=w if role == "active" else None, step=9)
    c.view.rank_map = {0: 0, 1: 1}
    c.placement = {"opt/pp0/tp0/dp0": [1], "opt/pp0/tp0/dp1": [0]}
    c.view.checkpoint(0.0, 8)  # a persistent checkpoint of step 8, as its record leaves the view
    return c


def _heard(c, now: float) -> None:
    for s in c.slots.values():
        if s.state is not SlotState.DEAD:
            s.last_seen = now


def test_a_recovery_after_a_double_fault_counts_its_detect_time_from_its_own_fault(tmp_path, monkeypatch):
    """The journal of gpt-small-20261206-011400 (job 2): world rank 1 exits, and world rank 0 exits during that
    recovery's quiesce phase (recovery aborted, planned again as generation 2: a checkpoint restart onto the
    spares). 14 s later a single crash starts generation 3, whose detect_s was 14.25 s: measured from world
    rank 0's last heartbeat before the double fault, which the aborted recovery had left behind."""
    clock = [100.0]
    c = _coordinator(tmp_path, clock)
    c.slots[1].last_seen = 99.7  # world rank 1's last heartbeat before it exited
    c.slots[0].last_seen = 99.75  # world rank 0's (it exits 0.1 s after world rank 1)
    c._declare_dead([1], FaultKind.PROCESS_EXIT, "process exited: world rank 1", 100.0)
    c._tick(100.0)  # the decision: generation 1, quiescing survivor 0
    assert c.recovery.generation == 1 and c.recovery.phase == "quiesce"
    clock[0] = 100.1
    c._declare_dead([0], FaultKind.PROCESS_EXIT, "process exited: world rank 0", 100.1)
    c._tick(100.1)  # aborted: generation 2 re-plans both losses, from the first fault (no survivor left)
    assert _events(tmp_path, "recovery_aborted")[-1]["generation"] == 1
    assert c.recovery.generation == 2
    clock[0] = 100.2
    _heard(c, 100.2)
    c._tick(100.2)  # every memory copy is lost: a checkpoint restart onto the spares 2 and 3
    rec = c.recovery
    assert rec.plan.action == "checkpoint_restart" and sorted(w for _, w in rec.plan.rank_map) == [2, 3]

    def resumed(c_, r, now):  # what check_and_resume leaves when the evidence checks pass (they need real reports)
        r.phase, r.t_restored = "replay", now
        r.target_step = r.plan.recoverable_step + r.plan.steps_replayed
        for _, w in r.plan.rank_map:
            c.slots[w].machine.to(SlotState.ACTIVE, "restored")
            c.slots[w].generation = r.generation
        c.job.to(JobState.RUNNING, "restored")

    monkeypatch.setattr(recovery_machine, "check_and_resume", resumed)
    rec.recovered.update({2: {"report": {}}, 3: {"report": {}}})
    clock[0] = 100.6
    _heard(c, 100.6)
    recovery_machine.advance_on_answers(c, 100.6)
    for w in (2, 3):
        c.slots[w].step = rec.target_step
    recovery_machine.advance_on_answers(c, 100.6)
    assert c.recovery is None and _events(tmp_path, "recovery_done")[-1]["generation"] == 2
    starts = _events(tmp_path, "recovery_start")
    assert [s["detect_s"] for s in starts] == [0.3, 0.4]  # both from world rank 1's last heartbeat (99.7)

    # 14 s later: world rank 3 (logical rank 1) exits, heard last at 113.9; nothing else is pending
    clock[0] = 114.0
    _heard(c, 113.9)
    assert not c.faults
    c._declare_dead([3], FaultKind.PROCESS_EXIT, "process exited: world rank 3", 114.0)
    c._tick(114.0)
    rec = c.recovery
    assert rec.generation == 3
    start = _events(tmp_path, "recovery_start")[-1]
    assert start["generation"] == 3 and start["detect_s"] == 0.1, start  # not 14.25 (from 99.75)
    assert rec.t_fault == 113.9


def test_a_second_fault_during_a_recovery_can_move_its_detect_time_earlier(tmp_path):
    """A member found dead during a recovery (here: silent since before the first fault) is one of the faults
    the re-planned recovery is the first to handle: it counts from the earlier of the two."""
    clock = [100.0]
    c = _coordinator(tmp_path, clock)
    c.slots[1].last_seen = 99.7
    c._declare_dead([1], FaultKind.PROCESS_EXIT, "process exited: world rank 1", 100.0)
    c._tick(100.0)
    assert c.recovery.generation == 1
    clock[0] = 100.1
    c.slots[0].last_seen = 99.5  # heard last before world rank 1 exited: it hung first
    c._declare_dead([0], FaultKind.HEARTBEAT_TIMEOUT, "no heartbeat", 100.1)
    c._tick(100.1)
    assert c.recovery.generation == 2 and c.recovery.t_fault == 99.5
    assert _events(tmp_path, "recovery_start")[-1]["detect_s"] == 0.6
    assert c._t_fault_hint is None  # taken by the re-planned recovery, not left for a later one
