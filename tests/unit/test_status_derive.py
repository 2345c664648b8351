"""derive_status on synthetic journals: slots, replicas, recoveries, warnings, injections, Slurm's view."""

from __future__ import annotations

import json

import pytest

from phoenix_hpc.status.derive import derive_status, node_is_down
from phoenix_hpc.status.model import RunFiles, SlurmInfo

N1, N2, N3 = "nid00001", "nid00002", "nid00003"
CONFIG = {
    "name": "toy",
    "parallelism": {"tp": 1, "pp": 1, "dp": 4},
    "training": {"steps": 20},
    "resilience": {"k": 1, "placement_levels": ["node"]},
    "resources": {"nodes": 2, "spares": 1, "gpus_per_node": 2},
}


def run_files(**kw) -> RunFiles:
    return RunFiles(run_dir="/runs/toy", config=CONFIG, job={"job_id": "77", "site": "local",
                                                             "submitted_at": 0.0}, **kw)


def start_records() -> list[dict]:
    """World ranks 0,1 on N1 and 2,3 on N2 (active, logical = world); 4,5 standby on N3."""
    r = [{"ts": 0.0, "event": "coordinator_started", "grid": [1, 1, 4], "host": N1, "port": 1, "pid": 9}]
    for w, node in enumerate([N1, N1, N2, N2]):
        r.append({"ts": 0.1 + w / 100, "event": "registered", "world_rank": w, "pid": 100 + w, "node": node,
                  "role": "active", "logical_rank": w})
    for w in (4, 5):
        r.append({"ts": 0.2, "event": "registered", "world_rank": w, "pid": 100 + w, "node": N3, "role": "standby",
                  "logical_rank": None})
    r.append({"ts": 1.0, "event": "job_running", "generation": 0, "grid": [1, 1, 4],
              "rank_map": [[i, i] for i in range(4)], "standby": [4, 5]})
    r.append({"ts": 2.0, "event": "commit", "recoverable_step": 1, "shards": 4, "replicas": 4, "generation": 0})
    r.append({"ts": 3.0, "event": "heartbeat_summary", "generation": 0, "job_state": "running",
              "active": [0, 1, 2, 3], "standby": [4, 5], "dead": [], "max_step": 6})
    return r


def node_loss_records() -> list[dict]:
    return [
        {"ts": 10.0, "event": "slots_dead", "slots": [2, 3], "nodes": [N2], "kind": "heartbeat_timeout",
         "reason": "no heartbeat for 10.0s"},
        {"ts": 10.1, "event": "decision", "action": "hot_swap", "reason": "heartbeat_timeout on nodes nid00002",
         "faults": []},
        {"ts": 11.0, "event": "recovery_start", "generation": 1, "action": "hot_swap", "survivors": [0, 1],
         "dead": [2, 3], "detect_s": 1.25},
        {"ts": 12.0, "event": "recovery_plan", "generation": 1, "action": "hot_swap",
         "rank_map": [[0, 0], [1, 1], [2, 4], [3, 5]], "dead_world": [2, 3], "released_spares": [],
         "joins": [{"world_rank": 4, "node": N3, "logical_rank": 2, "coord": [0, 2, 0], "replaces_world_rank": 2},
                   {"world_rank": 5, "node": N3, "logical_rank": 3, "coord": [0, 3, 0], "replaces_world_rank": 3}],
         "transfers": [], "recoverable_step": 7, "rollbacks": [], "replication": [], "steps_replayed": 1},
        {"ts": 13.0, "event": "recovery_restored", "generation": 1, "recoverable_step": 7},
        {"ts": 15.0, "event": "recovery_done", "generation": 1, "action": "hot_swap", "total_s": 5.0,
         "phases": {"detect": 1.25, "reconfigure": 0.5, "params": 0.25, "optimizer": 0.5, "replay": 2.0},
         "steps_replayed": 1, "recoverable_step": 7, "replay_interrupted": False},
    ]


def done_records() -> list[dict]:
    return [{"ts": 20.0, "event": "job_done", "final_hash": "abc123", "step": 20, "steps_agree": True,
             "generation": 1, "rank_hashes": []},
            {"ts": 20.5, "event": "coordinator_exit", "job_state": "done"}]


def running_slurm(nodelist="nid0000[1-3]", states=None, batch="nid00001") -> SlurmInfo:
    states = states or {}
    return SlurmInfo(job={"JobId": "77", "JobState": "RUNNING", "NodeList": nodelist, "BatchHost": batch},
                     nodes={n: {"NodeName": n, "State": states.get(n, "ALLOCATED")} for n in (N1, N2, N3)})


