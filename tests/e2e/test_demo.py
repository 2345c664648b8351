"""The README's first command, ``scripts/demo.sh``, in a reduced form (fewer steps) on its own local cluster.

It runs the real script (set-up check, ``phoenix demo``: its own 6-node Slurm cluster, a stdlib dataset,
the fault-free reference, the same job with a node killed mid-run through ``phoenix inject-fault``,
``phoenix status``, the report, ``phoenix cluster down``) and checks, from the run directories themselves
rather than from the demo's words: both jobs ended with ``job_done`` and the same final hash; the killed
node's slot was declared dead and a spare slot took its logical rank; ``recovery_done`` has every phase and
replayed at most one step; the timeline PNG exists; and no process of the demo's cluster survives. A second
test interrupts a demo with Ctrl-C (SIGINT to its process group, as a terminal does) and checks that the
cluster is stopped all the same.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from phoenix_hpc.control.journal import read_journal
from phoenix_hpc.slurm import cluster as lc

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "scripts" / "demo.sh"
STEPS = 12
PHASES = {"detect", "reconfigure", "params", "optimizer", "replay"}

pytestmark = pytest.mark.cluster


@pytest.fixture
def cluster_dir():
    # Unix socket paths under a cluster's run directory are limited: a short folder, like the session cluster.
    d = Path(tempfile.mkdtemp(prefix="phx-demo-", dir=tempfile.gettempdir()))
    yield d
    try:  # only if the demo failed to stop its own cluster (the test then fails on its own check)
        if lc.load_cluster(d).alive_daemons():
            lc.down(d)
    except Exception:  # noqa: BLE001 - no cluster.json: nothing of ours runs
        pass
    shutil.rmtree(d, ignore_errors=True)


def _config(tmp: Path) -> Path:
    """examples/gpt-small.yaml with its dataset in the test's folder (the demo builds it there)."""
    cfg = yaml.safe_load((ROOT / "examples" / "gpt-small.yaml").read_text())
    cfg["data"]["path"] = str(tmp / "data" / "stdlib")
    path = tmp / "gpt-small.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PHOENIX_HOME"] = str(tmp / "home")  # the runs index of this test, not the user's
    for k in ("SLURM_CONF", lc.RUN_DIR_ENV, "COLUMNS"):
        env.pop(k, None)
    return env


def _no_cluster_processes(cdir: Path) -> None:
    cluster = lc.load_cluster(cdir)
    assert cluster.state == "stopped"
    assert not cluster.alive_daemons(), f"daemons left running: {cluster.alive_daemons()}"
    assert not lc.node_step_daemons(cluster), "slurmstepd processes left running"


def test_demo_script_reduced_run_kills_a_node_and_ends_in_the_fault_free_state(tmp_path, cluster_dir):
    work = tmp_path / "w"
    args = [str(DEMO), "--config", str(_config(tmp_path)), "--steps", str(STEPS), "--work-dir", str(work),
            "--cluster-dir", str(cluster_dir), "--max-bytes", "300000", "--timeout-s", "300"]
    t0 = time.monotonic()
    proc = subprocess.run(args, cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=900)
    wall_s = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]

    (base,) = (work / "runs").iterdir()
    ref = read_journal(base / "reference")
    flt = read_journal(base / "node-loss")
    (ref_done,) = [r for r in ref if r["event"] == "job_done"]
    (flt_done,) = [r for r in flt if r["event"] == "job_done"]
    assert ref_done["step"] == flt_done["step"] == STEPS
    assert re.fullmatch(r"[0-9a-f]{64}", ref_done["final_hash"])
    assert flt_done["final_hash"] == ref_done["final_hash"]
    assert not [r for r in ref if r["event"] in ("slots_dead", "recovery_start")]

    # The fault: a kill-node injected mid-run, the node's slot dead, a spare slot in its logical rank.
    (inj,) = [r for r in flt if r["event"] == "inject_forwarded"]
    victim = inj["target"]["node"]
    assert inj["kind"] == "node_loss" and 2 <= inj["at_step"] < STEPS
    dead = [r for r in flt if r["event"] == "slots_dead"]
    assert dead and dead[0]["nodes"] == [victim]
    (plan,) = [r for r in flt if r["event"] == "recovery_plan"]
    (join,) = plan["joins"]
    assert join["node"] != victim and join["logical_rank"] == 1
    spare = json.loads((base / "node-loss" / "ranks" / f"rank{join['logical_rank']}.json").read_text())
    assert spare["joined"] and spare["world_rank"] == join["world_rank"] and spare["status"] == "done"
    (rec,) = [r for r in flt if r["event"] == "recovery_done"]
    assert rec["action"] == "hot_swap" and rec["steps_replayed"] <= 1 and set(rec["phases"]) == PHASES

    # What the demo printed agrees with the files, and it left the picture and the report.
    assert f"reference                 {ref_done['final_hash']}" in out
    assert f"node-loss run             {flt_done['final_hash']}" in out
    assert "identical final state       YES" in out and "PASSED" in out
    assert f"steps replayed              {rec['steps_replayed']}" in out
    for phase in PHASES:
        assert re.search(rf"^  {phase}\s+{rec['phases'][phase]:.2f} s$", out, re.M), phase
    assert f"$ phoenix inject-fault" in out and "$ phoenix status" in out
    png = base / "timeline.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and str(png) in out
    assert (base / "report.txt").read_text().strip() in out.replace("\r", "")
    _no_cluster_processes(cluster_dir)
    print(f"reduced demo ({STEPS} steps): {wall_s:.0f} s; recovery {rec['total_s']} s {rec['phases']}")


def test_ctrl_c_stops_the_demo_and_its_cluster(tmp_path, cluster_dir):
    work = tmp_path / "w"
    args = [str(DEMO), "--config", str(_config(tmp_path)), "--steps", str(STEPS), "--work-dir", str(work),
            "--cluster-dir", str(cluster_dir), "--max-bytes", "300000"]
    # SIGINT as a terminal's shell leaves it (default): a test run started in the background inherits SIGINT
    # ignored (bash does that to asynchronous commands), and an ignored SIGINT stays ignored across exec
    proc = subprocess.Popen(args, cwd=ROOT, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = []
    try:
        deadline = time.monotonic() + 300
        for line in proc.stdout:  # wait until the reference job is in Slurm, then press Ctrl-C
            lines.append(line)
            if line.startswith("job id") or time.monotonic() > deadline:
                break
        assert any(line.startswith("job id") for line in lines), "".join(lines)[-3000:]
        os.killpg(proc.pid, signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = "".join(lines) + rest
    assert proc.returncode == 130, out[-3000:]
    assert "$ phoenix cluster down" in out and "interrupted" in out
    _no_cluster_processes(cluster_dir)
