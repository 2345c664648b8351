"""A restarted coordinator's decisions, as pure functions: the journal fold it rebuilds its state from, who
may rejoin, when the supervisor restarts, and what a slot keeps while its coordinator is away."""

from __future__ import annotations

from collections import deque

import pytest

from phoenix_hpc.control.outbox import keep_report
from phoenix_hpc.control.rejoin import rejoin_verdict
from phoenix_hpc.control.view import SlotView, fold
from phoenix_hpc.control.supervise import restart_decision, shell_status


def replay(recs):
    """The journal fold over ``recs``, stamped 1, 2, 3... as the journal would (nothing is skipped)."""
    v = fold([{"ts": float(i), **r} for i, r in enumerate(recs, 1)])
    assert v.skipped == []
    return v


def _start(**kw):
    return {"event": "coordinator_started", "pid": 100, **kw}


def _reg(w, role="active", logical=None, pid=None, node=None):
    return {"event": "registered", "world_rank": w, "pid": pid or 1000 + w, "node": node or f"n{w}", "role": role,
            "logical_rank": logical}


def _job(grid=(1, 1, 2)):
    return [_start(), _reg(0, logical=0), _reg(1, logical=1), _reg(2, role="standby"),
            {"event": "job_running", "generation": 0, "grid": list(grid), "rank_map": [[0, 0], [1, 1]], "standby": [2]}]


def test_replay_of_a_running_job_gives_slots_rank_map_and_committed_step():
    recs = _job() + [{"event": "commit", "recoverable_step": 7}, {"event": "commit", "recoverable_step": 12},
                     {"event": "checkpoint", "step": 10, "path": "x"}]
    r = replay(recs)
    assert r.running and r.grid == (1, 1, 2) and r.generation == 0 and r.recovery is None and r.job_end is None
    assert r.rank_map == {0: 0, 1: 1}
    assert {w: (s.state, s.role, s.logical_rank, s.pid) for w, s in r.slots.items()} == {
        0: ("active", "active", 0, 1000), 1: ("active", "active", 1, 1001), 2: ("standby", "standby", None, 1002)}
    assert r.recoverable_step == 12 and r.newest_checkpoint == 10


def test_replay_after_a_hot_swap_has_the_spare_as_the_member_and_the_dead_slot_fenced():
    recs = _job() + [
        {"event": "slots_dead", "slots": [1], "kind": "process_exit"},
        {"event": "recovery_start", "generation": 1, "survivors": [0], "dead": [1]},
        {"event": "recovery_plan", "generation": 1, "rank_map": [[0, 0], [1, 2]],
         "joins": [{"world_rank": 2, "logical_rank": 1, "node": "n2"}]},
        {"event": "recovery_restored", "generation": 1, "recoverable_step": 19},
        {"event": "recovery_done", "generation": 1, "recoverable_step": 19},
    ]
    r = replay(recs)
    assert r.generation == 1 and r.recovery is None and r.rank_map == {0: 0, 1: 2}
    assert r.slots[1].state == "dead"
    assert (r.slots[2].state, r.slots[2].role, r.slots[2].logical_rank, r.slots[2].generation) == ("active", "active", 1, 1)
    assert r.slots[0].generation == 1 and r.slots[0].state == "active"
    assert r.recoverable_step == 19


def test_replay_keeps_what_the_recovery_evidence_recomputes_placements_from():
    """Each generation's rank map and the registrations' placement inputs and domains come back, so a
    restarted coordinator can still judge a holder's claim on a dead owner's shard (control/evidence.py)."""
    recs = _job()
    for rec in recs:
        if rec["event"] == "registered":
            rec["placement_inputs"] = {"k": 1, "levels": ["node", "rack"], "domain": {"rack": f"r{rec['world_rank']}"}}
    recs += [{"event": "recovery_start", "generation": 1, "survivors": [0], "dead": [1]},
             {"event": "recovery_plan", "generation": 1, "rank_map": [[0, 0], [1, 2]], "joins": []}]
    r = replay(recs)
    assert r.placement_inputs == {"k": 1, "levels": ["node", "rack"]}
    assert r.rank_maps == {0: {0: 0, 1: 1}, 1: {0: 0, 1: 2}}
    assert r.slots[2].domain == {"rack": "r2"}
    assert replay(_job()).placement_inputs is None  # registrations without inputs: nothing invented


@pytest.mark.parametrize("upto,phase", [(2, "quiesce"), (3, "restore"), (4, "replay")])
def test_replay_names_the_recovery_in_progress_and_its_phase(upto, phase):
    steps = [
        {"event": "slots_dead", "slots": [1]},
        {"event": "recovery_start", "generation": 1, "survivors": [0], "dead": [1]},
        {"event": "recovery_plan", "generation": 1, "rank_map": [[0, 0], [1, 2]],
         "joins": [{"world_rank": 2, "logical_rank": 1}]},
        {"event": "recovery_restored", "generation": 1, "recoverable_step": 5},
    ]
    r = replay(_job() + steps[:upto])
    assert r.recovery is not None and r.recovery.phase == phase
    assert r.recovery.generation == 1 and r.recovery.dead == [1] and r.generation == 1
    if phase == "quiesce":
        assert r.slots[0].state == "quiesced" and r.slots[2].state == "standby"
    if phase == "restore":
        assert r.slots[2].state == "joining"


