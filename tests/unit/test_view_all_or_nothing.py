"""The journal fold applies a record whole or not at all (control/view.py): for every event the view depends
on, records that are well-typed but do not fit the view (a slot never registered, a generation with no
recovery, a rank map entry that is no pair, a join with no logical rank, no ``ts``...) are applied to views
folded from real journals, and each either leaves the view exactly as it was and is named in ``skipped``, or
is taken without a skip."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest

from phoenix_hpc.control import events as E
from phoenix_hpc.control.view import HANDLERS, JobView, fold

DATA = Path(__file__).parent / "data"


def _lines(name: str, upto: int | None = None) -> list[dict]:
    recs = [json.loads(x) for x in (DATA / name / "journal.jsonl").read_text().splitlines() if x.strip()]
    return recs[:upto]


# views a record can meet: (name, records folded), each from a real run's journal
BASES = {
    "started": _lines("status_node_loss", 1),  # the coordinator started, nothing registered
    # started before the job knew its grid (a coordinator_started may say grid null)
    "gridless": [dict(_lines("status_node_loss", 1)[0], grid=None)],
    "recovering": _lines("status_node_loss", 18),  # a hot swap started, no plan yet
    "draining": _lines("planned_drain", 14),  # a drain's hot swap with commits, before its plan
    "aborted": _lines("coordinator_restart", 19),  # a recovery aborted in its quiesce phase
    "done": _lines("hot_swap_restart"),  # a job done after a hot swap across a coordinator restart
}
_VIEWS = {name: fold(recs) for name, recs in BASES.items()}

SKIP, TAKE, EITHER = "skipped", "taken", "either"
NO_TS = object()  # a record without ts

# per event class: (case id, the record's fields, what becomes of it on every base view)
CASES: dict[type[E.Event], list[tuple[str, dict, str]]] = {
    E.CoordinatorStarted: [
        # a restart reads the grid only while the view has none
        ("restart, grid of two", {"restart": 1, "grid": [1, 2]}, EITHER),
        ("restart, grid without dp", {"restart": 1, "grid": {"tp": 1, "pp": 1}}, EITHER),
        ("new job, grid of four", {"grid": [1, 1, 2, 2]}, SKIP),
        ("restart, no ts", {"restart": 1, "ts": NO_TS}, SKIP),
    ],
    E.TestEnv: [("empty", {"variables": {}}, TAKE), ("no ts", {"variables": {"A": 1}, "ts": NO_TS}, SKIP)],
    E.Registered: [
        ("placement inputs without k", {"world_rank": 9, "logical_rank": 9, "placement_inputs": {"levels": []}},
         EITHER),
        ("k no number", {"world_rank": 9, "placement_inputs": {"k": "two", "levels": ["node"]}}, EITHER),
        ("levels no list", {"world_rank": 9, "placement_inputs": {"k": 1, "levels": 3}}, EITHER),
        ("domain no mapping", {"world_rank": 9, "placement_inputs": {"k": 1, "levels": [], "domain": "sw0"}}, SKIP),
        ("no ts", {"world_rank": 9, "ts": NO_TS}, SKIP),
    ],
    E.JobRunning: [
        ("grid of two", {"grid": [1, 2], "rank_map": [[0, 0]]}, SKIP),
        ("rank map entry no pair", {"grid": [1, 1, 2], "rank_map": [[0, 0], [1]]}, SKIP),
        ("unknown world rank", {"rank_map": [[7, 999]]}, TAKE),
        ("no ts", {"grid": [1, 1, 2], "ts": NO_TS}, SKIP),
    ],
    E.HeartbeatSummary: [("unknown dead slot", {"dead": [999], "max_step": 3}, TAKE),
                         ("no ts", {"dead": [0], "max_step": 3, "ts": NO_TS}, SKIP)],
    E.SlotsDead: [("unknown slot", {"slots": [999], "nodes": []}, TAKE), ("no ts", {"slots": [0], "ts": NO_TS}, SKIP)],
    E.Fault: [("unknown rank and generation", {"world_rank": 999, "generation": 77, "step": 3}, TAKE),
              ("no ts", {"world_rank": 0, "step": 3, "ts": NO_TS}, SKIP)],
    E.Rejoined: [("unknown world rank", {"world_rank": 999, "step": 4}, SKIP),
                 ("no ts", {"world_rank": 0, "step": 4, "ts": NO_TS}, SKIP)],
    E.Progress: [("step 0", {"step": 0}, TAKE), ("no ts", {"step": 1000, "ts": NO_TS}, SKIP)],
    E.StepSeen: [("step 0", {"step": 0}, TAKE), ("no ts", {"step": 1000, "ts": NO_TS}, SKIP)],
    E.Commit: [
        ("holder no number", {"recoverable_step": 500, "shard_steps": {"opt/pp0/tp0/dp0": {"zero": 500}}}, SKIP),
        ("second shard's holder no number",
         {"recoverable_step": 500, "shard_steps": {"opt/pp0/tp0/dp0": {"0": 500}, "opt/pp0/tp0/dp1": {"x": 1}}}, SKIP),
        ("shard not in the grid", {"recoverable_step": 500, "shard_steps": {"opt/pp9/tp9/dp9": {"0": 500}}}, TAKE),
        ("no ts", {"recoverable_step": 500, "ts": NO_TS}, SKIP),
    ],
    E.ProtectInterval: [("0", {"interval": 0}, TAKE), ("no ts", {"interval": 3, "ts": NO_TS}, SKIP)],
    E.Placement: [
        ("replica of two", {"replicas": [["opt/pp0/tp0/dp0", 0, 1], ["opt/pp0/tp0/dp1", 1]]}, SKIP),
        ("holder no number", {"replicas": [["opt/pp0/tp0/dp0", 0, 1], ["opt/pp0/tp0/dp1", 1, "one"]]}, SKIP),
        ("empty", {"replicas": []}, TAKE),
        ("no ts", {"replicas": [], "ts": NO_TS}, SKIP),
    ],
    E.Checkpoint: [("no step", {"step": None}, TAKE), ("no ts", {"step": 500, "ts": NO_TS}, SKIP)],
    E.JobDone: [("no ts", {"step": 500, "final_hash": "x", "ts": NO_TS}, SKIP)],
    E.CleanStop: [("no ts", {"checkpoint_step": 3, "ts": NO_TS}, SKIP)],
    E.Fallback: [("no ts", {"checkpoint_step": 3, "ts": NO_TS}, SKIP)],
    E.CoordinatorStopped: [("no ts", {"signal": "SIGTERM", "ts": NO_TS}, SKIP)],
    E.CoordinatorExit: [("unknown state", {"job_state": "weird"}, TAKE),
                        ("no ts", {"job_state": "done", "ts": NO_TS}, SKIP)],
    E.ReplicaRejected: [("unknown rank", {"world_rank": 999}, TAKE), ("no ts", {"world_rank": 0, "ts": NO_TS}, SKIP)],
    E.Decision: [
        ("bad step no number", {"action": "hot_swap", "faults": [{"bad_step": "x"}]}, TAKE),
        ("no ts", {"action": "clean_stop", "faults": [{"bad_step": 5}], "ts": NO_TS}, SKIP),
    ],
    E.SilentCorruption: [
        ("no step", {"generation": 0, "step": None, "pp": 0, "tp": 0, "suspects": [1], "majority": [0]}, SKIP),
        ("unknown suspect", {"generation": 0, "step": 3, "pp": 0, "tp": 0, "suspects": [99]}, TAKE),
        ("no ts", {"generation": 0, "step": 3, "suspects": [1], "ts": NO_TS}, SKIP),
    ],
    E.AgreementUndetectable: [("no ts", {"reason": "dp 1", "ts": NO_TS}, SKIP)],
    E.AgreementRejected: [("unknown rank", {"world_rank": 999}, TAKE), ("no ts", {"ts": NO_TS}, SKIP)],
    E.AgreementOff: [("unknown generation", {"generation": 99}, TAKE), ("no ts", {"ts": NO_TS}, SKIP)],
    E.RecoveryStart: [("unknown slots", {"generation": 99, "survivors": [999], "dead": [998]}, TAKE),
                      ("no ts", {"generation": 99, "survivors": [0], "ts": NO_TS}, SKIP)],
    E.RecoveryPlanned: [
        ("join without logical rank", {"generation": 1, "rank_map": [[0, 0], [1, 2]], "dead_world": [1],
                                       "joins": [{"world_rank": 2, "replaces_world_rank": 1}]}, SKIP),
        ("join replacing null", {"generation": 1, "rank_map": [[0, 0], [1, 2]], "dead_world": [1],
                                 "joins": [{"world_rank": 2, "logical_rank": 1, "replaces_world_rank": None}]}, SKIP),
        ("join's world rank no number", {"generation": 1, "recoverable_step": 1,
                                         "joins": [{"world_rank": "two", "logical_rank": 1}]}, SKIP),
        ("rank map entry no pair", {"generation": 1, "rank_map": [[0, 0], [1]], "recoverable_step": 1}, SKIP),
        ("shrink, old grid of two", {"generation": 1, "grid": {"tp": 1, "pp": 1, "dp": 1}, "rank_map": [[0, 0]],
                                     "shrink": {"old_grid": [1, 2], "leavers": [1]}}, SKIP),
        ("shrink, grid without dp", {"generation": 1, "grid": {"tp": 1, "pp": 1}, "rank_map": [[0, 0]],
                                     "shrink": {"old_grid": [1, 1, 2], "leavers": [1]}}, SKIP),
        ("shrink, leavers no numbers", {"generation": 1, "grid": [1, 1, 1], "rank_map": [[0, 0]],
                                        "shrink": {"leavers": ["one"]}}, SKIP),
        ("generation with no recovery", {"generation": 99, "rank_map": [[0, 0]], "joins": []}, TAKE),
        ("unknown slots", {"generation": 1, "dead_world": [999],
                           "joins": [{"world_rank": 998, "logical_rank": 0, "replaces_world_rank": 997}]}, TAKE),
        ("no ts", {"generation": 1, "recoverable_step": 3, "ts": NO_TS}, SKIP),
    ],
    E.RecoveryRestored: [("generation with no plan", {"generation": 99}, TAKE),
                         ("no ts", {"generation": 1, "recoverable_step": 3, "ts": NO_TS}, SKIP)],
    E.RecoveryDone: [("generation never started", {"generation": 99, "total_s": 1.0, "recoverable_step": 3}, EITHER),
                     ("no generation", {"total_s": 1.0}, EITHER),
                     ("no ts", {"generation": 1, "ts": NO_TS}, SKIP)],
    E.RecoveryAborted: [("unknown generation", {"generation": 99}, TAKE),
                        ("no ts", {"generation": 1, "ts": NO_TS}, SKIP)],
    E.Shrink: [("unknown slots", {"generation": 99, "freed": [999]}, TAKE),
               ("no ts", {"freed": [0], "ts": NO_TS}, SKIP)],
    E.DrainRequested: [("no targets", {"request_id": "r1", "targets": []}, TAKE),
                       ("no ts", {"request_id": "r1", "ts": NO_TS}, SKIP)],
    **{cls: [("never requested", {"request_id": "nope", "at_step": 3}, SKIP),
             ("no ts", {"request_id": "5b819db0d988", "ts": NO_TS}, SKIP)]
       for cls in (E.DrainArmed, E.DrainRearmed, E.DrainStart, E.DrainRefused, E.DrainMissed)},
    E.DrainDone: [("never requested", {"request_id": "nope", "moved": [[1, 2, 1]]}, SKIP),
                  ("no ts", {"request_id": "5b819db0d988", "ts": NO_TS}, SKIP)],
    E.InjectForwarded: [("unknown target", {"request_id": "i1", "targets": [999]}, TAKE),
                        ("no ts", {"request_id": "i1", "ts": NO_TS}, SKIP)],
    E.InjectArmed: [("never forwarded", {"request_id": "nope", "armed_steps": [[1, 3]]}, SKIP),
                    ("armed step no pair", {"request_id": "b8ea091e2021", "armed_steps": [[1]]}, SKIP),
                    ("no ts", {"request_id": "b8ea091e2021", "ts": NO_TS}, SKIP)],
    E.InjectRefused: [("never forwarded", {"request_id": "nope"}, SKIP),
                      ("no ts", {"request_id": "b8ea091e2021", "ts": NO_TS}, SKIP)],
    E.InjectMissed: [("never forwarded", {"request_id": "nope", "world_rank": 1}, SKIP),
                     ("no ts", {"request_id": "b8ea091e2021", "ts": NO_TS}, SKIP)],
    E.InjectLanded: [("never forwarded", {"request_id": "nope", "world_rank": 999, "step": 0}, TAKE),
                     ("no ts", {"request_id": "b8ea091e2021", "world_rank": 1, "step": 30, "ts": NO_TS}, SKIP)],
    E.InjectFired: [("never forwarded", {"request_id": "nope", "world_rank": 999, "step": 0}, TAKE),
                    ("no ts", {"request_id": "b8ea091e2021", "world_rank": 1, "step": 30, "ts": NO_TS}, SKIP)],
}


def test_every_event_the_view_depends_on_has_cases():
    assert set(CASES) == set(HANDLERS)


def _record(cls: type[E.Event], fields: dict) -> dict:
    rec = {"event": cls.NAME, "ts": 1.0e9, **fields}
    if rec["ts"] is NO_TS:
        del rec["ts"]
    cls.from_record(rec)  # well-typed: the fold's type check lets it through
    return rec


def _state(v: JobView) -> dict:
    d = dataclasses.asdict(v)
    d.pop("skipped")
    return d


@pytest.mark.parametrize("base", sorted(BASES))
@pytest.mark.parametrize("cls,case,fields,outcome",
                         [pytest.param(cls, case, f, o, id=f"{cls.NAME}: {case}")
                          for cls, cases in CASES.items() for case, f, o in cases])
def test_a_record_is_applied_whole_or_not_at_all(cls, case, fields, outcome, base):
    rec = _record(cls, fields)
    view = copy.deepcopy(_VIEWS[base])
    before, n = _state(view), len(view.skipped)
    after = fold([rec], view, start=99)
    skipped = after.skipped[n:]
    if skipped:
        assert len(skipped) == 1 and skipped[0].startswith(f"record 99 ({cls.NAME}): "), skipped
        assert _state(after) == before, f"{case}: named as skipped, yet the view changed"
    assert outcome == EITHER or (SKIP if skipped else TAKE) == outcome, (case, skipped)
