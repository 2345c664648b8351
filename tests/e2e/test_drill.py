"""``phoenix drill`` end to end on the real local Slurm cluster.

One drill of a small job (the gpt-small model on 2 active nodes + 2 spare nodes, dp=2, one slot per node,
torch engine on gloo, runtime protection with k=1, 240 steps of about 0.1 s) with five faults drawn from a
fixed seed among ``crash``, ``kill-node`` and ``transient`` (``hang`` is left out to keep the drill short: its
detection waits for the heartbeat timeout). With seed 128 the plan is a ``kill-node`` of logical rank 0 (on the
batch host, so the drill must move it to the node of rank 1), a ``crash`` of logical rank 1 and three
``transient`` errors; the two hot swaps use both spare nodes, the transient errors are local recoveries. The
drill submits the fault-free reference and the drill job with the real ``phoenix submit``, injects through
the coordinator, kills the node's slurmd, and revives it at the end.

Checked: exit code 0 and an identical final hash; every fault was sent once, landed at exactly its planned
step and phase and caused one recovery; the drill's report, the journal and ``phoenix status --json`` agree
on what happened; the cluster is whole again afterwards (the killed node's slurmd runs, every node idle).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from phoenix_hpc.control.journal import read_journal
from phoenix_hpc.drills.drill import plan_drill
from phoenix_hpc.faults.kinds import PHASE_WIRE
from phoenix_hpc.slurm import cluster as lc
from phoenix_hpc.slurm import procs
from phoenix_hpc.slurm.client import SlurmClient
from functools import partial
from waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
PHOENIX = str(ROOT / ".venv" / "bin" / "phoenix")

pytestmark = pytest.mark.cluster

STEPS = 240
SEED = 128
FAULTS = 5
KINDS = ("crash", "kill-node", "transient")
CONFIG = {
    "name": "drill",
    "engine": "torch",
    "model": {"layers": 4, "hidden_size": 128, "heads": 4, "vocab_size": 256, "seq_length": 64},
    "parallelism": {"tp": 1, "pp": 1, "dp": 2},
    "training": {"steps": STEPS, "micro_batch_size": 2, "global_batch_size": 8, "seed": 11, "lr": 0.001,
                 "warmup_steps": 2, "log_interval": 10},
    "resilience": {"k": 1, "placement_levels": ["node", "switch"], "heartbeat_interval_s": 0.5,
                   "heartbeat_timeout_s": 4.0, "collective_timeout_s": 8.0, "chunk_bytes": 65536},
    "resources": {"nodes": 2, "spares": 2, "time_limit": "00:10:00"},
}


_wait = partial(wait_for, poll_s=0.5)

@pytest.fixture(scope="module")
def drill_run(slurm_cluster, slurm_env, tmp_path_factory):
    """Run the drill once; returns (report, base dir, env, elapsed seconds, the drill's stderr)."""
    from phoenix_hpc.data.prepare import prepare_dataset, stdlib_dir

    tmp = tmp_path_factory.mktemp("drill")
    data = tmp / "data" / "stdlib"
    prepare_dataset(stdlib_dir(), data, max_bytes=300_000)
    cfg_path = tmp / "drill.yaml"
    cfg_path.write_text(yaml.safe_dump(dict(CONFIG, data={"path": str(data)})))
    env = dict(slurm_env, PHOENIX_HOME=str(tmp / "home"), PHOENIX_CLUSTER_DIR=str(slurm_cluster.run_dir))
    base = tmp / "runs"
    t0 = time.monotonic()
    out = subprocess.run([PHOENIX, "drill", str(cfg_path), "--site", "local", "--faults", str(FAULTS),
                          "--seed", str(SEED), "--kinds", ",".join(KINDS), "--run-dir", str(base),
                          "--timeout-s", "200", "--json"],
                         env=env, capture_output=True, text=True, timeout=900)
    elapsed = time.monotonic() - t0
    # the drill restarted the killed node's slurmd and recorded its new PID in cluster.json: later tests read
    # daemon PIDs from the session object, so it must hold the new ones
    slurm_cluster.daemons.update(lc.load_cluster(slurm_cluster.run_dir).daemons)
    try:
        report = json.loads(out.stdout)
    except ValueError:
        report = None
    assert out.returncode == 0 and report is not None, (
        f"drill exit {out.returncode}\nstdout:\n{out.stdout[-4000:]}\nstderr:\n{out.stderr[-4000:]}")
    print(f"drill: {elapsed:.1f} s")
    return report, base, env, elapsed


def test_drill_recovers_every_fault_to_the_fault_free_final_hash(drill_run):
    report, base, env, _ = drill_run
    ref_done = read_journal(base / "reference", "job_done")
    job_done = read_journal(base / "job", "job_done")
    assert len(ref_done) == 1 and len(job_done) == 1
    assert not read_journal(base / "reference", "fault") and not read_journal(base / "reference", "recovery_start")
    assert report["passed"] and report["hash_equal"] and report["final_state"] == "done"
    assert report["reference"]["final_hash"] == ref_done[0]["final_hash"]
    assert report["final_hash"] == job_done[0]["final_hash"] == ref_done[0]["final_hash"]
    assert job_done[0]["step"] == STEPS and job_done[0]["steps_agree"]

    plan = plan_drill(FAULTS, SEED, steps=STEPS, world=2, gpus_per_node=1, spare_nodes=2, kinds=KINDS)
    faults = report["faults"]
    print(json.dumps([{k: f[k] for k in ("kind", "phase", "planned_step", "at_step", "landed", "error")}
                      for f in faults], indent=1))
    assert [(f["kind"], f["phase"], f["planned_step"], f["planned_logical_rank"]) for f in faults] == [
        (p.kind, p.phase, p.at_step, p.rank) for p in plan]
    assert [f["kind"] for f in faults] == ["kill-node", "crash", "transient", "transient", "transient"]
    # kill-node planned on logical rank 0 (the batch host) is moved to the other node
    kill = faults[0]
    assert kill["planned_logical_rank"] == 0 and kill["target_logical_rank"] == 1 and kill["target_node"] != "nid00001"
    for f in faults:
        assert f["passed"] and f["landed_as_requested"] and f["recovered"], f
        assert f["action"] == ("local_recovery" if f["kind"] == "transient" else "hot_swap"), f
        assert f["at_step"] == f["planned_step"], f  # sent once, for exactly the planned step
        assert all(x["step"] == f["at_step"] and x["phase"] == f["phase"] for x in f["landed"]), f
        assert set(f["phases"]) == {"detect", "reconfigure", "params", "optimizer", "replay"}
        assert f["steps_replayed"] is not None and f["steps_replayed"] <= 1
        assert f["detect_s"] == f["phases"]["detect"] > 0
    # each fault landed after the previous one's recovery ended
    assert all(b["at_step"] > a["at_step"] for a, b in zip(faults, faults[1:]))
    assert report["nodes_revived"] == [kill["target_node"]]


def test_journal_and_status_json_agree_with_the_drill_report(drill_run):
    report, base, env, _ = drill_run
    job_dir = base / "job"
    faults = report["faults"]
    forwarded = {r["request_id"]: r for r in read_journal(job_dir, "inject_forwarded")}
    assert set(forwarded) == {f["request_id"] for f in faults}
    done = {r["generation"]: r for r in read_journal(job_dir, "recovery_done")}
    assert sorted(done) == list(range(1, FAULTS + 1))
    dead = read_journal(job_dir, "slots_dead")
    starts = {r["generation"]: r["ts"] for r in read_journal(job_dir, "recovery_start")}
    plans = {r["generation"]: r["ts"] for r in read_journal(job_dir, "recovery_plan")}
    for f in faults:
        fw = forwarded[f["request_id"]]
        assert fw["at_step"] == f["at_step"] and fw["phase"] == PHASE_WIRE[f["phase"]]
        rec = done[f["generation"]]
        assert (rec["action"], rec["total_s"], rec["phases"], rec["steps_replayed"]) == (
            f["action"], f["total_s"], f["phases"], f["steps_replayed"])
        assert f["quiesce_s"] == pytest.approx(plans[f["generation"]] - starts[f["generation"]], abs=1e-3)
    swapped = [f for f in faults if f["action"] == "hot_swap"]  # a local recovery declares no slot dead
    assert len(dead) == len(swapped) == 2
    assert faults[0]["target_node"] in dead[0]["nodes"] and faults[0]["target_world_rank"] in dead[0]["slots"]
    assert swapped[1]["target_world_rank"] in dead[1]["slots"]

    out = subprocess.run([PHOENIX, "status", str(job_dir), "--json"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    st = json.loads(out.stdout)
    assert st["job"]["state"] == "done" and st["job"]["final_hash"] == report["final_hash"]
    assert st["job"]["job_id"] == report["job"]["job_id"] and st["job"]["generation"] == FAULTS
    recs = {r["generation"]: r for r in st["recoveries"]}
    assert sorted(recs) == list(range(1, FAULTS + 1))
    injections = {i["request_id"]: i for i in st["injections"]}
    for f in faults:
        r = recs[f["generation"]]
        assert (r["action"], r["state"], r["total_s"], r["phases"], r["steps_replayed"]) == (
            f["action"], "done", f["total_s"], f["phases"], f["steps_replayed"])
        inj = injections[f["request_id"]]
        assert (inj["kind"], inj["phase"], inj["at_step"]) == (f["kind"], f["phase"], f["at_step"])
        assert inj["fired"] == f["landed"]
    assert st["spare_nodes_left"] == 0


def test_drill_leaves_the_cluster_whole(drill_run, slurm_cluster):
    report, base, env, elapsed = drill_run
    client = SlurmClient(env=env)
    job_id = report["job"]["job_id"]
    _wait(lambda: client.show_job(job_id).get("JobState") not in ("RUNNING", "COMPLETING", "PENDING"), 90,
          f"drill job {job_id} to end")
    cluster = lc.load_cluster(slurm_cluster.run_dir)
    node = report["faults"][0]["target_node"]
    assert procs.is_alive(cluster.daemons[f"slurmd:{node}"])
    _wait(lambda: all(n.get("State", "").lower().startswith("idle") for n in client.show_nodes()), 60,
          "every node idle")
    print(f"drill took {elapsed:.1f} s")


IN_JOB_STEPS = 100
IN_JOB_SEED = 5  # a kill-node planned on logical rank 0 at step 22 (optimizer), then a crash of rank 0 at step 65


def test_an_in_job_checkpoint_restart_drill_restarts_each_fault_in_the_same_allocation_and_ends_identical(
        slurm_cluster, slurm_env, tmp_path):
    """``phoenix drill`` of the in-job baseline (``mode: checkpoint-restart``, ``checkpoint.restart: in-job``,
    a checkpoint every 10 steps, 2 active + 2 spare nodes): each of the two faults (a node loss, then a process
    crash) ends the srun step and the batch script starts the next one in the same Slurm job without the dead
    node; every rank restores the newest checkpoint and trains the steps since it again (its step log shows
    exactly those steps twice); the report measures detect, teardown, relaunch and replay from every step's
    records, and the final state equals the fault-free reference's. The config names an absolute checkpoint
    folder (as ``phoenix config from-megatron`` writes ``--save``): each run writes its own checkpoints under
    its run directory instead, so the drill job starts fresh, not from the reference's final checkpoint, and
    the user's folder stays untouched."""
    from phoenix_hpc.control.in_job import RESTARTS_LOG
    from phoenix_hpc.data.prepare import prepare_dataset, stdlib_dir
    from phoenix_hpc.drills.in_job import ACTION

    data = tmp_path / "data" / "stdlib"
    prepare_dataset(stdlib_dir(), data, max_bytes=300_000)
    cfg = dict(CONFIG, name="drill-in-job", data={"path": str(data)},
               training=dict(CONFIG["training"], steps=IN_JOB_STEPS),
               resilience=dict(CONFIG["resilience"], mode="checkpoint-restart",
                               checkpoint={"interval_steps": 10, "restart": "in-job",
                                           "path": str(tmp_path / "user-ckpt")}))
    cfg_path = tmp_path / "drill-in-job.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    env = dict(slurm_env, PHOENIX_HOME=str(tmp_path / "home"), PHOENIX_CLUSTER_DIR=str(slurm_cluster.run_dir))
    base = tmp_path / "runs"
    out = subprocess.run([PHOENIX, "drill", str(cfg_path), "--site", "local", "--faults", "2", "--seed",
                          str(IN_JOB_SEED), "--kinds", "crash,kill-node", "--run-dir", str(base),
                          "--timeout-s", "200", "--json"], env=env, capture_output=True, text=True, timeout=900)
    slurm_cluster.daemons.update(lc.load_cluster(slurm_cluster.run_dir).daemons)  # the revived slurmd's PID
    assert out.returncode == 0, f"drill exit {out.returncode}\n{out.stdout}\n{out.stderr[-4000:]}"
    report = json.loads(out.stdout)
    assert report["mode"] == "in-job" and report["passed"] and report["hash_equal"]
    job_dir = base / "job"
    assert not (tmp_path / "user-ckpt").exists()
    for run in ("reference", "job"):
        assert report[run]["folders"]["checkpoints"] == str(base / run / "checkpoints")
        assert (base / run / "checkpoints" / "latest").exists()
    (done,) = read_journal(job_dir, "job_done")
    assert done["step"] == IN_JOB_STEPS and done["final_hash"] == report["reference"]["final_hash"]
    requests = read_journal(job_dir, "restart_in_job")
    restarts = [json.loads(x) for x in (job_dir / RESTARTS_LOG).read_text().splitlines()]
    faults = report["faults"]
    assert [(f["kind"], f["phase"], f["planned_step"]) for f in faults] == [
        ("kill-node", "optimizer", 22), ("crash", "forward", 65)]
    assert len(requests) == len(restarts) == 2
    assert {r["slurm_job_id"] for r in restarts} == {str(report["job"]["job_id"])}  # one Slurm job throughout
    for f, req, restart in zip(faults, requests, restarts):
        assert f["passed"] and f["action"] == ACTION and f["recovery_state"] == "done", f
        assert set(f["phases"]) == {"detect", "teardown", "relaunch", "replay"} and f["total_s"] > 0, f
        assert f["target_node"] in req["dead_nodes"] and f["target_node"] not in restart["nodes"], (f, req, restart)
        ck = req["checkpoint_step"]
        assert ck == (f["at_step"] - 1) // 10 * 10  # the newest checkpoint before the fault
        assert f["steps_replayed"] == f["at_step"] - 1 - ck
    assert done["steps_agree"]
    cks = [req["checkpoint_step"] for req in requests]
    for r in range(2):
        # every rank started fresh in srun step 0 and restored each checkpoint in srun steps 1 and 2 of that job
        restores = [x for x in map(json.loads, (job_dir / "ranks" / f"rank{r}.persist.jsonl").read_text().splitlines())
                    if x["event"] == "restore"]
        job_id = str(report["job"]["job_id"])
        assert [(x["slurm_job_id"], x["slurm_step_id"], x["step"]) for x in restores] == [
            (job_id, "0", None), (job_id, "1", cks[0]), (job_id, "2", cks[1])], (r, restores)
        # each checkpoint's loss of steps: the steps after it were trained again, from ck + 1 on, at least the
        # steps the fault cost; every step of the run was trained, none skipped
        steps = [json.loads(x)["step"] for x in (job_dir / "ranks" / f"rank{r}.steps.jsonl").read_text().splitlines()]
        cuts = [i for i in range(1, len(steps)) if steps[i] <= steps[i - 1]]
        assert [steps[i] for i in cuts] == [ck + 1 for ck in cks], (r, steps)
        assert sorted(set(steps)) == list(range(1, IN_JOB_STEPS + 1)) and steps[-1] == IN_JOB_STEPS, (r, steps)
        again = []
        for i, ck, f in zip(cuts, cks, faults):
            lost = steps[i - 1] - ck
            assert lost >= f["steps_replayed"] >= 1, (r, lost, f)
            again += range(ck + 1, ck + lost + 1)
        assert sorted(s for s in set(steps) for _ in range(steps.count(s) - 1)) == sorted(again), (r, steps)
    print(f"in-job drill: {[(f['kind'], f['at_step'], f['total_s'], f['phases']) for f in faults]}")
