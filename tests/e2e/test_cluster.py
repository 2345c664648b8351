"""The real local Slurm cluster: daemons, topology, batch jobs, fake GPUs, PMIx steps that survive a task's
death, a node that dies under a running job, two clusters at once, and the CLI's refusals."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from phoenix_hpc.slurm import cluster as lc
from phoenix_hpc.slurm import procs
from phoenix_hpc.slurm.run import run_slurm

pytestmark = pytest.mark.cluster

ASSETS = Path(__file__).parent / "assets"
REPO_ROOT = Path(__file__).resolve().parents[2]
PYTHON = REPO_ROOT / ".venv" / "bin" / "python"
PHOENIX = REPO_ROOT / ".venv" / "bin" / "phoenix"
# The tests that name the nodes their tasks run on ask Slurm for exactly these (-w): a node an earlier step
# left COMPLETING is then waited for, not replaced by another free node.
FIRST_FOUR = "nid[00001-00004]"


def job_info(cluster: lc.Cluster, job_id: str) -> dict[str, str]:
    """``scontrol show job -o`` as key -> value (JobState, NodeList, BatchHost, ...)."""
    out = run_slurm(["scontrol", "show", "job", "-o", job_id], env=cluster.env, timeout_s=15).stdout
    return dict(re.findall(r"(\w[\w/:]*)=(\S*)", out))


def wait_job(cluster: lc.Cluster, job_id: str, states: set[str], timeout_s: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    while True:
        info = job_info(cluster, job_id)
        if info.get("JobState") in states:
            return info
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} is {info.get('JobState')}, not in {states} after {timeout_s} s")
        time.sleep(0.3)


def sbatch(cluster: lc.Cluster, script: str, workdir: Path) -> str:
    path = workdir / "job.sh"
    path.write_text(script)
    return run_slurm(["sbatch", "--parsable", f"--chdir={workdir}", str(path)], env=cluster.env,
                     timeout_s=30).stdout.strip().split(";")[0]


def test_nodes_idle_and_switches_shown(slurm_cluster):
    sinfo = run_slurm(["sinfo", "--noheader", "--Node", "--format=%N %T %G %f %c"], env=slurm_cluster.env,
                      timeout_s=15).stdout.split("\n")
    rows = {line.split()[0]: line.split()[1:] for line in sinfo if line.strip()}
    assert sorted(rows) == [f"nid0000{i}" for i in range(1, 7)]
    for node, (state, gres, features, cpus) in rows.items():
        assert (state, gres, features, cpus) == ("idle", "gpu:4", "gpu", "8"), node
    topo = lc.parse_topology(run_slurm(["scontrol", "show", "topology"], env=slurm_cluster.env,
                                       timeout_s=15).stdout)
    by_name = {s["SwitchName"]: s for s in topo}
    assert by_name["leaf0"]["Nodes"] == "nid[00001-00003]"
    assert by_name["leaf1"]["Nodes"] == "nid[00004-00006]"
    assert by_name["spine"]["Switches"] == "leaf[0-1]" and by_name["spine"]["Level"] == "1"


def test_four_node_batch_job_runs(slurm_cluster, tmp_path):
    job = sbatch(slurm_cluster, "#!/bin/bash\n"
                 f"#SBATCH -N 4 -w {FIRST_FOUR} --ntasks-per-node=1 --no-kill --no-requeue -t 00:05:00 -o out.txt\n"
                 "srun --no-kill bash -c 'echo rank=$SLURM_PROCID node=$SLURMD_NODENAME "
                 "addr=$SLURM_TOPOLOGY_ADDR'\n", tmp_path)
    info = wait_job(slurm_cluster, job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"}, 60)
    assert info["JobState"] == "COMPLETED", info
    assert info["Requeue"] == "0"
    lines = sorted((tmp_path / "out.txt").read_text().split())
    ranks = sorted(line for line in lines if line.startswith("rank="))
    nodes = sorted(line for line in lines if line.startswith("node="))
    addrs = sorted(line for line in lines if line.startswith("addr="))
    assert ranks == [f"rank={i}" for i in range(4)]
    assert nodes == [f"node=nid0000{i}" for i in range(1, 5)]
    # topology/tree exports the switch path of each task's node
    assert addrs == [f"addr=spine.leaf{0 if i <= 3 else 1}.nid0000{i}" for i in range(1, 5)]


def test_perlmutter_gpu_flags_run_unchanged(slurm_cluster, tmp_path):
    job = sbatch(slurm_cluster, "#!/bin/bash\n"
                 "#SBATCH -N 2 -C gpu --gpus-per-node=4 --ntasks-per-node=4 --gpu-bind=none -q regular -A x\n"
                 "#SBATCH -t 00:05:00 -o out.txt\n"
                 "srun bash -c 'echo task=$SLURM_PROCID gpus=$SLURM_GPUS_ON_NODE'\n", tmp_path)
    info = wait_job(slurm_cluster, job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, 60)
    assert info["JobState"] == "COMPLETED", info
    assert info["Account"] == "x" and info["Features"] == "gpu" and info["TresPerNode"] == "gres:gpu:4"
    lines = (tmp_path / "out.txt").read_text().split("\n")
    assert sorted(line for line in lines if line) == sorted(f"task={i} gpus=4" for i in range(8))


def test_pmix_step_survives_task_death_and_survivors_use_create_group(slurm_cluster, slurm_env, tmp_path):
    victim, rounds = 2, 20
    proc = subprocess.run(
        ["srun", "-N", "4", "-w", FIRST_FOUR, "--ntasks-per-node=1", "--mpi=pmix", "--no-kill",
         "--kill-on-bad-exit=0",
         "-t", "00:03:00", str(PYTHON), str(ASSETS / "mpi_survivors.py"), str(victim), str(rounds),
         str(tmp_path)],
        env=slurm_env, capture_output=True, text=True, timeout=180)
    started = re.findall(r"STARTED world_rank=(\d) size=4 node=(nid\d+)", proc.stdout)
    assert sorted(started) == [("0", "nid00001"), ("1", "nid00002"), ("2", "nid00003"), ("3", "nid00004")], \
        proc.stdout + proc.stderr
    survivors = re.findall(r"SURVIVOR world_rank=(\d) new_rank=(\d) size=3 rounds=20 sum=(\d+) ring_ok=1",
                           proc.stdout)
    expected_sum = sum(r + rounds - 1 for r in range(4) if r != victim)
    assert sorted(survivors) == [("0", "0", str(expected_sum)), ("1", "1", str(expected_sum)),
                                 ("3", "2", str(expected_sum))], proc.stdout + proc.stderr
    assert "task 2: Killed" in proc.stderr, proc.stderr
    assert "BAD" not in proc.stdout


def test_killed_node_goes_down_and_job_keeps_running(slurm_cluster, tmp_path):
    victim = "nid00004"
    job = sbatch(slurm_cluster, "#!/bin/bash\n"
                 f"#SBATCH -N 4 -w {FIRST_FOUR} --ntasks-per-node=1 --no-kill --no-requeue -t 00:05:00 -o out.txt\n"
                 "srun --no-kill --kill-on-bad-exit=0 bash -c 'echo up $SLURMD_NODENAME; exec sleep 300'\n",
                 tmp_path)
    try:
        info = wait_job(slurm_cluster, job, {"RUNNING"}, 60)
        assert info["NodeList"] == "nid[00001-00004]" and info["BatchHost"] == "nid00001"
        deadline = time.monotonic() + 30  # the step's task on the victim runs
        out = tmp_path / "out.txt"  # created by slurmstepd once the batch step starts, maybe after RUNNING
        while not any(line.endswith(victim) for line in (out.read_text() if out.exists() else "").splitlines()):
            assert time.monotonic() < deadline, "step never started on " + victim
            time.sleep(0.2)
        stepds = lc.node_step_daemons(slurm_cluster, victim)
        assert stepds, "no slurmstepd found for " + victim
        t0 = time.monotonic()
        killed = lc.kill_node(slurm_cluster, victim)
        assert slurm_cluster.daemons[f"slurmd:{victim}"].pid in killed
        assert not any(procs.is_alive(p) for p in stepds)
        state = lc.wait_node_state(slurm_cluster, victim, {"down*", "down"},
                                   timeout_s=slurm_cluster.slurmd_timeout_s + slurm_cluster.message_timeout_s + 20)
        print(f"{victim} DOWN {time.monotonic() - t0:.1f} s after its slurmd was killed")
        assert state in {"down*", "down"}
        info = job_info(slurm_cluster, job)
        assert info["JobState"] == "RUNNING", info
        assert info["NodeList"] == "nid[00001-00003]", info  # Slurm removed the failed node from the job
        others = lc.node_states(slurm_cluster)
        assert {others[n]["state"] for n in ("nid00001", "nid00002", "nid00003")} == {"allocated"}
    finally:
        run_slurm(["scancel", job], env=slurm_cluster.env, timeout_s=15, check=False)
        if not procs.is_alive(slurm_cluster.daemons[f"slurmd:{victim}"]):
            lc.revive_node(slurm_cluster, victim)
    wait_job(slurm_cluster, job, {"CANCELLED"}, 30)
    assert lc.wait_node_state(slurm_cluster, victim, {"idle"}, 30) == "idle"
    for node in ("nid00001", "nid00002", "nid00003"):
        lc.wait_node_state(slurm_cluster, node, {"idle"}, 30)


def test_second_up_in_same_run_dir_is_refused(slurm_cluster):
    before = dict(slurm_cluster.daemons)
    proc = subprocess.run([str(PHOENIX), "cluster", "up", "--run-dir", str(slurm_cluster.run_dir)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "already runs in" in proc.stderr and "nothing started" in proc.stderr
    assert "Traceback" not in proc.stderr
    after = lc.load_cluster(slurm_cluster.run_dir)
    assert after.daemons == before and all(procs.is_alive(p) for p in after.daemons.values())


def test_status_json_lists_nodes_and_switches(slurm_cluster):
    proc = subprocess.run([str(PHOENIX), "cluster", "status", "--json", "--run-dir", str(slurm_cluster.run_dir)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["state"] == "up" and info["env"] == {"SLURM_CONF": str(slurm_cluster.slurm_conf)}
    assert [n["name"] for n in info["nodes"]] == slurm_cluster.nodes
    assert {n["switch"] for n in info["nodes"]} == {"leaf0", "leaf1"}
    assert sorted(s["SwitchName"] for s in info["switches"]) == ["leaf0", "leaf1", "spine"]


def test_second_cluster_runs_beside_and_down_stops_exactly_its_daemons(slurm_cluster, slurm_env,
                                                                      tmp_path_factory):
    run_dir = Path(tempfile.mkdtemp(prefix="phx2-", dir=tempfile.gettempdir()))
    other = None
    try:
        other = lc.up(run_dir, nodes=2, switches=2, gpus_per_node=0)
        assert not set(other.ports) & set(slurm_cluster.ports)
        assert lc.node_states(other) == {"nid00001": {"state": "idle", "reason": ""},
                                         "nid00002": {"state": "idle", "reason": ""}}
        # a job on the second cluster, still running when it is brought down
        work = tmp_path_factory.mktemp("second")
        job = sbatch(other, "#!/bin/bash\n#SBATCH -N 2 -t 00:05:00 -o out.txt\nsrun sleep 300\n", work)
        wait_job(other, job, {"RUNNING"}, 60)
        deadline = time.monotonic() + 30
        while len(lc.node_step_daemons(other)) < 3:  # batch step + one step daemon per node
            assert time.monotonic() < deadline, "steps of the second cluster never started"
            time.sleep(0.2)
        job_procs = lc.node_step_daemons(other)
        report = lc.down(run_dir)
        assert sorted(report["stopped"]) == sorted(other.daemons)
        assert not any(procs.is_alive(p) for p in [*other.daemons.values(), *job_procs])
        other = None
    finally:
        if other is not None:
            lc.down(run_dir)
        shutil.rmtree(run_dir, ignore_errors=True)
    # the session cluster is untouched
    assert all(procs.is_alive(p) for p in slurm_cluster.daemons.values())
    assert {s["state"] for s in lc.node_states(slurm_cluster).values()} == {"idle"}
    assert slurm_env["SLURM_CONF"] == str(slurm_cluster.slurm_conf)


def test_kill_node_with_mark_down_is_down_at_once_and_revives(slurm_cluster):
    """Killed and marked down at once; `phoenix cluster revive` brings it back."""
    from click.testing import CliRunner

    from phoenix_hpc.cli.main import cli

    node = "nid00006"
    t0 = time.monotonic()
    revived = None
    try:
        lc.kill_node(slurm_cluster, node, mark_down_reason="drill: node lost")
        states = lc.node_states(slurm_cluster)
        assert states[node]["state"] in {"down", "down*"} and states[node]["reason"] == "drill: node lost"
        assert time.monotonic() - t0 < slurm_cluster.slurmd_timeout_s  # did not wait for SlurmdTimeout
        revived = CliRunner().invoke(cli, ["cluster", "revive", node, "--run-dir", str(slurm_cluster.run_dir)])
        assert revived.exit_code == 0 and f"{node}: slurmd started again; idle" in revived.output, revived.output
    finally:
        if revived is None or revived.exit_code != 0:
            lc.revive_node(slurm_cluster, node)
    after = lc.load_cluster(slurm_cluster.run_dir)
    assert procs.is_alive(after.daemons[f"slurmd:{node}"])  # the new PID is recorded in cluster.json
    assert lc.node_states(slurm_cluster)[node] == {"state": "idle", "reason": ""}  # ReturnToService=2
