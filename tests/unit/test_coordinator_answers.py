"""The coordinator plans a recovery when the last ``quiesced`` arrives (no sooner than one tick after the
recovery started), resumes it when the last ``recovered`` arrives and ends it when the last member is past the
replayed steps, not at its next tick; losses, pending faults and deadlines stay on the tick."""

from __future__ import annotations

import dataclasses

from test_drain import _coordinator, _events, _sent

from phoenix_hpc.control.classify import FaultKind
from phoenix_hpc.control import recovery_machine
from phoenix_hpc.control.states import SlotState


def _quiesced(tmp_path):
    c = _coordinator(tmp_path)
    now = c.clock()
    for slot in c.slots.values():  # alive: heard just now
        slot.last_seen = now
    c._declare_dead([1], FaultKind.PROCESS_EXIT, "process exited: world rank 1", now)
    c._tick(now)  # the decision
    assert c.recovery is not None and c.recovery.phase == "quiesce"
    c._dispatch({"type": "quiesced", "world_rank": 0, "pid": 100, "generation": c.recovery.generation,
                 "live_step": 5, "dirty": False, "shards": {"opt/pp0/tp0/dp0": [5, 4]},
                 "replicas": {"opt/pp0/tp0/dp1": [5, 4]}})
    return c


def test_the_last_quiesced_within_the_first_tick_waits_for_the_tick(tmp_path):
    c = _quiesced(tmp_path)
    t0 = c.recovery.t_start
    assert c.tick_s == 0.1  # min(0.1 s, heartbeat interval / 4) with the default heartbeat interval
    recovery_machine.advance_on_answers(c, t0 + c.tick_s * 0.9)
    assert c.recovery.phase == "quiesce" and not _events(tmp_path, "recovery_plan")
    c._tick(c.clock())
    assert c.recovery.phase == "restore" and _events(tmp_path, "recovery_plan")[-1]["rank_map"] == [[0, 0], [1, 2]]


def test_the_last_quiesced_after_the_first_tick_is_planned_at_once(tmp_path):
    c = _quiesced(tmp_path)
    t0 = c.recovery.t_start
    # just past the floor: (t0 + tick) - t0 can round to one ulp below the tick, as t0 is the clock's reading
    recovery_machine.advance_on_answers(c, t0 + c.tick_s * 1.001)
    assert c.recovery.phase == "restore" and _events(tmp_path, "recovery_plan")[-1]["rank_map"] == [[0, 0], [1, 2]]
    assert [w for w, m in _sent(c) if m["type"] == "recover"] == [0, 2]


def test_a_silent_survivor_a_pending_fault_a_passed_deadline_a_planned_end_or_a_lost_survivor_wait(tmp_path):
    c = _quiesced(tmp_path)
    rec = c.recovery
    later = rec.t_start + 10 * c.tick_s
    answer = rec.quiesced.pop(0)
    recovery_machine.advance_on_answers(c, later)  # survivor 0 has not answered
    assert rec.phase == "quiesce"
    rec.quiesced[0] = answer
    c.faults.append(object())  # a fault pending: the tick decides how it changes the recovery
    recovery_machine.advance_on_answers(c, later)
    assert rec.phase == "quiesce"
    c.faults.clear()
    recovery_machine.advance_on_answers(c, rec.deadline + 1.0)  # past the deadline: judged on the tick, after the pause check
    assert rec.phase == "quiesce"
    c.ending = object()  # members leave on purpose (control/ending.py)
    recovery_machine.advance_on_answers(c, later)
    assert rec.phase == "quiesce"
    c.ending = None
    c.slots[0].machine.to(SlotState.DEAD, "test")  # lost after it answered: the tick aborts the recovery
    recovery_machine.advance_on_answers(c, later)
    assert rec.phase == "quiesce" and not _events(tmp_path, "recovery_plan")


