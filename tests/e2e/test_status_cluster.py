"""``phoenix status`` on the real local Slurm cluster: Slurm state, live node list, node states and failure
domains of a running job whose batch script runs the real coordinator; the batch host dies -> the warning
offers ``--cancel``; ``--cancel --yes`` cancels; the ended job's status still renders."""

from __future__ import annotations

import json
import shlex
import sys
import time

import pytest
import yaml
from click.testing import CliRunner

from phoenix_hpc.cli.main import cli
from phoenix_hpc.slurm import cluster as lc
from phoenix_hpc.slurm import procs
from phoenix_hpc.slurm.run import run_slurm
from phoenix_hpc.status.runs import record_run
from functools import partial
from waiting import wait_for

pytestmark = pytest.mark.cluster

CONFIG = {"name": "status-e2e", "data": {"path": "data/none"}, "parallelism": {"tp": 1, "pp": 1, "dp": 3},
          "training": {"steps": 10}, "resilience": {"k": 1, "placement_levels": ["node", "switch"]},
          "resources": {"nodes": 3, "spares": 1, "gpus_per_node": 1}}


_wait = partial(wait_for, poll_s=0.3)

def status_json(*args):
    r = CliRunner().invoke(cli, ["status", *args, "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_status_of_a_live_job_then_its_batch_host_dies(slurm_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("PHOENIX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "200")
    for k, v in slurm_cluster.env.items():
        monkeypatch.setenv(k, v)
    rd = tmp_path / "run"
    rd.mkdir()
    (rd / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    script = rd / "job.sbatch"
    script.write_text(  # -w: these nodes (asserted below), once an earlier test's job has left them
        "#!/bin/bash\n#SBATCH -N 4 -w nid[00001-00004] --ntasks-per-node=1 --no-kill --no-requeue -t 00:05:00 "
        "-o out.txt\n"
        f"{shlex.quote(sys.executable)} -m phoenix_hpc.control.coordinator --run-dir {shlex.quote(str(rd))} "
        "--host 127.0.0.1 &\n"
        "srun --no-kill --kill-on-bad-exit=0 sleep 300\n")
    job = run_slurm(["sbatch", "--parsable", f"--chdir={rd}", str(script)], env=slurm_cluster.env,
                    timeout_s=30).stdout.strip().split(";")[0]
    (rd / "job.json").write_text(json.dumps({"job_id": job, "site": "local", "submitted_at": time.time()}))
    record_run(rd, job)
    victim = None
    try:
        _wait(lambda: (rd / "coordinator.json").exists(), 90, "the coordinator of the batch script")
        st = status_json(job)
        assert st["job"]["job_id"] == job and st["job"]["slurm_state"] == "RUNNING"
        assert st["job"]["run_dir"] == str(rd)
        assert st["job"]["node_list"] == ["nid00001", "nid00002", "nid00003", "nid00004"]
        victim = st["job"]["batch_host"]
        assert victim == "nid00001" and st["job"]["coordinator"]["pid"] > 0
        nodes = {n["name"]: n for n in st["nodes"]}
        assert {n["slurm_state"] for n in nodes.values()} == {"ALLOCATED"}
        assert nodes["nid00004"]["domain"] == "switch:leaf1" and nodes["nid00001"]["domain"] == "switch:leaf0"
        assert [w["code"] for w in st["warnings"]] == []
        assert st["job"]["state"] == "starting"  # coordinator up, no slot registered (nothing runs ranks here)

        lc.kill_node(slurm_cluster, victim, mark_down_reason="status test: batch host lost")
        st = status_json()  # default: the most recent job
        assert st["job"]["job_id"] == job and st["job"]["slurm_state"] == "RUNNING"
        (w,) = [w for w in st["warnings"] if w["code"] == "batch_host_down"]
        assert victim in w["message"] and w["action"] == f"phoenix status {job} --cancel"
        human = CliRunner().invoke(cli, ["status", job], catch_exceptions=False)
        assert human.exit_code == 0 and f"phoenix status {job} --cancel" in human.output

        r = CliRunner().invoke(cli, ["status", job, "--cancel", "--yes"], catch_exceptions=False)
        assert r.exit_code == 0 and f"cancelled job {job}" in r.output
        _wait(lambda: status_json(job)["job"]["slurm_state"] not in ("RUNNING", "COMPLETING"), 60, "cancel")
        st = status_json(job)
        assert st["job"]["slurm_state"] == "CANCELLED" and st["job"]["state"] == "ended"
        assert "coordinator_gone" in [w["code"] for w in st["warnings"]]
        plot = tmp_path / "t.png"
        CliRunner().invoke(cli, ["status", job, "--plot", str(plot)], catch_exceptions=False)
        assert plot.stat().st_size > 0
    finally:
        run_slurm(["scancel", job], env=slurm_cluster.env, timeout_s=15, check=False)
        if victim and not procs.is_alive(slurm_cluster.daemons[f"slurmd:{victim}"]):
            lc.revive_node(slurm_cluster, victim)
    for node in ("nid00001", "nid00002", "nid00003", "nid00004"):
        lc.wait_node_state(slurm_cluster, node, {"idle"}, 60)
