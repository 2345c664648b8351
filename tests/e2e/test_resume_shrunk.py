"""A run that shrank continues with ``phoenix submit --resume`` on the real local Slurm cluster.

One run (pp=2 x dp=2, no spare, a periodic checkpoint every ``R`` steps) goes through three jobs:

1. drained with ``--shrink`` at step ``R + 1`` (dp 2 -> 1 at the recoverable step ``R``, as the oracle job of
   :mod:`test_shrink`), then stopped with ``scancel --signal=TERM``: its final checkpoint of step ``S`` is
   written at grid (1, 2, 1). A resume with a config that changes the model is refused with exit code 2 and
   leaves the run directory byte for byte as it was;
2. resumed with the command the stop's message gives (``phoenix submit --resume RUN_DIR``): the job's grid is
   the config's (1, 2, 2), and its ranks re-partition the dp = 1 checkpoint over dp = 2; it trains on, then two
   crashes in stage 0 at once leave no copy of its shards and no spare, and the job ends by that fault
   (before its next checkpoint);
3. resumed from step ``S`` at the grid the run had there (dp = 1: a config with ``parallelism.dp: 1``; at that
   grid ``resilience.k`` needs ``mode: checkpoint-restart``, which changes no computation), it ends with the
   final hash of the run that never stopped: the fault-free job shrunk at ``R`` (session fixture
   ``pp2_shrink``), the same grid history.
"""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest
import yaml

from test_hotswap import PHOENIX, STEPS, Job, _cli, _inject, _wait
from test_shrink import PP_SHRINK_CONFIG

pytestmark = pytest.mark.cluster


def _tree(rd) -> dict:
    return {str(p.relative_to(rd)): p.read_bytes() for p in sorted(rd.rglob("*")) if p.is_file()}


def _submit(job: Job, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PHOENIX, "submit", *args], env=job.env, capture_output=True, text=True, timeout=120)


def _slurm_ended(job: Job) -> None:
    _wait(lambda: job.client.show_job(job.job_id).get("JobState") not in ("RUNNING", "COMPLETING", "PENDING"), 90,
          f"Slurm job {job.job_id} to end")


def _resumed(job: Job, out: subprocess.CompletedProcess, nth: int) -> None:
    """Follow the job a successful ``--resume`` submitted (its ``nth`` coordinator start in the journal)."""
    assert out.returncode == 0, out.stdout + out.stderr
    job.job_id = json.loads(out.stdout)["job_id"]
    _wait(lambda: len(job.events("coordinator_started")) >= nth, 120, f"the start of job {job.job_id}")


def _ended(job: Job, nth: int) -> None:
    _wait(lambda: len(job.events("coordinator_exit")) >= nth, 240, f"the end of job {job.job_id}", poll_s=0.3)
    _slurm_ended(job)