def test_a_spare_whose_heartbeats_are_overdue_is_left_to_the_tick_and_never_named_in_a_plan(tmp_path):
    c = _quiesced(tmp_path)
    rec = c.recovery
    later = rec.t_start + 10 * c.tick_s
    c.slots[2].last_seen = later - c.t.heartbeat_timeout_s - 1.0  # the spare went silent
    recovery_machine.advance_on_answers(c, later)
    assert rec.phase == "quiesce" and not _events(tmp_path, "recovery_plan")
    c.slots[2].last_seen = later  # heard again: nothing overdue, the plan goes out with it
    recovery_machine.advance_on_answers(c, later)
    assert rec.phase == "restore" and [w for w, m in _sent(c) if m["type"] == "recover"] == [0, 2]


def _restoring(tmp_path, monkeypatch):
    c = _quiesced(tmp_path)
    c._tick(c.clock())  # the plan: members 0 (survivor) and 2 (the spare)
    resumed = []
    monkeypatch.setattr(recovery_machine, "check_and_resume", lambda c_, rec, now: resumed.append(rec.generation))
    return c, resumed


def test_the_last_recovered_resumes_at_once(tmp_path, monkeypatch):
    c, resumed = _restoring(tmp_path, monkeypatch)
    c.recovery.recovered[0] = {"report": {}}
    recovery_machine.advance_on_answers(c, c.clock())
    assert resumed == []  # member 2 has not answered
    c.recovery.recovered[2] = {"report": {}}
    recovery_machine.advance_on_answers(c, c.clock())
    assert resumed == [c.recovery.generation]


def test_a_lost_member_a_passed_deadline_or_a_planned_end_are_left_to_the_tick(tmp_path, monkeypatch):
    c, resumed = _restoring(tmp_path, monkeypatch)
    c.recovery.recovered.update({0: {"report": {}}, 2: {"report": {}}})
    c.slots[2].machine.to(SlotState.DEAD, "test")
    recovery_machine.advance_on_answers(c, c.clock())
    assert resumed == [] and c.recovery.phase == "restore"  # the tick aborts it
    c, resumed = _restoring(tmp_path / "b", monkeypatch)
    c.recovery.recovered[0] = {"report": {}}
    recovery_machine.advance_on_answers(c, c.recovery.deadline + 100.0)  # past the deadline: judging it needs the pause check
    assert resumed == [] and c.slots[2].state is not SlotState.DEAD and not _events(tmp_path / "b", "recovery_aborted")
    c.recovery.recovered[2] = {"report": {}}
    c.ending = object()  # members leave on purpose (control/ending.py)
    recovery_machine.advance_on_answers(c, c.clock())
    assert resumed == []


def test_a_member_answering_live_step_minus_one_is_restored_in_place_and_never_a_source(tmp_path, monkeypatch):
    """A spare cut short at its generation's arrival barrier answers ``quiesced`` with live step -1 and no
    copies (launch/execute.py Member.join); the next plan restores it in place even when no earlier plan's
    joins name it any more."""
    from phoenix_hpc.control import recovery_machine as RM

    c = _coordinator(tmp_path)
    now = c.clock()
    for slot in c.slots.values():
        slot.last_seen = now
    c._declare_dead([1], FaultKind.PROCESS_EXIT, "process exited: world rank 1", now)
    c._tick(now)
    seen = {}

    def plan_recovery(**kw):
        seen.update(kw)
        raise RM.FallbackRequired("captured")

    monkeypatch.setattr(RM, "plan_recovery", plan_recovery)
    monkeypatch.setattr(RM, "fallback", lambda *a, **k: None)
    c._dispatch({"type": "quiesced", "world_rank": 0, "pid": 100, "generation": c.recovery.generation,
                 "live_step": -1, "dirty": False, "shards": {"opt/pp0/tp0/dp0": [5]}, "replicas": {}})
    c._tick(c.clock())
    assert seen["restore"] == [0] and seen["live_steps"] == {} and seen["committed"] == {}


def _replaying(tmp_path, monkeypatch, until: int = 6):
    c, _ = _restoring(tmp_path, monkeypatch)
    rec = c.recovery
    rec.phase, rec.target_step, rec.t_restored = "replay", until, c.clock()
    for _, w in rec.plan.rank_map:
        c.slots[w].step = until - 1
        c.slots[w].generation = rec.generation
    return c


