"""The journal fold (control/view.py) as tables: events in, view out; bad input skipped with its reason; the
journals of real runs (one written before the typed events existed) read the same by a restarted
coordinator and by ``phoenix status``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phoenix_hpc.control import events as E
from phoenix_hpc.control.coordinator import Coordinator
from phoenix_hpc.control.journal import Journal, iter_journal
from phoenix_hpc.control.view import JobView, apply, fold
from phoenix_hpc.status.derive import current_job_records, derive_status
from phoenix_hpc.status.model import SlurmInfo

DATA = Path(__file__).parent / "data"
# journals of real runs (each directory's README says which): a hot swap of a lost node written before the
# typed events, a coordinator SIGKILLed and restarted while its slots train on, one killed inside a hot swap
# on the local Slurm cluster, and a planned drain
REAL = [DATA / d / "journal.jsonl" for d in ("status_node_loss", "coordinator_restart", "hot_swap_restart",
                                             "planned_drain")]


def _job(n_active=2, spares=1):
    """A job of ``n_active`` members (grid 1 x 1 x n) and ``spares`` spare slots, running."""
    evs = [E.CoordinatorStarted(ts=1.0, grid=None)]
    evs += [E.Registered(ts=2.0, world_rank=w, pid=100 + w, node=f"n{w}", role="active", logical_rank=w)
            for w in range(n_active)]
    evs += [E.Registered(ts=2.0, world_rank=n_active + i, pid=200 + i, node=f"s{i}", role="standby",
                         logical_rank=None) for i in range(spares)]
    evs.append(E.JobRunning(ts=3.0, generation=0, grid=[1, 1, n_active], rank_map=[[w, w] for w in range(n_active)],
                            standby=[n_active + i for i in range(spares)]))
    return evs


HOT_SWAP = [
    E.Commit(ts=4.0, recoverable_step=5, shard_steps={"opt/pp0/tp0/dp0": {"1": 5}}),
    E.SlotsDead(ts=5.0, slots=[1], nodes=["n1"], kind="node_loss", reason="node n1 lost"),
    E.Decision(ts=5.0, action="hot_swap", reason="spare available"),
    E.RecoveryStart(ts=5.5, generation=1, action="hot_swap", survivors=[0], dead=[1], detect_s=0.5),
    E.RecoveryPlanned(ts=6.0, generation=1, action="hot_swap", grid={"tp": 1, "pp": 1, "dp": 2},
                      rank_map=[[0, 0], [1, 2]], dead_world=[1], recoverable_step=5, steps_replayed=1,
                      joins=[{"world_rank": 2, "logical_rank": 1, "node": "s0", "replaces_world_rank": 1}]),
    E.RecoveryRestored(ts=7.0, generation=1, recoverable_step=5),
    E.RecoveryDone(ts=8.0, generation=1, action="hot_swap", total_s=3.0, steps_replayed=1, recoverable_step=5,
                   phases={"detect": 0.5, "reconfigure": 0.5, "params": 0.5, "optimizer": 0.5, "replay": 0.5}),
]


def _slots(v):
    return {w: (s.state, s.logical_rank, s.generation) for w, s in v.slots.items()}


@pytest.mark.parametrize("events,expect", [
    pytest.param(_job(), {"running": True, "job_state": "running", "grid": (1, 1, 2), "rank_map": {0: 0, 1: 1},
                          "slots": {0: ("active", 0, 0), 1: ("active", 1, 0), 2: ("standby", None, None)}},
                 id="registered and running"),
    pytest.param(_job() + HOT_SWAP[:4],
                 {"generation": 1, "job_state": "recovering", "recovery_phase": "quiesce",
                  "slots": {0: ("quiesced", 0, 0), 1: ("dead", 1, 0), 2: ("standby", None, None)}},
                 id="a recovery starts: the survivor quiesces"),
    pytest.param(_job() + HOT_SWAP[:5],
                 {"recovery_phase": "restore", "rank_map": {0: 0, 1: 2}, "recoverable_step": 5,
                  "slots": {0: ("quiesced", 0, 0), 1: ("dead", 1, 0), 2: ("joining", 1, None)}},
                 id="the plan: the spare joins as logical rank 1"),
    pytest.param(_job() + HOT_SWAP,
                 {"generation": 1, "job_state": "running", "recovery_phase": None, "rank_maps": {0: {0: 0, 1: 1},
                                                                                                 1: {0: 0, 1: 2}},
                  "slots": {0: ("active", 0, 1), 1: ("dead", 1, 0), 2: ("active", 1, 1)},
                  "recoveries": [("done", "hot_swap", 3.0, [1])], "live": 5},
                 id="a hot swap, done"),
    pytest.param(_job(spares=0) + [
        E.SlotsDead(ts=5.0, slots=[1], nodes=["n1"], kind="node_loss", reason="lost"),
        E.RecoveryStart(ts=5.5, generation=1, action="shrink", survivors=[0], dead=[1], detect_s=0.5),
        E.RecoveryPlanned(ts=6.0, generation=1, action="shrink", grid={"tp": 1, "pp": 1, "dp": 1}, rank_map=[[0, 0]],
                          dead_world=[1], recoverable_step=4, steps_replayed=0, joins=[],
                          shrink={"old_grid": {"tp": 1, "pp": 1, "dp": 2}, "leavers": []}),
        E.Shrink(ts=6.5, generation=1, dp_from=2, dp_to=1, grid={"tp": 1, "pp": 1, "dp": 1}, recoverable_step=4,
                 freed=[], lost=[1]),
        E.RecoveryRestored(ts=7.0, generation=1, recoverable_step=4)],
        {"grid": (1, 1, 1), "grid_since": {0: (1, 1, 2), 1: (1, 1, 1)}, "rank_map": {0: 0},
         "slots": {0: ("active", 0, 1), 1: ("dead", 1, 0)}},
        id="a shrink: the grid changes from generation 1 on"),
    pytest.param(_job() + [
        E.DrainRequested(ts=4.0, request_id="d1", target={"rank": 1}, targets=[1], nodes=["n1"], at_step=9),
        E.DrainArmed(ts=4.1, request_id="d1", at_step=9, members=[0, 1]),
        E.DrainStart(ts=5.0, request_id="d1", targets=[1], nodes=["n1"], live_step=8)],
        {"drains": {"d1": "moving"}, "slots": {0: ("active", 0, 0), 1: ("drained", 1, 0), 2: ("standby", None, None)}},
        id="a planned drain: the drained slot leaves"),
    pytest.param(_job() + [
        E.InjectForwarded(ts=4.0, kind="crash", phase="forward", at_step=7, targets=[1], target={"rank": 1},
                          request_id="i1"),
        E.InjectArmed(ts=4.1, request_id="i1", armed_steps=[[1, 7]], started_steps=[[1, 6]]),
        E.InjectLanded(ts=5.0, request_id="i1", world_rank=1, step=7, phase="forward", at_step=7, exact=True)],
        {"injections": {"i1": "landed"}, "live": 6}, id="an injected fault lands"),
    pytest.param(_job() + [
        E.JobDone(ts=9.0, final_hash="ab", step=20, grid=[1, 1, 2], steps_agree=True, generation=0,
                  rank_hashes=["a", "b"])],
        {"job_state": "done", "job_end": "job_done", "final_hash": "ab", "live": 20,
         "slots": {0: ("done", 0, 0), 1: ("done", 1, 0), 2: ("standby", None, None)}},
        id="job_done: members done, the spare stays a spare"),
    pytest.param(_job() + [E.CleanStop(ts=9.0, reason="no spare", message="stopped; resubmit")],
                 {"job_state": "failed", "job_end": "clean_stop", "end_reason": "stopped; resubmit"},
                 id="a clean stop"),
    pytest.param(_job() + [E.Commit(ts=4.0, recoverable_step=3), E.CoordinatorStarted(ts=5.0, job_id="2"),
                           E.Registered(ts=6.0, world_rank=0, pid=5, node="n9", role="active", logical_rank=0)],
                 {"running": False, "recoverable_step": None, "slots": {0: ("active", 0, 0)}, "restarts": 0},
                 id="a resumed run: the new job's start drops the earlier job"),
    pytest.param(_job() + [E.CoordinatorStarted(ts=5.0, restart=1), E.CoordinatorStarted(ts=6.0, restart=2)],
                 {"running": True, "restarts": 2, "slots": {0: ("active", 0, 0), 1: ("active", 1, 0),
                                                             2: ("standby", None, None)}},
                 id="a restarted coordinator continues its job"),
])
def test_events_in_view_out(events, expect):
    v = JobView()
    for ev in events:
        v = apply(v, ev)
    got = {"running": v.running, "job_state": v.job_state, "grid": v.grid, "rank_map": v.rank_map,
           "slots": _slots(v), "generation": v.generation, "recoverable_step": v.recoverable_step,
           "recovery_phase": v.recovery.phase if v.recovery else None, "rank_maps": v.rank_maps,
           "recoveries": [(r.state, r.action, r.total_s, r.dead_slots) for r in v.recoveries], "live": v.live,
           "grid_since": v.grid_since, "drains": {k: d.state for k, d in v.drains.items()},
           "injections": {k: i.state for k, i in v.injections.items()}, "job_end": v.job_end,
           "final_hash": v.final_hash, "end_reason": v.end_reason, "restarts": v.restarts}
    assert {k: got[k] for k in expect} == expect
    assert v.skipped == []


@pytest.mark.parametrize("records,skipped", [
    ([{"ts": 1, "event": "from_a_newer_coordinator", "x": 1}], ["record 2 (from_a_newer_coordinator): no such"]),
    ([{"ts": 1, "event": "registered", "world_rank": "w3", "pid": 1}], ["record 2 (registered): EventError: field 'world_rank' is \"w3\""]),
    ([{"ts": 1, "event": ""}], ["record 2 (): EventError"]),
    ([{"ts": 1, "event": "drain_armed", "request_id": "zz", "at_step": 3}], ["record 2 (drain_armed): out of order at ts 1.0: drain request"]),
    ([{"ts": 1, "event": "rejoined", "world_rank": 9, "step": 3}], ["record 2 (rejoined): out of order at ts 1.0: world rank 9 never"]),
    ([{"ts": 1, "event": "recovery_done", "generation": 4}], ["record 2 (recovery_done): out of order at ts 1.0: no recovery"]),
    ([{"ts": 1, "event": "inject_armed", "request_id": "q", "armed_steps": []}], ["record 2 (inject_armed): out of order at ts 1.0: inject"]),
])
def test_bad_and_out_of_order_records_are_skipped_with_the_reason(records, skipped):
    """The records before and after a bad one still count; the bad one changes nothing but ``skipped``."""
    head = [{"ts": 0, "event": "registered", "world_rank": 0, "pid": 1, "node": "n0", "role": "active",
             "logical_rank": 0}]
    v = fold(head + records + [{"ts": 2, "event": "commit", "recoverable_step": 4}])
    assert [s[:len(want)] for s, want in zip(v.skipped, skipped)] == skipped and len(v.skipped) == len(skipped)
    assert list(v.slots) == [0] and v.recoverable_step == 4


def test_a_torn_last_line_and_a_bad_line_do_not_stop_the_restarted_coordinators_read(tmp_path):
    lines = [json.dumps({"ts": 1, "event": "registered", "world_rank": 0, "pid": 1, "node": "n0", "role": "active",
                         "logical_rank": 0}), "not json at all", json.dumps({"ts": 2, "event": "commit",
                                                                             "recoverable_step": 4}), '{"ts": 3, "ev']
    (tmp_path / "journal.jsonl").write_text("\n".join(lines))  # no newline after the torn last line
    with pytest.raises(ValueError, match="not a JSON line"):
        list(iter_journal(tmp_path))
    skipped: list[str] = []
    v = fold(iter_journal(tmp_path, skipped=skipped))
    assert len(skipped) == 1 and "journal.jsonl:2: not a JSON line" in skipped[0]
    assert list(v.slots) == [0] and v.recoverable_step == 4 and v.skipped == []


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.parent.name)
def test_a_real_journal_reads_as_typed_events_unchanged(path):
    """Every record of a real run's journal (one written before the typed events) is a declared event that
    gives every field back unchanged (the on-disk format did not change); a field an older coordinator did not
    write yet reads as None."""
    for rec in iter_journal(path):
        ev = E.from_record(rec)
        assert not isinstance(ev, E.UnknownEvent), rec["event"]
        back = ev.to_record()
        assert {k: back[k] for k in rec if k != "ts"} == {k: v for k, v in rec.items() if k != "ts"}, rec["event"]
        assert all(back[k] is None for k in set(back) - set(rec)), rec["event"]


# a slot state as phoenix status shows it -> as the coordinator holds it (a drained slot left: DONE)
_AS_COORDINATOR = {"drained": "done"}


def _restarted(journal: Path, run_dir: Path, upto: int) -> Coordinator:
    """A coordinator restarted (restart 1) on the first ``upto`` lines of ``journal``, its state rebuilt."""
    run_dir.mkdir()
    lines = journal.read_text().splitlines(keepends=True)[:upto]
    (run_dir / "journal.jsonl").write_text("".join(lines))
    c = Coordinator(run_dir, restart=1, clock=lambda: 0.0)
    c.recorder.open(Journal(run_dir), fold_existing=True)  # as Coordinator.open does for a restart
    c._rebuild_from_journal()
    return c


def _cut_points(journal: Path) -> list[int]:
    """Where a coordinator could have died: after every record that changes slots, generation or progress."""
    keep = {E.JobRunning.NAME, E.SlotsDead.NAME, E.RecoveryStart.NAME, E.RecoveryPlanned.NAME,
            E.RecoveryRestored.NAME, E.RecoveryDone.NAME, E.Commit.NAME, E.Shrink.NAME, E.Rejoined.NAME}
    recs = list(iter_journal(journal))
    return [i + 1 for i, r in enumerate(recs) if r["event"] in keep] + [len(recs)]


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.parent.name)
def test_a_restarted_coordinator_and_phoenix_status_read_a_real_journal_alike(path, tmp_path):
    """At every point a real run's coordinator could have died, the coordinator restarted on the journal so
    far and ``phoenix status`` of the same records agree on the generation, the grid, the rank map and every
    slot's state, logical rank and node."""
    for n in _cut_points(path):
        c = _restarted(path, tmp_path / f"cut{n}", n)
        recs = current_job_records(list(iter_journal(tmp_path / f"cut{n}")))
        st = derive_status(recs, SlurmInfo(), now=0.0)
        rank_map = {lr: w for lr, w in c.rank_map.items()}
        assert c.generation == st.job.generation, n
        assert (c.grid and {"tp": c.grid[0], "pp": c.grid[1], "dp": c.grid[2]}) == st.job.grid, n
        assert {r.owner_rank: r.owner_world for r in st.replicas} == rank_map, n
        coord = {w: (s.state.value, s.logical_rank, s.node, s.pid) for w, s in c.slots.items()}
        status = {s.world_rank: (_AS_COORDINATOR.get(s.state, s.state), s.logical_rank, s.node, s.pid)
                  for s in st.slots}
        assert coord == status, n


