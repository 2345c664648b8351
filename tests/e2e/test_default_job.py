"""Two checkouts on one machine, each with its own local Slurm cluster, share one account's runs index
(``$PHOENIX_HOME/runs.jsonl``): each one's ``phoenix status`` without a job names its own cluster's job, never
the other's, even when the other's is newer in the index and the job ids are the same number.

Cluster A is the session cluster; cluster B a one-node cluster of the second checkout, started here. Each
checkout's job is a real Slurm job of its cluster whose batch script is ``RUN_DIR/job.sbatch`` of a run
directory (a sleep: what is checked is which job a command picks, not training).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from phoenix_hpc.slurm import cluster as lc
from phoenix_hpc.slurm.client import SlurmClient
from phoenix_hpc.slurm.identity import cluster_identity
from phoenix_hpc.status.runs import record_run

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
PHOENIX = str(ROOT / ".venv" / "bin" / "phoenix")
CONFIG = {"name": "default-job", "data": {"path": "data/none"}, "parallelism": {"tp": 1, "pp": 1, "dp": 2},
          "training": {"steps": 10}, "resources": {"nodes": 2, "spares": 0, "gpus_per_node": 1}}


def _run_dir(checkout: Path) -> Path:
    rd = checkout / "runs" / "job"
    rd.mkdir(parents=True)
    (rd / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    (rd / "job.sbatch").write_text("#!/bin/bash\n#SBATCH -N 1 -t 00:05:00 -o slurm.out\nsleep 120\n")
    return rd


def _submit(rd: Path, env: dict[str, str], home: Path) -> str:
    """sbatch the run's script on the cluster of ``env`` and record it as ``phoenix submit`` does."""
    job = SlurmClient(env).submit(rd / "job.sbatch", extra_args=[f"--chdir={rd}"])
    (rd / "job.json").write_text(json.dumps({"job_id": job, "site": "local", "submitted_at": time.time()}))
    record_run(rd, job, home=home, identity=cluster_identity(env))
    return job


def _phoenix(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([PHOENIX, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_two_checkouts_with_their_own_clusters_each_see_only_their_own_job(slurm_cluster, slurm_env, tmp_path):
    home = tmp_path / "home"  # the account's one runs index, shared by both checkouts
    a_dir, b_dir = tmp_path / "checkout-a", tmp_path / "checkout-b"
    b_cluster_dir = Path(tempfile.mkdtemp(prefix="phx-b-"))  # socket paths stay short
    b = None
    jobs: list[tuple[str, dict[str, str]]] = []
    try:
        b = lc.up(b_cluster_dir, nodes=1, switches=1, gpus_per_node=0)
        env_a = {**slurm_env, "PHOENIX_HOME": str(home)}
        env_b = {**{k: v for k, v in env_a.items() if k != "SLURM_CONF"}, **b.env}
        a_run, b_run = _run_dir(a_dir), _run_dir(b_dir)
        job_a = _submit(a_run, env_a, home)
        jobs.append((job_a, env_a))
        job_b = _submit(b_run, env_b, home)  # the newest line of the index
        jobs.append((job_b, env_b))
        assert cluster_identity(env_a) != cluster_identity(env_b)
        for cwd, env, rd, job in ((a_dir, env_a, a_run, job_a), (b_dir, env_b, b_run, job_b),
                                  (tmp_path, env_a, a_run, job_a)):  # not a checkout's folder: the index alone
            r = _phoenix(["status", "--json"], cwd, env)
            assert r.returncode == 0, r.stderr
            st = json.loads(r.stdout)["job"]
            assert st["run_dir"] == str(rd) and st["job_id"] == job, (cwd, st)
        # the same job id on both clusters (B's first job is 1): the id names this cluster's run
        job_b2 = job_b
        while int(job_b2) < int(job_a) <= int(job_b) + 20:  # B counts up to A's id (each job cancelled at once)
            job_b2 = SlurmClient(env_b).submit(b_run / "job.sbatch", extra_args=[f"--chdir={b_run}", "--hold"])
            SlurmClient(env_b).cancel(job_b2)
        if job_b2 == job_a:
            r = _phoenix(["status", job_a, "--json"], tmp_path, env_a)
            assert r.returncode == 0 and json.loads(r.stdout)["job"]["run_dir"] == str(a_run), r.stderr
        # no job of this cluster in the index: said so, exit 2
        r = _phoenix(["status"], tmp_path, {**env_a, "PHOENIX_HOME": str(tmp_path / "empty")})
        assert r.returncode == 2 and "no PHOENIX job" in r.stderr and "Traceback" not in r.stderr
    finally:
        for job, env in jobs:
            try:
                SlurmClient(env).cancel(job)
            except Exception:  # noqa: BLE001 -- already gone
                pass
        if b is not None:
            lc.down(b_cluster_dir)
        shutil.rmtree(b_cluster_dir, ignore_errors=True)
