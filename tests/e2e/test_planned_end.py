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

from test_hotswap import CONFIG, PHOENIX, STEPS, Job, _run_reference, _wait  # noqa: F401 -- fixtures below
from test_hotswap import data, env, reference  # noqa: F401

pytestmark = pytest.mark.cluster

STOP_AT = 15  # the live step after which the job is told to end


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


def test_time_limit_warning_writes_the_committed_step_and_the_resumed_job_ends_identical(
        env, data, reference, tmp_path, slurm_cluster):  # noqa: F811
    job = Job(env, tmp_path, data, "usr1")
    try:
        end = _stop_mid_run(job, "USR1", batch=True)
    finally:
        job.cancel()
    assert end["signal"] == "USR1" and "time limit" in end["reason"]
    step = _check_nothing_committed_lost(job, end)
    assert "[phoenix] USR1: time limit" in job.output()
    done = _resume(job)
    summary = json.loads((job.run_dir / "ranks" / "rank0.json").read_text())
    assert summary["start_step"] == step
    assert done["final_hash"] == reference["final_hash"] and done["step"] == STEPS


def test_scancel_sigterm_stops_cleanly_with_the_checkpoint_and_no_lost_node(
        env, data, reference, tmp_path, slurm_cluster):  # noqa: F811
    job = Job(env, tmp_path, data, "term")
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