def test_phoenix_status_shows_a_journal_with_records_it_cannot_read_and_names_them():
    recs = [{"ts": 1.0, "event": "coordinator_started", "grid": [1, 1, 1]},
            {"ts": 2.0, "event": "registered", "world_rank": 0, "pid": 5, "node": "n0", "role": "active",
             "logical_rank": 0},
            {"ts": 2.5, "event": "from_a_newer_coordinator", "x": 1},
            {"ts": 3.0, "event": "job_running", "generation": 0, "grid": [1, 1, 1], "rank_map": [[0, 0]]},
            {"ts": 4.0, "event": "drain_done", "request_id": "never"}]
    st = derive_status(recs, SlurmInfo(), now=5.0)
    assert st.job.state == "running" and [s.world_rank for s in st.slots] == [0]
    (w,) = [w for w in st.warnings if w.code == "journal"]
    assert w.message.startswith("2 journal record(s) not shown: record 3 (from_a_newer_coordinator)")
    assert "drain request 'never' never requested" in w.message


def _start(restart=None, job="1"):
    return {"ts": 1.0, "event": "coordinator_started", "job_id": job, **({"restart": restart} if restart else {})}


_P = {"ts": 2.0, "event": "progress", "step": 3}


@pytest.mark.parametrize("records, cuts", [
    ([], []),
    ([_start(), _P, _start(restart=1), _P], [4]),  # a restart within the job continues it
    ([_start(), _P, _start(job="2"), _P], [2, 2]),  # a resumed run: a job per first start
    ([_start(restart=1), _P, _start(job="2")], [2, 1]),  # a journal that begins with a restart
    ([_P, _start()], [1, 1]),  # records before any start: a segment of their own
])
def test_one_rule_cuts_a_journal_into_jobs_for_the_fold_status_and_the_job_list(records, cuts):
    from phoenix_hpc.control.view import job_segments
    from phoenix_hpc.status.jobs import _segments

    segs = job_segments(records)
    assert [len(s) for s in segs] == cuts
    assert current_job_records(records) == (segs[-1] if segs else [])
    # the job list keeps the segments that begin with a coordinator start, with their job id
    assert [(j, len(s)) for j, s in _segments(records)] == [
        (s[0]["job_id"], len(s)) for s in segs if s[0]["event"] == "coordinator_started"]
    # the fold starts the view again exactly where a segment starts: the newest job's view
    assert fold(records).restarts == sum(1 for r in (segs[-1] if segs else []) if r.get("restart"))