def test_running_job_lists_every_slot_and_replica():
    st = derive_status(start_records(), running_slurm(), now=5.0, run=run_files())
    assert st.job.state == "running"
    assert st.job.job_id == "77" and st.job.slurm_state == "RUNNING"
    assert st.job.node_list == [N1, N2, N3]
    assert st.job.grid == {"tp": 1, "pp": 1, "dp": 4}
    assert st.job.step == 6 and st.job.recoverable_step == 1
    assert [(s.world_rank, s.node, s.state, s.logical_rank) for s in st.slots] == [
        (0, N1, "active", 0), (1, N1, "active", 1), (2, N2, "active", 2), (3, N2, "active", 3),
        (4, N3, "standby", None), (5, N3, "standby", None)]
    assert [s.coord for s in st.slots[:4]] == [[0, 0, 0], [0, 1, 0], [0, 2, 0], [0, 3, 0]]
    assert st.spare_slots_left == 2 and st.spare_nodes_left == 1
    assert {n.name: n.role for n in st.nodes} == {N1: "active", N2: "active", N3: "spare"}
    # one replica per shard (k=1), on a DP peer of another node (docs/design.md section 5), planned placement
    assert [r.shard_id for r in st.replicas] == [f"opt/pp0/tp0/dp{i}" for i in range(4)]
    for r in st.replicas:
        assert r.source == "planned"
        assert len(r.holders) == 1 and r.live_holders == 1
        h = r.holders[0]
        assert h.logical_rank != r.owner_rank and h.node != r.owner_node
        assert r.committed_step == 1 and r.last_commit_at == 2.0 and r.age_s == pytest.approx(3.0)
    assert st.warnings == []


def test_node_loss_before_recovery_warns_under_replicated():
    recs = start_records() + node_loss_records()[:1]
    st = derive_status(recs, running_slurm(states={N2: "DOWN*"}), now=10.5, run=run_files())
    dead = [s.world_rank for s in st.slots if s.state == "dead"]
    assert dead == [2, 3]
    assert {n.name: n.role for n in st.nodes}[N2] == "lost"
    codes = [w.code for w in st.warnings]
    assert "under_replicated" in codes
    # shards owned on N1 have their replica on N2 -> 0 live holders
    lost_holder = [r for r in st.replicas if r.owner_node == N1]
    assert lost_holder and all(r.live_holders == 0 for r in lost_holder)
    assert [f.source for f in st.faults] == ["detected"]


def test_hot_swap_recovery_and_spares_consumed():
    recs = start_records() + node_loss_records()
    st = derive_status(recs, running_slurm(nodelist="nid0000[1,3]", states={N2: "DOWN*"}), now=16.0,
                       run=run_files())
    assert st.job.state == "running" and st.job.generation == 1
    by_w = {s.world_rank: s for s in st.slots}
    assert (by_w[4].state, by_w[4].logical_rank, by_w[4].generation) == ("active", 2, 1)
    assert (by_w[5].state, by_w[5].logical_rank, by_w[5].coord) == ("active", 3, [0, 3, 0])
    assert by_w[2].state == "dead" and "replaced by world rank 4" in by_w[2].note
    assert st.spare_slots_left == 0 and st.spare_nodes_left == 0
    assert [w.code for w in st.warnings] == ["no_spares"]
    (rec,) = st.recoveries
    assert rec.state == "done" and rec.action == "hot_swap" and rec.generation == 1
    assert rec.total_s == 5.0 and rec.steps_replayed == 1 and rec.detect_s == 1.25
    assert rec.phases == {"detect": 1.25, "reconfigure": 0.5, "params": 0.25, "optimizer": 0.5, "replay": 2.0}
    assert rec.quiesce_s == 1.0  # recovery_start (t=11) -> recovery_plan (t=12), from the journal
    assert [j["world_rank"] for j in rec.joins] == [4, 5]
    # replicas follow the logical ranks to the new slots
    shard2 = st.replicas[2]
    assert shard2.owner_world == 4 and shard2.owner_node == N3 and shard2.owner_alive



