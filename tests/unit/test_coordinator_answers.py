"""The coordinator moves a recovery on when the last answer arrives, not at its next tick."""

from __future__ import annotations

from test_drain import _coordinator, _events, _sent

from phoenix_hpc.control.classify import FaultKind


def _quiesce_phase(tmp_path):
    c = _coordinator(tmp_path)
    now = c.clock()
    for slot in c.slots.values():  # alive: heard just now
        slot.last_seen = now
    c._declare_dead([1], FaultKind.PROCESS_EXIT, "process exited: world rank 1", now)
    c._tick(now)  # the decision (still on the tick)
    assert c.recovery is not None and c.recovery.phase == "quiesce"
    assert [w for w, m in _sent(c) if m["type"] == "quiesce"] == [0]
    c._dispatch({"type": "quiesced", "world_rank": 0, "pid": 100, "generation": c.recovery.generation,
                 "live_step": 5, "dirty": False, "shards": {"opt/pp0/tp0/dp0": [5, 4]},
                 "replicas": {"opt/pp0/tp0/dp1": [5, 4]}})
    return c


def test_the_last_quiesced_makes_the_plan_without_waiting_for_the_tick(tmp_path):
    c = _quiesce_phase(tmp_path)
    assert c.recovery.phase == "quiesce" and not _events(tmp_path, "recovery_plan")  # answers alone do not plan
    c._advance_on_answers(c.clock())
    assert c.recovery.phase == "restore"
    plan = _events(tmp_path, "recovery_plan")[-1]
    assert plan["rank_map"] == [[0, 0], [1, 2]]
    assert [w for w, m in _sent(c) if m["type"] == "recover"] == [0, 2]


def test_a_planned_end_in_progress_leaves_the_recovery_to_the_tick(tmp_path):
    c = _quiesce_phase(tmp_path)
    c.ending = object()  # members leave on purpose (control/ending.py): nothing is judged but the end
    c._advance_on_answers(c.clock())
    assert c.recovery.phase == "quiesce" and not _events(tmp_path, "recovery_plan")
