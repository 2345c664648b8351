"""``phoenix status`` shows replica agreement's repairs from memory: journal records in, the fold's
``repairs`` (control/view.py, control/view_repairs.py) and the status line, table and ``--json`` out."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console
from test_status_derive import run_files, running_slurm, start_records

from phoenix_hpc.control.view import fold
from phoenix_hpc.status.derive import derive_status
from phoenix_hpc.status.render import status_line, status_renderable

A, B = "00000000000000aa", "00000000000000bb"


def sc(ts, g, step, suspects, majority=None, members=None):
    members = members or {str(r): (B if r in suspects else A) for r in range(4)}
    return {"ts": ts, "event": "silent_corruption", "generation": g, "step": step, "pp": 0, "tp": 0,
            "members": members, "suspects": suspects, **({"majority": majority} if majority else {})}


def decision(ts, action, *bad, reason="silent data corruption: the DP replicas' parameters differ at step 9"):
    return {"ts": ts, "event": "decision", "action": action, "reason": reason,
            "faults": [{"kind": "silent_corruption", "slots": [0, 1, 2, 3], "nodes": [], "bad_step": b} for b in bad]}


def start(ts, g, action="local_recovery"):
    return {"ts": ts, "event": "recovery_start", "generation": g, "action": action, "survivors": [0, 1, 2, 3],
            "dead": [], "detect_s": 0.1}


def plan(ts, g, R, replayed, action="local_recovery"):
    return {"ts": ts, "event": "recovery_plan", "generation": g, "action": action,
            "rank_map": [[i, i] for i in range(4)], "dead_world": [], "joins": [], "transfers": [],
            "recoverable_step": R, "rollbacks": [[i, R] for i in range(4)], "steps_replayed": replayed}


def done(ts, g, R, replayed, action="local_recovery"):
    return [{"ts": ts, "event": "recovery_restored", "generation": g, "recoverable_step": R},
            {"ts": ts + 0.5, "event": "recovery_done", "generation": g, "action": action, "total_s": 1.5,
             "phases": {"detect": 0.1, "reconfigure": 0.2, "params": 0.3, "optimizer": 0.3, "replay": 0.4},
             "steps_replayed": replayed, "recoverable_step": R, "replay_interrupted": False}]


FOUND = sc(4.0, 0, 9, [1], [0, 2, 3])
REPAIRED = [FOUND, decision(4.1, "local_recovery", 9), start(4.2, 1), plan(4.5, 1, 8, 2), *done(4.8, 1, 8, 2)]
# the ranks' commit fence reported first: the decision and the recovery come before the record naming who
LATE_RECORD = [decision(4.1, "local_recovery", 9), start(4.2, 1), sc(4.3, 0, 9, [1], [0, 2, 3]),
               plan(4.5, 1, 8, 2), *done(4.8, 1, 8, 2)]
# dp = 2 has no majority; the replay reproduced the difference at the same step: a clean stop
TWICE = [sc(4.0, 0, 9, [0, 1], members={"0": A, "1": B}), decision(4.1, "local_recovery", 9), start(4.2, 1),
         plan(4.5, 1, 8, 2), *done(4.8, 1, 8, 2), sc(6.0, 1, 9, [0, 1], members={"0": A, "1": B}),
         decision(6.1, "clean_stop", 9, reason="silent data corruption: the DP replicas' parameters differ again "
                                                "at step 9 after a rollback before it and its replay"),
         {"ts": 6.2, "event": "clean_stop", "reason": "differ again", "checkpoint_step": 5,
          "message": "stopped without training on; the replicas' parameters differed at step 9 ..."}]
# a member lost during the repair: the recovery is re-planned (no bad_step in that decision) and still repairs it
REPLANNED = [FOUND, decision(4.1, "local_recovery", 9), start(4.2, 1),
             {"ts": 4.4, "event": "recovery_aborted", "generation": 1, "phase": "restore", "reason": "slot 3 lost"},
             {"ts": 4.5, "event": "decision", "action": "hot_swap", "reason": "second fault during recovery: x",
              "faults": [{"kind": "heartbeat_timeout", "slots": [3]}]},
             start(4.6, 2, "hot_swap"), plan(4.9, 2, 8, 3, "hot_swap"), *done(5.2, 2, 8, 3, "hot_swap")]
FELL_BACK = [FOUND, decision(4.1, "local_recovery", 9), start(4.2, 1),
             {"ts": 4.6, "event": "fallback", "reason": "no copy", "checkpoint_step": 5, "lost_steps": 4}]
AFTER_END = [{"ts": 4.0, "event": "job_done", "step": 20, "final_hash": "ab"}, sc(4.1, 0, 19, [1], [0, 2, 3])]

# (records after the job's start, expected fields of each repair)
CASES = {
    "repaired": (REPAIRED, [dict(step=9, pp=0, tp=0, generation=0, suspects=[1], majority=[0, 2, 3],
                                 suspect_world_ranks=[1], state="repaired", action="local_recovery",
                                 recovery_generation=1, restored_step=8, steps_replayed=2, stop=None)]),
    "record after the decision": (LATE_RECORD, [dict(step=9, pp=0, tp=0, generation=0, suspects=[1],
                                                     majority=[0, 2, 3], state="repaired", recovery_generation=1,
                                                     restored_step=8, steps_replayed=2)]),
    "second difference stops": (TWICE, [dict(step=9, suspects=[0, 1], majority=[], state="stopped",
                                             recovery_generation=1, restored_step=8, steps_replayed=2,
                                             second_generation=1)]),
    "re-planned": (REPLANNED, [dict(step=9, state="repaired", action="hot_swap", recovery_generation=2,
                                    restored_step=8, steps_replayed=3)]),
    "fell back": (FELL_BACK, [dict(step=9, state="fallback", recovery_generation=1, restored_step=None)]),
    "after the end": (AFTER_END, [dict(step=19, state="found", recovery_generation=None)]),
    "no difference": ([], []),
}


@pytest.mark.parametrize("records, expect", CASES.values(), ids=CASES.keys())
def test_records_in_repairs_out(records, expect):
    v = fold(start_records() + records)
    assert not v.skipped
    assert len(v.repairs) == len(expect)
    for r, e in zip(v.repairs, expect):
        assert {k: getattr(r, k) for k in e} == e


def test_a_second_difference_names_its_stop_the_checkpoint_and_the_message():
    [r] = fold(start_records() + TWICE).repairs
    assert r.stop["second"] is True and r.stop["checkpoint_step"] == 5
    assert "differ again at step 9" in r.stop["reason"] and r.stop["message"].startswith("stopped without")


def _status(records, now=7.0):
    return derive_status(start_records() + records, running_slurm(), now=now, run=run_files())


def _text(st) -> str:
    out = io.StringIO()
    Console(file=out, width=250, color_system=None).print(status_renderable(st))
    return out.getvalue()


def test_status_line_table_and_json_show_the_repair():
    st = _status(REPAIRED)
    assert "agreement: 0 checks, 1 differed, 1 repaired from memory" in status_line(st)
    text = _text(st)
    assert "Replica agreement: differences and repairs from memory" in text
    row = next(ln for ln in text.splitlines() if "repaired from memory (local_recovery, generation 1)" in ln)
    assert "│ 9 " in row and "0,0" in row and "1->1" in row and "0, 2, 3" in row and "│ 8 " in row and "│ 2 " in row
    [j] = json.loads(json.dumps(st.to_json()))["repairs"]
    assert (j["step"], j["pp"], j["tp"], j["suspects"], j["majority"], j["restored_step"], j["steps_replayed"],
            j["state"], j["stop"]) == (9, 0, 0, [1], [0, 2, 3], 8, 2, "repaired", None)


def test_status_shows_the_stop_on_a_second_difference():
    st = _status(TWICE)
    assert "1 repaired from memory" not in status_line(st)
    assert "0 repaired from memory, stopped: a second difference at step 9" in status_line(st)
    text = _text(st)
    assert "stopped: second difference at this step after its rollback and replay; restart from the checkpoint " \
           "of step 5" in text
    [j] = st.to_json()["repairs"]
    assert j["stop"]["second"] is True and j["second_generation"] == 1


def test_status_shows_a_difference_found_after_the_end_as_not_repaired():
    st = _status(AFTER_END)
    assert "not repaired (found after the job's end)" in _text(st)


def test_status_shows_the_check_switched_off():
    st = _status([{"ts": 4.0, "event": "agreement_off", "generation": 0,
                   "reason": "resilience.replica_agreement is false: the DP replicas' parameters are not compared"}])
    assert st.agreement["off"].startswith("resilience.replica_agreement is false")
    assert "agreement: off (resilience.replica_agreement is false" in status_line(st)
    assert st.to_json()["agreement"]["off_generation"] == 0