@pytest.mark.parametrize("engine, resilience, says, never", [
    # the default: auto with engine torch shrinks (README "When spares run out: shrink")
    (None, {}, ["shrinks the job", "spares_exhausted: auto with engine torch", "dp - 1", "if the grid allows",
                "else the job stops, naming the newest persistent checkpoint"], ["cannot be hot-swapped"]),
    ("torch", {"spares_exhausted": "shrink"}, ["shrinks the job", "spares_exhausted: shrink)", "if the grid allows"],
     ["cannot be hot-swapped"]),
    ("torch", {"spares_exhausted": "stop"},
     ["cannot be hot-swapped (resilience.spares_exhausted: stop)",
      "the job stops, naming the newest persistent checkpoint to resubmit from"], ["shrinks"]),
    ("megatron", {"spares_exhausted": "auto"},
     ["cannot be hot-swapped (resilience.spares_exhausted: auto with engine 'megatron', which cannot shrink)",
      "the job stops, naming the newest persistent checkpoint"], ["shrinks the job"]),
    ("torch", {"recovery_source": "checkpoint"},
     ["cannot be hot-swapped (resilience.recovery_source: checkpoint never shrinks)", "the job stops"],
     ["shrinks the job"]),
])
def test_no_spare_left_says_what_the_next_node_loss_does_by_the_policy(engine, resilience, says, never):
    cfg = {**CONFIG, "resilience": {**CONFIG["resilience"], **resilience}, **({"engine": engine} if engine else {})}
    st = derive_status(start_records() + node_loss_records(),
                       running_slurm(nodelist="nid0000[1,3]", states={N2: "DOWN*"}), now=16.0,
                       run=RunFiles(run_dir="/runs/toy", config=cfg, job={"job_id": "77", "site": "local"}))
    (w,) = [w for w in st.warnings if w.code == "no_spares"]
    assert w.message.startswith("no spare left: the next node loss ")
    for text in says:
        assert text in w.message, w.message
    for text in never:
        assert text not in w.message, w.message


def test_a_fault_with_no_spare_left_shrinks_in_mode_phoenix_with_shrink_or_auto_and_engine_torch():
    from phoenix_hpc.recovery.shrink import shrinks_when_spares_run_out as shrinks

    assert shrinks(enabled=True, mode="phoenix", spares_exhausted="auto", engine="torch")
    assert shrinks(enabled=True, mode="phoenix", spares_exhausted="shrink", engine="torch")
    assert not shrinks(enabled=True, mode="phoenix", spares_exhausted="auto", engine="megatron")
    assert not shrinks(enabled=True, mode="phoenix", spares_exhausted="stop", engine="torch")
    assert not shrinks(enabled=False, mode="phoenix", spares_exhausted="auto", engine="torch")
    assert not shrinks(enabled=True, mode="checkpoint-restart", spares_exhausted="auto", engine="torch")

def test_recovery_in_progress():
    recs = start_records() + node_loss_records()[:4]
    st = derive_status(recs, running_slurm(), now=12.5, run=run_files())
    assert st.job.state == "recovering"
    assert st.recoveries[-1].state == "in_progress" and st.recoveries[-1].total_s is None
    assert {s.world_rank: s.state for s in st.slots}[4] == "joining"


def test_finished_job_without_slurm_record_still_renders():
    recs = start_records() + node_loss_records() + done_records()
    slurm = SlurmInfo(error="Slurm has no record of job 77")
    st = derive_status(recs, slurm, now=1e6, run=run_files())
    assert st.job.state == "done" and st.finished
    assert st.job.final_hash == "abc123" and st.job.step == 20 and st.job.ended_at == 20.0
    assert st.job.slurm_state is None
    assert all(s.state in ("done", "dead") for s in st.slots)
    assert [w.code for w in st.warnings] == ["slurm"]  # no spare warnings for a finished job
    json.dumps(st.to_json())  # serialisable


def test_batch_host_down_offers_cancel():
    st = derive_status(start_records(), running_slurm(states={N1: "DOWN+NOT_RESPONDING"}), now=5.0,
                       run=run_files())
    w = next(w for w in st.warnings if w.code == "batch_host_down")
    assert "nid00001" in w.message and w.action == "phoenix status 77 --cancel"


def test_slurm_ended_without_final_record():
    slurm = SlurmInfo(job={"JobId": "77", "JobState": "CANCELLED", "NodeList": "nid0000[1-3]",
                           "BatchHost": N1})
    st = derive_status(start_records(), slurm, now=5.0, run=run_files())
    assert st.job.state == "ended"
    assert "coordinator_gone" in [w.code for w in st.warnings]


def test_node_removed_from_live_nodelist_marks_slots_dead():
    st = derive_status(start_records(), running_slurm(nodelist="nid0000[1,3]"), now=5.0, run=run_files())
    assert {s.world_rank: s.state for s in st.slots} == {0: "active", 1: "active", 2: "dead", 3: "dead",
                                                         4: "standby", 5: "standby"}
    assert "node removed" in st.slots[2].note


def test_pending_job_without_journal():
    slurm = SlurmInfo(job={"JobId": "77", "JobState": "PENDING", "NodeList": "", "BatchHost": ""})
    st = derive_status([], slurm, now=1.0, run=run_files())
    assert st.job.state == "pending" and st.slots == [] and st.replicas[0].holders == []
    assert st.spare_nodes_left == 1 and st.spare_slots_left == 2


