"""The typed journal events: one class per name, records round-trip unchanged, the journal writes objects."""

from __future__ import annotations

import json

import pytest

from phoenix_hpc.control import events as E
from phoenix_hpc.control.journal import Journal, read_journal


def test_every_class_has_its_own_name():
    assert len(E.REGISTRY) == len(set(E.REGISTRY.values()))
    for name, cls in E.REGISTRY.items():
        assert cls.NAME == name and cls is not E.Event


@pytest.mark.parametrize("rec", [
    {"ts": 1.0, "event": "registered", "world_rank": 3, "pid": 9, "node": "n1", "role": "active", "logical_rank": 3},
    {"ts": 2.0, "event": "registered", "world_rank": 3, "pid": 9, "node": "n1", "role": "active", "logical_rank": 3,
     "placement_inputs": {"k": 1, "levels": ["node"]}},
    {"ts": 3.0, "event": "heartbeat_summary", "generation": 0, "job_state": "running", "active": [0], "standby": [],
     "dead": [], "max_step": 4, "accepted": 3, "rejected": 0, "heartbeats": 9, "heartbeat_messages": 4,
     "heartbeat_age": None, "cpu_s": 0.5, "from_a_newer_coordinator": 1},
    {"ts": 4.0, "event": "clean_stop", "reason": "r", "message": "m"},
    {"ts": 5.0, "event": "recovery_plan", "action": "hot_swap", "generation": 1, "grid": {"tp": 1, "pp": 1, "dp": 2},
     "rank_map": [[0, 4]], "dead_world": [0], "joins": [], "transfers": [], "recoverable_step": 3, "rollbacks": [],
     "steps_replayed": 1},
    {"ts": 6.0, "event": "from_the_future", "x": 1},
])
def test_a_record_round_trips(rec):
    """A record with every field its class declares (as the coordinator writes them) comes back unchanged."""
    ev = E.from_record(rec)
    assert ev.ts == rec["ts"]
    assert ev.to_record() == {k: v for k, v in rec.items() if k != "ts"}


def test_unknown_names_and_bad_records():
    assert isinstance(E.from_record({"ts": 1, "event": "nope"}), E.UnknownEvent)
    with pytest.raises(E.EventError, match="event"):
        E.from_record({"ts": 1})
    with pytest.raises(E.EventError, match="JSON object"):
        E.from_record([1, 2])
    with pytest.raises(E.EventError, match="nope"):
        E.name_of("nope")


def test_the_journal_writes_an_event_object_as_the_same_line(tmp_path):
    with Journal(tmp_path, clock=lambda: 7.0) as j:
        j.append(E.SlotsDead(slots=[1], nodes=["n2"], kind="node_loss", reason="gone"))
        j.append(E.CoordinatorStarted(host="h", port=1, pid=2, job_id="9", next_job=None, heartbeat_interval_s=1,
                                      heartbeat_timeout_s=5, grid=None))
        with pytest.raises(TypeError, match="no more fields"):
            j.append(E.Progress(step=1), generation=2)
    lines = (tmp_path / "journal.jsonl").read_text().splitlines()
    assert json.loads(lines[0]) == {"ts": 7.0, "event": "slots_dead", "slots": [1], "nodes": ["n2"],
                                    "kind": "node_loss", "reason": "gone"}
    assert "restart" not in json.loads(lines[1])  # an OMIT field is left out
    assert [r["event"] for r in read_journal(tmp_path, E.SlotsDead)] == ["slots_dead"]


def test_job_end_states():
    assert E.JOB_END_STATES == {"job_done": "done", "clean_stop": "failed", "fallback": "failed",
                                "coordinator_stopped": "stopped"}
