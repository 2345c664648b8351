"""Planned ends on the real local Slurm cluster: Slurm's time-limit warning and scancel's SIGTERM make the
ranks write the final checkpoint of the newest committed step from their host snapshots, and a job
resumed from it ends with the fault-free final hash (docs/design.md section 7, "Planned ends").

The warning is delivered as Slurm delivers it for ``sbatch --signal=B:USR1@s``: to the batch shell
(``scancel --batch --signal=USR1``), which forwards it to the coordinator. ``scancel --signal=TERM`` goes
to the step's tasks (scancel(1)), which pass it on to the coordinator.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from test_hotswap import CONFIG, PHOENIX, STEPS, Job, _run_reference, _wait  # noqa: F401

pytestmark = pytest.mark.cluster

STOP_AT = 15  # the live step after which the job is told to end


def _slowed(env: dict) -> dict:
    """``env`` with every replica delayed 0.1 s (the test-only knob of runtime/protector.py), so each step
    waits about that long for its commit: the signal, which Slurm delivers through slurmctld, slurmd and the
    step's tasks, reaches a job that is still training (unslowed, its remaining 25 steps take ~0.3 s and the job
    could end first). Protection only reads the state: the fault-free reference still applies."""
    return dict(env, PHOENIX_TEST_REPLICATION_DELAY_S="0.1")


def _stop_mid_run(job: Job, signal: str, batch: bool) -> dict:
    _wait(lambda: min(job.step(0), job.step(1)) >= STOP_AT, 180, f"step {STOP_AT}")
    job.client.cancel(job.job_id, signal=signal, batch=batch)
    _wait(lambda: job.events("coordinator_exit"), 120, "the end of the job", poll_s=0.3)
    (end,) = job.events("coordinator_stopped")
    return end


def _check_nothing_committed_lost(job: Job, end: dict) -> int:
    """The final checkpoint holds a step at least as new as every step the coordinator saw committed."""
    (ck,) = [e for e in job.events("checkpoint") if e.get("source") == "final"]
    committed = max(e["recoverable_step"] for e in job.events("commit"))
    live = max(job.step(0), job.step(1))
    assert ck["step"] >= committed, (ck, committed)
    assert live - 2 <= ck["step"] <= live, (ck["step"], live)  # at most one step behind the newest live step
    assert end["checkpoint_step"] == ck["step"] and "phoenix submit --resume" in end["message"]
    assert not job.events("slots_dead") and not job.events("recovery_start")
    marker = json.loads((job.run_dir / "checkpoints" / f"step_{ck['step']:08d}" / "complete.json").read_text())
    assert marker["kind"] == "snapshot" and sorted(marker["files"]) == ["pp0-tp0-dp0.pt", "pp0-tp0-dp1.pt"]
    print(f"stopped at live step {live}, committed {committed}, final checkpoint step {ck['step']} "
          f"(write {ck['write_s']} s, stop + write {ck['total_s']} s)")
    return ck["step"]


def _resume(job: Job) -> dict:
    """``phoenix submit --resume RUN_DIR``: the same run directory, a new Slurm job; wait for its end."""
    out = subprocess.run([PHOENIX, "submit", "--resume", str(job.run_dir), "--json"], env=job.env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    first = job.job_id
    reply = json.loads(out.stdout)
    job.job_id = reply["job_id"]
    assert reply["jobs"] == [first, job.job_id] and job.job_id != first
    try:
        _wait(lambda: len(job.events("coordinator_started")) == 2 and job.events("coordinator_exit")[1:], 180,
              "the end of the resumed job", poll_s=0.5)
    finally:
        job.cancel()
    (done,) = job.events("job_done")
    return done


def _chained(**resilience) -> dict:
    """:data:`CONFIG` as a chained run (``resources.chain: 1``)."""
    return dict(CONFIG, resources=dict(CONFIG["resources"], chain=1),
                resilience=dict(CONFIG["resilience"], **resilience))


def _wait_chain_done(job: Job, first: str) -> tuple[str, dict]:
    """Wait until the job the chain queued has run to its end; return (its id, its ``job_done``)."""
    entries = json.loads((job.run_dir / "job.json").read_text())["jobs"]
    (nxt,) = [e for e in entries if e.get("after") == first]
    assert nxt["chain_index"] == 1
    try:
        _wait(lambda: len(job.events("coordinator_started")) == 2 and job.events("coordinator_exit")[-1:]
              and job.events("coordinator_exit")[-1]["ts"] > job.events("coordinator_started")[-1]["ts"], 240,
              f"the end of the chained job {nxt['job_id']}", poll_s=0.5)
    finally:
        job.client.cancel(nxt["job_id"])
    (done,) = job.events("job_done")
    return nxt["job_id"], done


def _status(env, job: Job) -> dict:
    st = subprocess.run([PHOENIX, "status", str(job.run_dir), "--json"], env=env, capture_output=True, text=True,
                        timeout=60)
    assert st.returncode == 0, st.stderr
    return json.loads(st.stdout)


def test_time_limit_warning_writes_the_committed_step_and_the_chain_continues_identical(
        env, data, reference, tmp_path, slurm_cluster):  # noqa: F811
    """Slurm's time-limit warning on a chained run (chain: 1): the final checkpoint holds the committed step,
    the job the chain queued at the start resumes from it by itself and ends with the fault-free hash."""
    job = Job(_slowed(env), tmp_path, data, "usr1", _chained())
    first = job.job_id
    try:
        end = _stop_mid_run(job, "USR1", batch=True)
    finally:
        job.cancel()
    assert end["signal"] == "USR1" and "time limit" in end["reason"]
    step = _check_nothing_committed_lost(job, end)
    out = job.output()
    assert "[phoenix] USR1: time limit" in out and "[phoenix] chain: queued job" in out, out[-2000:]
    assert "queued by the chain" in end["message"], end["message"]
    nxt, done = _wait_chain_done(job, first)
    summary = json.loads((job.run_dir / "ranks" / "rank0.json").read_text())
    assert summary["start_step"] == step  # 0 committed steps lost
    assert done["final_hash"] == reference["final_hash"] and done["step"] == STEPS
    jobs = _status(env, job)["run_jobs"]
    assert [j["job_id"] for j in jobs] == [first, nxt] and jobs[1]["resume_step"] == step, jobs
    assert jobs[0]["cause"] == "time limit" and jobs[0]["lost_steps"] == jobs[0]["last_step"] - step, jobs
    assert jobs[0]["committed_lost_steps"] == 0, jobs
    assert jobs[1]["end"] == "job_done", jobs


def _slurm_trace(client, job_id: str, node: str, t0: float, until_s: float = 300.0) -> list[tuple[float, str, str]]:
    """(seconds since ``t0``, job state, batch node state) at every change, until the job has left
    RUNNING/COMPLETING."""
    import time

    trace: list[tuple[float, str, str]] = []
    while time.monotonic() - t0 < until_s:
        js = client.show_job(job_id).get("JobState", "?")
        ns = (client.show_nodes(node) or [{}])[0].get("State", "?")
        if not trace or trace[-1][1:] != (js, ns):
            trace.append((round(time.monotonic() - t0, 1), js, ns))
        if js not in ("RUNNING", "COMPLETING", "SIGNALING", "CONFIGURING"):
            return trace
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} still {trace[-1:]} {until_s} s after its batch host was killed")


def test_batch_host_loss_continues_through_the_chain(env, data, reference, tmp_path, slurm_cluster):  # noqa: F811
    """The node of the batch script and the coordinator is killed (chain: 1, a periodic checkpoint every 10
    steps): Slurm ends the job, the queued job continues from the newest complete checkpoint and ends with
    the fault-free hash; status shows both jobs and the steps lost. Prints what Slurm did (docs/design.md
    section 7, "Batch-host loss")."""
    import time

    from phoenix_hpc.slurm import cluster as lc

    cfg = _chained(coordinator_timeout_s=8.0, checkpoint={"interval_steps": 10})
    cfg["resources"]["time_limit"] = "00:03:00"  # Slurm ends the job only at its time limit (lowered below)
    job = Job(env, tmp_path, data, "batchhost", cfg)
    first = job.job_id
    host = None
    try:
        _wait(lambda: job.step(0) >= 1, 180, "the first step")
        host = job.client.show_job(first)["BatchHost"]
        # found before the wait (a /proc scan takes tens to hundreds of ms on a loaded host, several steps), so
        # that the kill follows step 13 at once, well before the checkpoint of step 20
        targets = lc.node_kill_targets(slurm_cluster, host)
        _wait(lambda: [e for e in job.events("checkpoint") if e.get("step") == 10] and job.step(0) >= 13, 180,
              "the checkpoint of step 10 and step 13")
        newest = max(e["step"] for e in job.events("checkpoint"))
        t0 = time.monotonic()
        lc.kill_node(slurm_cluster, host, targets=targets)
        live = max(job.step(0), job.step(1))
        # the job's time limit lowered to 1 minute (the queued job keeps the config's 3), so Slurm's TIMEOUT
        # comes about 1 minute after the submit instead of 3 (time only; the same Slurm path)
        job.client.set_time_limit(first, 1)
        trace = _slurm_trace(job.client, first, host, t0)
        print(f"batch host {host} killed at live step {live} (newest checkpoint {newest}); Slurm: "
              + ", ".join(f"{t} s {js} (node {ns})" for t, js, ns in trace))
        # Slurm keeps a --no-kill job RUNNING without its batch host until its time limit (docs/design.md)
        assert trace[-1][1] == "TIMEOUT", trace
        nxt, done = _wait_chain_done(job, first)
    finally:
        job.cancel()
        if host is not None:
            lc.revive_node(slurm_cluster, host)
    assert done["final_hash"] == reference["final_hash"] and done["step"] == STEPS
    resumed = json.loads((job.run_dir / "ranks" / "rank0.json").read_text())["start_step"]
    assert resumed >= newest
    jobs = _status(env, job)["run_jobs"]
    assert [j["job_id"] for j in jobs] == [first, nxt], jobs
    assert jobs[0]["cause"] == "batch-host loss" and jobs[0]["resume_step"] is None, jobs
    assert jobs[1]["resume_step"] == resumed and jobs[0]["lost_steps"] == jobs[0]["last_step"] - resumed >= 1, jobs
    assert jobs[1]["end"] == "job_done", jobs


def test_scancel_sigterm_stops_cleanly_with_the_checkpoint_and_no_lost_node(
        env, data, reference, tmp_path, slurm_cluster):  # noqa: F811
    job = Job(_slowed(env), tmp_path, data, "term")
    try:
        end = _stop_mid_run(job, "TERM", batch=False)
        _wait(lambda: job.client.show_job(job.job_id).get("JobState") not in ("RUNNING", "COMPLETING"), 60,
              "the Slurm job to end")
    finally:
        job.cancel()
    assert end["signal"] == "TERM" and job.events("signal")
    step = _check_nothing_committed_lost(job, end)
    st = subprocess.run([PHOENIX, "status", str(job.run_dir), "--json"], env=env, capture_output=True, text=True,
                        timeout=60)
    assert st.returncode == 0, st.stderr
    status = json.loads(st.stdout)
    assert not [n for n in status["nodes"] if n["role"] == "lost"], status["nodes"]
    assert not [s for s in status["slots"] if s["state"] == "dead"], status["slots"]
    # one line per slot, no traceback
    out = job.output()
    assert "Traceback" not in out and out.count("stopped by the coordinator") >= 2, out[-3000:]
    done = _resume(job)
    assert json.loads((job.run_dir / "ranks" / "rank1.json").read_text())["start_step"] == step
    assert done["final_hash"] == reference["final_hash"]