def test_reported_per_shard_commits_override_plan():
    recs = start_records() + [{
        "ts": 4.0, "event": "commit", "recoverable_step": 5, "generation": 0,
        "shard_steps": {"opt/pp0/tp0/dp0": {"0": 6, "3": 5}}, "shard_bytes": {"opt/pp0/tp0/dp0": 4096},
        "placement": {"opt/pp0/tp0/dp0": [3]}}]
    st = derive_status(recs, running_slurm(), now=6.0, run=run_files())
    r0 = st.replicas[0]
    assert r0.source == "reported" and [h.logical_rank for h in r0.holders] == [3]
    assert r0.holders[0].step == 5 and r0.committed_step == 5 and r0.bytes_ == 4096 and r0.age_s == 2.0
    assert st.replicas[1].holders == []  # not reported: not guessed once commits name holders


def test_injection_forwarded_and_landed():
    recs = start_records() + [{"ts": 4.0, "event": "inject_forwarded", "kind": "node_loss",
                               "phase": "optimizer_step", "at_step": 9, "targets": [2, 3], "request_id": "r1"}]
    fired = [{"ts": 4.5, "request_id": "r1", "world_rank": w, "pid": 1, "kind": "node_loss", "at_step": 9,
              "step": 9, "phase": "optimizer_step"} for w in (2, 3)]
    st = derive_status(recs, running_slurm(), now=6.0, run=run_files(fired=fired))
    (inj,) = st.injections
    assert (inj.kind, inj.phase, inj.at_step, inj.targets) == ("kill-node", "optimizer", 9, [2, 3])
    assert [(f["world_rank"], f["step"], f["phase"]) for f in inj.fired] == [(2, 9, "optimizer"),
                                                                            (3, 9, "optimizer")]


def test_fallback_and_aborted_recoveries():
    recs = start_records() + node_loss_records()[:3] + [
        {"ts": 11.5, "event": "recovery_aborted", "generation": 1, "phase": "quiesce", "reason": "slot 1 died"},
        {"ts": 11.6, "event": "recovery_start", "generation": 2, "action": "hot_swap", "survivors": [0],
         "dead": [1, 2, 3], "detect_s": 1.0},
        {"ts": 12.0, "event": "decision", "action": "fallback", "reason": "shard opt/pp0/tp0/dp2 lost"},
        {"ts": 12.1, "event": "fallback", "reason": "shard lost", "message": "restart from checkpoint"},
    ]
    st = derive_status(recs, running_slurm(), now=13.0, run=run_files())
    assert [r.state for r in st.recoveries] == ["aborted", "fallback"]
    assert st.job.state == "failed" and st.job.end_reason == "restart from checkpoint"


@pytest.mark.parametrize("state,down", [("IDLE", False), ("ALLOCATED", False), ("MIXED+DRAIN", False),
                                        ("DOWN*", True), ("IDLE*", True), ("DOWN+NOT_RESPONDING", True),
                                        ("FAIL", True), (None, False)])
def test_node_is_down(state, down):
    assert node_is_down(state) is down


def test_derive_is_pure():
    recs = start_records()
    before = json.dumps(recs)
    derive_status(recs, running_slurm(), now=5.0, run=run_files())
    assert json.dumps(recs) == before


def _live_at(st, t):
    """The live step of ``st`` at time ``t`` (None before the first point)."""
    best = None
    for ts, step in st.progress:
        if ts <= t:
            best = step
    return best


def _committed_at(st, t):
    best = None
    for ts, step in st.commits:
        if ts <= t:
            best = step
    return best


def test_live_step_is_never_below_the_committed_step():
    # heartbeat summaries lag (every 30 s): the one at t=3 says 6, a commit at t=4 already says 9
    recs = start_records() + [
        {"ts": 4.0, "event": "commit", "recoverable_step": 9, "shards": 4, "replicas": 4, "generation": 0},
        {"ts": 5.0, "event": "heartbeat_summary", "generation": 0, "job_state": "running",
         "active": [0, 1, 2, 3], "standby": [4, 5], "dead": [], "max_step": 4}]
    st = derive_status(recs, running_slurm(), now=6.0, run=run_files())
    assert st.job.step == 9 and st.job.recoverable_step == 9
    for t, _ in st.progress + st.commits:
        assert _live_at(st, t) >= (_committed_at(st, t) or 0)
    assert [p[1] for p in st.progress] == sorted(p[1] for p in st.progress)  # no fake dip within a generation