def test_replay_keeps_only_the_current_job_and_counts_its_restarts():
    earlier = _job() + [{"event": "commit", "recoverable_step": 30}, {"event": "job_done"}]
    now = [_start(job_id="2"), _reg(0, logical=0, pid=5), _start(restart=1), _start(restart=2)]
    r = replay(earlier + now)
    assert r.job_end is None and r.recoverable_step is None and not r.running
    assert list(r.slots) == [0] and r.slots[0].pid == 5 and r.restarts == 2
    assert replay(earlier).job_end == "job_done"


def test_replay_takes_the_rejoined_step_and_names_what_it_skipped():
    recs = _job() + [{"event": "something_new", "x": 1}, {"event": "rejoined", "world_rank": 1, "step": 33},
                     {"event": "registered", "world_rank": "w7"}]
    r = fold([{"ts": float(i), **x} for i, x in enumerate(recs, 1)])
    assert r.slots[1].step == 33 and r.slots[0].step == 0
    assert [s.split(":")[0] for s in r.skipped] == ["record 6 (something_new)", "record 8 (registered)"]


def _slot(state="active", pid=7, logical=1):
    return SlotView(1, "n1", pid, state, logical, 0)


@pytest.mark.parametrize("slot,pid,role,logical,gen,words", [
    (None, 7, "active", 1, 0, "no registration"),
    (_slot("dead"), 7, "active", 1, 0, "declared dead"),
    (_slot(), 8, "active", 1, 0, "registered pid is 7"),
    (_slot(), 7, "active", 0, 0, "logical rank 0"),
    (_slot(), 7, "active", 1, 3, "newer than the job's"),
])
def test_rejoin_is_refused_with_the_reason(slot, pid, role, logical, gen, words):
    why = rejoin_verdict(slot, pid, role, logical, gen, job_generation=1)
    assert why is not None and words in why


def test_rejoin_of_the_same_process_is_taken_back():
    assert rejoin_verdict(_slot(), 7, "active", 1, 1, job_generation=1) is None
    assert rejoin_verdict(_slot("quiesced"), 7, "active", 1, 0, job_generation=1) is None
    assert rejoin_verdict(SlotView(2, "n2", 9, "standby", None, None, role="standby"), 9, "standby", None, None, 0) is None


@pytest.mark.parametrize("rc,verdict,done,stopping,again,words", [
    (-9, False, 0, False, True, "restart 1 of 3"),
    (1, False, 2, False, True, "restart 3 of 3"),
    (-9, False, 3, False, False, "all 3 restarts"),
    (0, True, 0, False, False, "its verdict"),
    (3, True, 0, False, False, "its verdict"),
    (2, False, 0, False, False, "refused its input"),
    (-9, False, 0, True, False, "told to stop"),
])
def test_the_supervisor_restarts_only_a_crash_and_only_so_often(rc, verdict, done, stopping, again, words):
    got, why = restart_decision(rc, verdict, done, 3, stopping)
    assert got is again and words in why


def test_a_signal_is_reported_as_a_shell_does():
    assert shell_status(-9) == 137 and shell_status(3) == 3 and shell_status(0) == 0


def test_reports_kept_while_away_are_bounded_and_commits_coalesce():
    box: deque = deque()
    assert keep_report(box, {"type": "heartbeat"}, 3) == 0 and not box
    keep_report(box, {"type": "commit", "live_step": 1}, 3)
    keep_report(box, {"type": "fault", "step": 2}, 3)
    keep_report(box, {"type": "commit", "live_step": 3}, 3)
    assert [(m["type"], m.get("live_step")) for m in box] == [("fault", None), ("commit", 3)]
    keep_report(box, {"type": "done"}, 3)
    assert keep_report(box, {"type": "checkpoint"}, 3) == 1
    assert [m["type"] for m in box] == ["commit", "done", "checkpoint"]


def test_status_keeps_a_restarted_coordinators_records_with_its_job():
    from phoenix_hpc.status.derive import current_job_records
    from phoenix_hpc.status.jobs import _segments

    recs = [_start(job_id="1"), {"event": "job_done"}, _start(job_id="2"), _reg(0, logical=0),
            _start(job_id="2", restart=1), {"event": "rejoined", "world_rank": 0, "step": 3}]
    assert [r["event"] for r in current_job_records(recs)] == ["coordinator_started", "registered",
                                                              "coordinator_started", "rejoined"]
    segs = _segments(recs)
    assert [(j, len(seg)) for j, seg in segs] == [("1", 2), ("2", 4)]