def test_the_step_past_the_replayed_ones_ends_the_recovery_at_once(tmp_path, monkeypatch):
    """A member's own heartbeat with the step past the replayed ones (launch/execute.py
    Member._report_replayed) ends the recovery in the loop iteration it arrives in, not at the next tick."""
    c = _replaying(tmp_path, monkeypatch)
    g = c.recovery.generation
    c._dispatch({"type": "heartbeat", "world_rank": 0, "pid": 100, "generation": g, "step": 6})
    recovery_machine.advance_on_answers(c, c.clock())
    assert c.recovery is not None and c.recovery.phase == "replay"  # member 2 is not past step 6 yet
    c._dispatch({"type": "heartbeat", "world_rank": 2, "pid": c.slots[2].pid, "generation": g, "step": 6})
    recovery_machine.advance_on_answers(c, c.clock())
    done = _events(tmp_path, "recovery_done")
    assert c.recovery is None and len(done) == 1 and done[-1]["replay_interrupted"] is False


def test_a_replay_with_a_fault_pending_or_a_lost_member_is_left_to_the_tick(tmp_path, monkeypatch):
    c = _replaying(tmp_path, monkeypatch)
    for _, w in c.recovery.plan.rank_map:
        c.slots[w].step = 6
    c.faults.append(object())  # a fault pending: the tick judges the replay (and then handles the fault)
    recovery_machine.advance_on_answers(c, c.clock())
    assert c.recovery is not None and not _events(tmp_path, "recovery_done")
    c = _replaying(tmp_path / "b", monkeypatch)
    for _, w in c.recovery.plan.rank_map:
        c.slots[w].step = 6
    c.slots[2].machine.to(SlotState.DEAD, "test")
    recovery_machine.advance_on_answers(c, c.clock())
    assert c.recovery is not None and not _events(tmp_path / "b", "recovery_done")


def test_a_plan_that_replays_no_step_ends_when_it_resumes(tmp_path, monkeypatch):
    """The last ``recovered`` resumes the recovery and, with nothing to replay, ends it in the same loop
    iteration (a planned drain's hot swap replays no step)."""
    c = _quiesced(tmp_path)
    c._tick(c.clock())  # the plan
    rec = c.recovery
    rec.plan = dataclasses.replace(rec.plan, steps_replayed=0)
    seen = []

    def resumed(c_, r, now):  # what check_and_resume leaves when the evidence checks pass (they need real reports)
        seen.append(r.generation)
        r.phase, r.t_restored = "replay", now
        r.target_step = r.plan.recoverable_step + r.plan.steps_replayed
        for _, w in r.plan.rank_map:
            c.slots[w].step = r.plan.recoverable_step

    monkeypatch.setattr(recovery_machine, "check_and_resume", resumed)
    rec.recovered.update({0: {"report": {}}, 2: {"report": {}}})
    recovery_machine.advance_on_answers(c, c.clock())
    assert seen == [rec.generation] and c.recovery is None
    assert _events(tmp_path, "recovery_done")[-1]["phases"]["replay"] == 0.0


def test_a_fallback_with_no_member_left_counts_the_lost_steps_from_the_members_last_steps(tmp_path):
    """Every member lost (no live step to read): the stop message and the journal count the steps lost since
    the checkpoint from the steps the members last reported, never a negative number."""
    from types import SimpleNamespace

    from phoenix_hpc.recovery.plan import FallbackRequired
    from test_drain import _events

    c = _coordinator(tmp_path)
    c.view.checkpoint(0.0, 5)  # a persistent checkpoint of step 5, as its record leaves the view
    for w in (0, 1):
        c.slots[w].step = 8
    recovery_machine.fallback(c, SimpleNamespace(generation=3), FallbackRequired("no spare left"), {}, [], [0, 1], c.clock())
    (dec,) = [d for d in _events(tmp_path, "decision") if d["action"] == "fallback"]
    assert dec["checkpoint_step"] == 5 and dec["lost_steps"] == 3
    (end,) = _events(tmp_path, "fallback")
    assert end["lost_steps"] == 3 and "(3 step(s) since then are lost)" in end["message"], end