def test_progress_records_drive_the_live_step_and_a_restore_rolls_it_back():
    recs = start_records()[:-1] + [  # no heartbeat summary with max_step 6
        {"ts": 1.5, "event": "progress", "step": 1, "min_step": 1, "generation": 0},
        {"ts": 2.5, "event": "progress", "step": 4, "min_step": 3, "generation": 0},
        {"ts": 3.0, "event": "heartbeat_summary", "generation": 0, "job_state": "running", "active": [0, 1, 2, 3],
         "standby": [4, 5], "dead": [], "max_step": 99},  # ignored: progress records are the live source
        {"ts": 9.5, "event": "progress", "step": 8, "min_step": 8, "generation": 0},
        {"ts": 9.8, "event": "fault", "world_rank": 0, "node": N1, "generation": 0, "step": 9,
         "phase": "forward_backward", "kind": "comm_error", "exc_type": "RuntimeError", "message": "peer"},
    ] + node_loss_records()[:4] + [
        # a stale generation-0 fault naming step 12 arrives after the recovery began: not live progress
        {"ts": 12.5, "event": "fault", "world_rank": 1, "node": N1, "generation": 0, "step": 12,
         "phase": "reduce_gradients", "kind": "collective_timeout", "exc_type": "RuntimeError", "message": "t"},
    ] + node_loss_records()[4:5] + [
        {"ts": 14.0, "event": "progress", "step": 8, "min_step": 8, "generation": 1}]
    recs.sort(key=lambda r: r["ts"])  # journal order
    st = derive_status(recs, running_slurm(), now=14.5, run=run_files())
    assert st.progress == [[1.5, 1.0], [2.5, 4.0], [9.5, 8.0], [13.0, 7.0], [14.0, 8.0]]
    assert _live_at(st, 3.5) == 4  # not 99 (heartbeat summary ignored), not 6
    assert _live_at(st, 9.9) == 8  # the fault interrupted step 9: step 8 was done
    assert _live_at(st, 12.9) == 8  # the stale fault did not raise it to 11
    assert _live_at(st, 13.0) == 7  # recovery_restored: members resume from the recoverable step 7
    assert st.commits[-1] == [12.0, 7.0]  # the plan names the step the recovery resumes from
    assert st.job.step == 8 and st.job.recoverable_step == 7


def test_real_node_loss_journal_gives_a_live_step_from_the_start():
    """A demo run's journal (tp=1 pp=2 dp=2, node loss at step 25, hot swap, recoverable step 23)."""
    from pathlib import Path

    from phoenix_hpc.control.journal import read_journal
    from phoenix_hpc.faults.trigger import read_fired

    d = Path(__file__).parent / "data" / "status_node_loss"
    recs = read_journal(d)
    st = derive_status(recs, SlurmInfo(), now=recs[-1]["ts"], run=RunFiles(run_dir=str(d), fired=read_fired(d)))
    assert st.job.state == "done" and st.job.step == 50
    for t, _ in st.progress + st.commits:
        assert _live_at(st, t) >= (_committed_at(st, t) or 0)
    ts = {r["event"]: r["ts"] for r in recs}
    first_commit = next(r for r in recs if r["event"] == "commit" and r["recoverable_step"] == 10)
    assert _live_at(st, first_commit["ts"]) == 10  # the heartbeat summary alone said 0 until 30 s
    assert _live_at(st, ts["recovery_start"]) == 24  # the fault interrupted step 25
    assert _live_at(st, ts["recovery_restored"]) == 23  # hot swap resumed from the committed step 23
    # the third report (rank 2's collective timed out in the generation the recovery had left: journalled
    # superseded) is a consequence of the fault, not a fault
    assert [f.step for f in st.faults if f.source == "reported"] == [25, 25]


def test_counters_agree_checkpoint_not_newer_than_committed_not_newer_than_live():
    # the watch: progress 13 (slowest slot), commit record 10, a checkpoint of step 20 reported at once
    recs = start_records()[:-1] + [
        {"ts": 3.0, "event": "commit", "recoverable_step": 10, "shards": 4, "replicas": 4, "generation": 0},
        {"ts": 3.5, "event": "progress", "step": 13, "min_step": 12, "generation": 0},
        {"ts": 4.0, "event": "checkpoint", "step": 20, "path": "/ck/20", "world_rank": 0},
    ]
    mid = derive_status(recs, running_slurm(), now=4.1, run=run_files())
    j = mid.job
    assert j.step >= 20  # the checkpoint of step 20 was written after step 20 finished
    assert (j.checkpoint_step or 0) <= (j.recoverable_step or 0) <= j.step
    recs.append({"ts": 4.5, "event": "commit", "recoverable_step": 20, "shards": 4, "replicas": 4, "generation": 0})
    j = derive_status(recs, running_slurm(), now=5.0, run=run_files()).job
    assert (j.checkpoint_step, j.recoverable_step) == (20, 20) and j.step >= 20
    # the last step's checkpoint: no commit of it follows the end of the job; it is what a resubmit resumes from
    recs += [{"ts": 6.0, "event": "checkpoint", "step": 30, "path": "/ck/30", "world_rank": 0},
             {"ts": 6.5, "event": "job_done", "final_hash": "h", "step": 30, "steps_agree": True, "generation": 0}]
    j = derive_status(recs, None, now=7.0, run=run_files()).job
    assert j.state == "done" and (j.checkpoint_step, j.recoverable_step, j.step) == (30, 30, 30)


