"""`phoenix submit` against the real local Slurm cluster: the generated local script is accepted by sbatch
and its job starts on N+S nodes with --no-kill / --no-requeue."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from phoenix_hpc.config import load_job_config
from phoenix_hpc.slurm.client import SlurmClient
from phoenix_hpc.hostlist import expand

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.cluster


def wait_started(client: SlurmClient, job_id: str, timeout_s: float = 90.0) -> dict[str, str]:
    """The job's scontrol record once it has been given its nodes (RUNNING, or already past it)."""
    deadline = time.monotonic() + timeout_s
    rec: dict[str, str] = {}
    while time.monotonic() < deadline:
        rec = client.show_job(job_id)
        if rec.get("JobState") not in ("PENDING", "CONFIGURING") and rec.get("NodeList") not in (None, "(null)"):
            return rec
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} did not start within {timeout_s} s: {rec}")


def test_generated_local_script_starts_on_all_nodes(slurm_cluster, slurm_env, tmp_path):
    run_dir = tmp_path / "run"
    # the example, with a dataset that exists (submit refuses a missing one; this job is cancelled once started)
    cfg = yaml.safe_load((ROOT / "examples" / "gpt-small.yaml").read_text())
    from phoenix_hpc.data.format import INDEX_HEADER

    (tmp_path / "ds.bin").write_bytes(b"")
    (tmp_path / "ds.idx").write_bytes(INDEX_HEADER + (1).to_bytes(8, "little") + bytes(9))
    cfg["data"]["path"] = str(tmp_path / "ds")
    (tmp_path / "gpt-small.yaml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "phoenix"), "submit", "--site", "local", str(tmp_path / "gpt-small.yaml"),
         "--run-dir", str(run_dir), "--json"],
        env=slurm_env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout)
    job_id = out["job_id"]
    client = SlurmClient(env=slurm_cluster.env)
    try:
        assert (out["nodes"], out["spares"]) == (4, 2)
        # the local site has no node.mem_gb and no node.mttf_h: the host memory is planned, not checked
        assert out["host_memory"]["per_node_gb"] > 0 and out["host_memory"]["budget_gb"] is None
        assert out["node_failures"] is None
        # what was recorded in the run dir
        assert oct((run_dir).stat().st_mode & 0o777) == "0o700"
        cfg = load_job_config(run_dir / "config.yaml")
        assert cfg.parallelism.dp == 2 and cfg.run_dir == str(run_dir) and cfg.resources.gpus_per_node == 1
        assert json.loads((run_dir / "job.json").read_text())["job_id"] == job_id

        rec = wait_started(client, job_id)
        assert rec["NumNodes"] == "6", rec
        nodes = expand(rec["NodeList"])
        assert len(nodes) == 6 and set(nodes) <= set(slurm_cluster.nodes)
        assert rec.get("Requeue") == "0", rec  # --no-requeue
        stored = client.batch_script(job_id)
        assert stored == (run_dir / "job.sbatch").read_text()
        assert "#SBATCH --no-kill" in stored.splitlines() and "#SBATCH --nodes=6" in stored.splitlines()
    finally:
        client.cancel(job_id)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = client.show_job(job_id).get("JobState", "")
            if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
                break
            time.sleep(0.5)