def test_a_shrunk_run_stopped_then_failed_resumes_to_the_hash_of_the_run_that_never_stopped(pp2_shrink, env, data,
                                                                                          tmp_path):
    R, done_ref = pp2_shrink["R"], pp2_shrink["done_ref"]
    assert R is not None and done_ref is not None, pp2_shrink["drain"]
    t0 = time.monotonic()
    cfg = dict(PP_SHRINK_CONFIG, name="resume-shrunk", resources=dict(PP_SHRINK_CONFIG["resources"], spares=0),
               resilience=dict(PP_SHRINK_CONFIG["resilience"], checkpoint={"interval_steps": R}))
    # each replica delayed 0.1 s (the test-only knob of runtime/protector.py): the stop reaches a job still
    # training; protection only reads the state
    job = Job(dict(env, PHOENIX_TEST_REPLICATION_DELAY_S="0.1"), tmp_path, data, "resume-shrunk", cfg)
    rd = job.run_dir
    try:
        _wait(lambda: job.events("job_running"), 120, "job_running")
        r = _cli(job, "drain", str(rd), "--rank", "2", "--shrink", "--at-step", str(R + 1), "--json")
        assert r.exit_code == 0, r.output
        # after the shrink the members are world 1 and 3 (logical 0 and 1), which log to rank1/rank3.steps.jsonl
        _wait(lambda: job.events("drain_done") and max(job.step(r) for r in range(4)) >= R + 3, 120,
              "the shrink and 2 steps at dp 1")
        job.client.cancel(job.job_id, signal="TERM")
        _ended(job, 1)
    finally:
        job.cancel()
    (stopped,) = job.events("coordinator_stopped")
    (ck,) = [e for e in job.events("checkpoint") if e.get("source") == "final"]
    S = ck["step"]
    assert R < S < 2 * R - 3, (R, S)  # written at dp 1, before the next periodic checkpoint
    marker = json.loads((rd / "checkpoints" / f"step_{S:08d}" / "complete.json").read_text())
    assert marker["grid"] == [1, 2, 1] and sorted(marker["files"]) == ["pp0-tp0-dp0.pt", "pp1-tp0-dp0.pt"], marker
    hint = re.search(r"To continue: (phoenix submit --resume \S+)$", stopped["message"])
    assert hint and hint.group(1).split()[-1] == str(rd), stopped["message"]
    t_stop = time.monotonic()

    # a resume with another model is refused at submit, naming the field; nothing of the run changes
    before = _tree(rd)
    changed = tmp_path / "wider.yaml"
    changed.write_text(yaml.safe_dump(dict(cfg, data={"path": str(data)},
                                           model=dict(cfg["model"], hidden_size=2 * cfg["model"]["hidden_size"]))))
    out = _submit(job, "--resume", str(rd), str(changed))
    assert out.returncode == 2, out.stdout + out.stderr
    assert "model.hidden_size: 64 in" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert _tree(rd) == before

    # 2. what the stop's message says to run: the job's grid is dp = 2; the ranks re-partition the dp 1 slices
    out = _submit(job, *hint.group(1).split()[2:], "--json")
    _resumed(job, out, 2)
    second = job.job_id
    fault_at = min(S + 6, 2 * R - 1)  # before the next periodic checkpoint (2 R), which this job would write
    try:
        _wait(lambda: job.events("job_running")[1:], 120, "job_running of the resumed job")
        _inject(job, "crash", "forward", at_step=fault_at, rank=0, wait=False)
        _inject(job, "crash", "forward", at_step=fault_at, rank=1, wait=False)
        _ended(job, 2)
    finally:
        job.cancel()
    assert json.loads(out.stdout)["resume_step"] == S
    restores = {r: [json.loads(x) for x in (rd / "ranks" / f"rank{r}.persist.jsonl").read_text().splitlines()
                    if x.strip()] for r in range(4)}
    restores = {r: [e["step"] for e in v if e["event"] == "restore" and e.get("slurm_job_id") == second]
                for r, v in restores.items()}
    assert restores == {r: [S] for r in range(4)}, restores  # four ranks: dp = 2, each loaded step S
    assert not job.events("job_done") and job.events("fallback"), job.events()[-6:]
    (fb,) = job.events("fallback")
    assert f"phoenix submit --resume {rd}" in fb["message"], fb["message"]
    dry = _submit(job, "--resume", str(rd), "--dry-run")  # what it says to run is accepted (dp 2 again)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "Traceback" not in job.output() and "Size mismatch" not in job.output(), job.output()[-3000:]
    trained = [json.loads(x)["step"] for x in (rd / "ranks" / "rank0.steps.jsonl").read_text().splitlines()
               if x.strip()]
    assert max(trained) >= fault_at - 1 > S, (trained[-5:], fault_at, S)
    t_fail = time.monotonic()

    # 3. from step S at the grid the run had there: the hash of the run that never stopped
    dp1 = tmp_path / "dp1.yaml"
    dp1.write_text(yaml.safe_dump(dict(cfg, data={"path": str(data)}, parallelism=dict(cfg["parallelism"], dp=1),
                                       resources=dict(cfg["resources"], nodes=2),
                                       resilience=dict(cfg["resilience"], mode="checkpoint-restart"))))
    out = _submit(job, "--resume", str(rd), str(dp1), "--json")
    _resumed(job, out, 3)
    try:
        _ended(job, 3)
    finally:
        job.cancel()
    (done,) = job.events("job_done")
    assert json.loads(out.stdout)["resume_step"] == S
    assert done["step"] == STEPS and done["grid"] == [1, 2, 1], done
    assert done["final_hash"] == done_ref["final_hash"], (done["rank_hashes"], done_ref["rank_hashes"])
    print(f"resume after a shrink: R={R}, stop at S={S}; first job + stop {t_stop - t0:.1f} s, resumed dp 2 job "
          f"until its fault {t_fail - t_stop:.1f} s, resumed dp 1 job {time.monotonic() - t_fail:.1f} s; "
          f"test {time.monotonic() - t0:.1f} s")