def test_committed_step_during_a_recovery_is_the_one_it_resumes_from():
    recs = start_records() + node_loss_records()[:4]  # plan says recoverable step 7; last commit record said 1
    st = derive_status(recs, running_slurm(), now=12.5, run=run_files())
    assert st.job.state == "recovering"
    assert st.job.recoverable_step == st.recoveries[-1].recoverable_step == 7
    assert st.commits[-1] == [12.0, 7.0]


def test_recovery_phases_and_other_add_up_to_the_total():
    from rich.console import Console

    from phoenix_hpc.status.render import status_renderable

    recs = start_records() + node_loss_records()
    recs[-1] = {**recs[-1], "total_s": 9.17, "phases": {"detect": 4.09, "reconfigure": 0.51, "params": 0.10,
                                                         "optimizer": 0.10, "replay": 0.21}}
    st = derive_status(recs, running_slurm(), now=16.0, run=run_files())
    (rec,) = st.recoveries
    assert rec.quiesce_s == 1.0  # recovery_start (t=11) -> recovery_plan (t=12)
    assert sum(rec.phases.values()) + rec.quiesce_s + rec.other_s == pytest.approx(rec.total_s)
    console = Console(width=250, record=True, color_system=None)
    console.print(status_renderable(st))
    text = console.export_text()
    header = next(line for line in text.splitlines() if "reconfigure" in line)
    assert "quiesce" in header and "other" in header
    row = next(line for line in text.splitlines() if "hot_swap" in line and "9.17s" in line)
    assert "1.00s" in row and "3.16s" in row  # quiesce, and other = 9.17 - 4.09 - 1.0 - 0.51 - 0.1 - 0.1 - 0.21


def test_faults_table_shows_the_cause_of_a_gloo_error():
    from rich.console import Console

    from phoenix_hpc.status.render import status_renderable

    msg = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
           "[127.0.0.1]:41234")
    recs = start_records() + [{"ts": 4.0, "event": "fault", "world_rank": 1, "node": N1, "generation": 0,
                               "step": 9, "phase": "forward_backward", "kind": "comm_error",
                               "exc_type": "RuntimeError", "message": msg}]
    st = derive_status(recs, running_slurm(), now=5.0, run=run_files())
    assert st.faults[-1].message == "RuntimeError: Connection closed by peer [127.0.0.1]:41234"
    console = Console(width=250, record=True, color_system=None)
    console.print(status_renderable(st))
    assert "Connection closed by peer" in console.export_text()


def test_pending_job_shows_slurms_reason():
    from rich.console import Console

    from phoenix_hpc.status.render import status_renderable

    reason = "ReqNodeNotAvail,_UnavailableNodes:nid00002"
    slurm = SlurmInfo(job={"JobId": "77", "JobState": "PENDING", "NodeList": "", "BatchHost": "", "Reason": reason})
    st = derive_status([], slurm, now=1.0, run=run_files())
    assert st.job.slurm_reason == reason
    (w,) = [w for w in st.warnings if w.code == "pending"]
    assert reason in w.message and "phoenix cluster revive" in w.message
    console = Console(width=250, record=True, color_system=None)
    console.print(status_renderable(st))
    assert f"reason {reason}" in console.export_text()
    # a running job has no pending reason, even if scontrol still prints Reason=None
    st = derive_status([], SlurmInfo(job={"JobId": "77", "JobState": "RUNNING", "Reason": "None"}), 1.0, run_files())
    assert st.job.slurm_reason is None and not [w for w in st.warnings if w.code == "pending"]


def test_recoveries_table_says_what_replayed_means():
    from rich.console import Console

    from phoenix_hpc.status.render import status_renderable

    st = derive_status(start_records() + node_loss_records(), running_slurm(), now=16.0, run=run_files())
    console = Console(width=250, record=True, color_system=None)
    console.print(status_renderable(st))
    assert "replayed: completed steps the recovery discarded and trained again" in console.export_text()


def test_replicas_of_a_finished_job_are_not_called_unreported():
    from rich.console import Console

    from phoenix_hpc.status.render import status_renderable

    st = derive_status(start_records() + node_loss_records() + done_records(), None, now=30.0, run=run_files())
    assert st.commits and {r.source for r in st.replicas} == {"planned"}
    console = Console(width=250, record=True, color_system=None)
    console.print(status_renderable(st))
    text = console.export_text()
    assert "not yet reported" not in text and "no commit reported yet" not in text
    assert "committed: as the ranks reported" in " ".join(text.split())
    header = next(line for line in text.splitlines() if "shard" in line and "owner" in line)
    assert "bytes" not in header  # no shard sizes in the journal: no column of dashes


def test_after_the_end_status_keeps_the_spares_the_signal_the_jobs_and_the_checkpoint_on_disk():
    done = derive_status(start_records() + done_records(), None, now=30.0, run=run_files())
    assert {s.world_rank: s.state for s in done.slots} == {0: "done", 1: "done", 2: "done", 3: "done",
                                                           4: "standby", 5: "standby"}
    assert done.spare_nodes_left == 1 and done.spare_slots_left == 2
    assert {n.name: n.role for n in done.nodes} == {N1: "active", N2: "active", N3: "spare"}
    stopped = start_records() + [
        {"ts": 9.0, "event": "checkpoint", "step": 5, "source": "final"},
        {"ts": 9.1, "event": "coordinator_stopped", "reason": "time limit", "signal": "USR1", "checkpoint_step": 5},
        {"ts": 9.2, "event": "coordinator_exit", "job_state": "stopped"}]
    job = {"job_id": "78", "site": "local", "jobs": [{"job_id": "77"}, {"job_id": "78"}]}
    st = derive_status(stopped, None, now=30.0, run=RunFiles(run_dir="/runs/toy", config=CONFIG, job=job,
                                                             checkpoints=[4, 8]))
    assert st.job.state == "stopped" and st.job.end_signal == "USR1"
    assert st.job.checkpoint_step == 8  # the newest complete checkpoint on disk
    assert st.job.jobs == ["77", "78"]
    assert not [n for n in st.nodes if n.role == "lost"]


def test_a_resumed_run_shows_its_newest_job_only():
    first = start_records() + [{"ts": 9.1, "event": "coordinator_stopped", "reason": "SIGTERM", "signal": "TERM"},
                               {"ts": 9.2, "event": "coordinator_exit", "job_state": "stopped"}]
    second = [{**r, "ts": r["ts"] + 100} for r in start_records()]
    st = derive_status(first + second, running_slurm(), now=105.0, run=run_files())
    assert st.job.state == "running" and st.job.end_event is None and st.job.end_signal is None


def _with_shard_steps(records: list[dict], steps: dict) -> list[dict]:
    """``records`` whose commit record names each copy's committed step (as the coordinator journals it: JSON's
    object keys are strings)."""
    out = [dict(r) for r in records]
    for r in out:
        if r["event"] == "commit":
            r["shard_steps"] = {sid: {str(h): st for h, st in copies.items()} for sid, copies in steps.items()}
    return out


def test_verified_replicas_per_shard_with_their_domains_and_the_shards_below_k_flagged():
    # every owner committed step 5; shard dp0's holder reported no verified copy yet
    steps = {f"opt/pp0/tp0/dp{i}": {i: 5} for i in range(4)}
    for sid, copies in steps.items():
        if sid != "opt/pp0/tp0/dp0":
            copies.update({h: 5 for h in range(4) if h != int(sid[-1])})  # whatever holds it has a copy
    st = derive_status(_with_shard_steps(start_records(), steps), running_slurm(), now=5.0, run=run_files())
    by_sid = {r.shard_id: r for r in st.replicas}
    assert by_sid["opt/pp0/tp0/dp0"].verified_replicas == 0 and by_sid["opt/pp0/tp0/dp0"].live_holders == 1
    for i in (1, 2, 3):
        r = by_sid[f"opt/pp0/tp0/dp{i}"]
        assert r.verified_replicas == 1 and r.verified_domains == [r.holders[0].node]
    (w,) = [w for w in st.warnings if w.code == "under_replicated"]
    assert "opt/pp0/tp0/dp0 (0/1)" in w.message and "dp1" not in w.message
    js = json.loads(json.dumps(st.to_json()))
    row = [r for r in js["replicas"] if r["shard_id"] == "opt/pp0/tp0/dp1"][0]
    assert row["verified_replicas"] == 1 and row["verified_domains"] == [r.holders[0].node for r in
                                                                       [by_sid["opt/pp0/tp0/dp1"]]]


def test_a_dead_holders_copy_is_not_a_verified_replica():
    steps = {f"opt/pp0/tp0/dp{i}": {h: 5 for h in range(4)} for i in range(4)}
    recs = _with_shard_steps(start_records(), steps) + node_loss_records()[:1]
    st = derive_status(recs, running_slurm(states={N2: "DOWN*"}), now=10.5, run=run_files())
    for r in st.replicas:
        assert r.verified_replicas == sum(1 for h in r.holders if h.alive)
    assert [r.verified_replicas for r in st.replicas if r.owner_node == N1] == [0, 0]


def test_the_protection_interval_the_ranks_chose_is_shown_with_its_lost_work_bound():
    recs = start_records() + [{"ts": 4.0, "event": "protect_interval", "interval": 3, "step": 6, "generation": 0,
                               "lost_steps_at_most": 5}]
    st = derive_status(recs, running_slurm(), now=5.0, run=run_files())
    assert st.job.protect_every == 3
    text = _text(st)
    assert "every 3 steps" in text and "at most 5 steps" in text, text
    back = recs + [{"ts": 4.5, "event": "protect_interval", "interval": 1, "step": 9, "generation": 0,
                    "lost_steps_at_most": 1}]
    st = derive_status(back, running_slurm(), now=5.0, run=run_files())
    assert st.job.protect_every == 1 and "protection" not in _text(st)


def _text(st) -> str:
    from rich.console import Console

    from phoenix_hpc.status.render import status_renderable

    console = Console(width=250, record=True, color_system=None)
    console.print(status_renderable(st))
    return console.export_text()


def test_a_shrink_renumbers_the_slots_and_frees_the_leavers():
    """dp 4 -> 2: world 2 (logical 2) dies with no spare left; the shrink removes DP replica 2 ... here one
    slot per replica, so the kept ones (world 0, 1, 3) are renumbered 0, 1, 2 -- status shows the new logical
    ranks and coordinates (what --rank/--coord resolve against), the grid, and the shrink."""
    recs = start_records() + [
        {"ts": 10.0, "event": "slots_dead", "slots": [2], "nodes": [N2], "kind": "process_exit", "reason": "x"},
        {"ts": 11.0, "event": "recovery_start", "generation": 1, "action": "hot_swap", "survivors": [0, 1, 3],
         "dead": [2], "detect_s": 0.1},
        {"ts": 12.0, "event": "recovery_plan", "generation": 1, "action": "shrink", "grid": {"tp": 1, "pp": 1, "dp": 3},
         "rank_map": [[0, 0], [1, 1], [2, 3]], "dead_world": [2], "released_spares": [], "joins": [],
         "transfers": [], "recoverable_step": 7, "rollbacks": [], "replication": [], "steps_replayed": 0,
         "shrink": {"old_grid": {"tp": 1, "pp": 1, "dp": 4}, "leavers": [], "needs": [], "sources": []}},
        {"ts": 13.0, "event": "shrink", "generation": 1, "dp_from": 4, "dp_to": 3, "recoverable_step": 7,
         "freed": [], "lost": [2], "drain": None},
        {"ts": 13.1, "event": "recovery_restored", "generation": 1, "recoverable_step": 7},
    ]
    st = derive_status(recs, running_slurm(), now=14.0, run=run_files())
    assert st.job.grid == {"tp": 1, "pp": 1, "dp": 3}
    by_world = {s.world_rank: s for s in st.slots}
    assert by_world[3].logical_rank == 2 and by_world[3].coord == [0, 2, 0], by_world[3]
    assert [(x["dp_from"], x["dp_to"], x["lost"]) for x in st.shrinks] == [(4, 3, [2])]


def test_a_spare_that_takes_a_rank_is_not_credited_with_the_copies_of_the_slot_it_replaced():
    """After a hot swap logical ranks 2 and 3 are held by spares; the copies the commit of generation 0 names
    for holders 2 and 3 were the dead slots': until generation 1's first commit names the spares' own copies,
    no verified replica is attributed to them (the other holders' copies still count)."""
    steps = {f"opt/pp0/tp0/dp{i}": {h: 5 for h in range(4) if h != i} for i in range(4)}
    recs = _with_shard_steps(start_records(), steps) + node_loss_records()
    st = derive_status(recs, running_slurm(), now=16.0, run=run_files())
    for r in st.replicas:
        for h in r.holders:
            if h.logical_rank in (2, 3):
                assert h.step is None, (r.shard_id, h)
            elif h.alive:
                assert h.step == 5, (r.shard_id, h)
    fresh = recs + [{"ts": 17.0, "event": "commit", "generation": 1, "recoverable_step": 8,
                     "shard_steps": {f"opt/pp0/tp0/dp{i}": {str(h): 8 for h in range(4) if h != i} for i in range(4)}}]
    st = derive_status(fresh, running_slurm(), now=18.0, run=run_files())
    assert all(h.step == 8 for r in st.replicas for h in r.holders if h.alive)
