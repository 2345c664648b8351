"""phoenix status / inject-fault on run directories with synthetic journals: rendering, JSON, plot, and
bad input (exit 2, a message naming the problem, nothing sent to the coordinator).

Slurm is the real client: on this machine without a configured cluster ``scontrol`` fails, so the status
comes from the journal with a one-line "Slurm not reachable" warning."""

from __future__ import annotations

import json
import socket
import types

import pytest
import yaml
from click.testing import CliRunner

from phoenix_hpc.cli.main import cli
from phoenix_hpc.status.runs import record_run
from test_status_derive import CONFIG, done_records, node_loss_records, start_records

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def env(tmp_path, monkeypatch):
    """Isolated home (runs index) and working directory; no Slurm cluster configured."""
    monkeypatch.setenv("PHOENIX_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps tables to the terminal width
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def listener():
    """A TCP socket the coordinator.json points at: a test can prove no connection was made to it."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(4)
    s.setblocking(False)
    yield s
    s.close()


def assert_nothing_sent(listener):
    with pytest.raises(BlockingIOError):
        listener.accept()


def make_run(root, name, records, job_id="424242", port=1, submitted_at=100.0):
    rd = root / "runs" / name
    rd.mkdir(parents=True)
    (rd / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    (rd / "job.json").write_text(json.dumps({"job_id": job_id, "site": "local", "submitted_at": submitted_at}))
    (rd / "journal.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (rd / "coordinator.json").write_text(json.dumps({"host": "127.0.0.1", "port": port, "pid": 1,
                                                     "secret_file": "secret", "protocol": 1}))
    (rd / "secret").write_text("00" * 32)
    return rd


def run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_status_of_running_job_renders_slots_and_replicas(env):
    rd = make_run(env, "a", start_records() + node_loss_records())
    r = run("status", str(rd))
    assert r.exit_code == 0, r.output
    for text in ("424242", "running", "nid00003", "opt/pp0/tp0/dp3", "hot_swap", "replaces world rank 2",
                 "no spare left", "Slurm not reachable; shown from the journal"):
        assert text in r.output



def test_status_json_says_the_next_node_loss_shrinks_a_torch_job_with_no_spare_left(env):
    rd = make_run(env, "a", start_records() + node_loss_records())  # engine torch, spares_exhausted auto
    r = run("status", str(rd), "--json")
    assert r.exit_code == 0, r.output
    (w,) = [w for w in json.loads(r.output)["warnings"] if w["code"] == "no_spares"]
    assert "the next node loss shrinks the job" in w["message"] and "cannot be hot-swapped" not in w["message"]

def test_status_json_and_plot(env):
    rd = make_run(env, "a", start_records() + node_loss_records() + done_records())
    r = run("status", str(rd), "--json", "--plot", str(env / "t.png"))
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["job"]["state"] == "done" and data["job"]["final_hash"] == "abc123"
    assert len(data["slots"]) == 6 and len(data["replicas"]) == 4
    assert data["recoveries"][0]["phases"]["detect"] == 1.25
    assert (env / "t.png").read_bytes()[:8] == PNG_MAGIC


def _this_cluster(env, monkeypatch):
    """The cluster the commands talk to here: the default slurm.conf, whose Slurm answers nothing (no cluster
    is configured; as for a job Slurm forgot). Returns the identity the index records for it."""
    from phoenix_hpc.slurm.identity import cluster_identity

    monkeypatch.delenv("SLURM_CONF", raising=False)
    return cluster_identity()


def test_status_default_is_the_most_recent_job_of_this_cluster(env, monkeypatch):
    here = _this_cluster(env, monkeypatch)
    old = make_run(env / "a", "old", start_records(), job_id="11")
    new = make_run(env / "a", "new", start_records() + done_records(), job_id="12")
    record_run(old, "11", submitted_at=100.0, identity=here)
    record_run(new, "12", submitted_at=200.0, identity=here)
    r = run("status", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["job"]["run_dir"] == str(new)
    # a newer job of another cluster (another checkout's slurm.conf, the same cluster name) is not the default
    other = make_run(env / "elsewhere", "x", start_records(), job_id="12")
    record_run(other, "12", submitted_at=300.0, identity={**here, "slurm_conf": str(env / "other" / "slurm.conf")})
    assert json.loads(run("status", "--json").output)["job"]["run_dir"] == str(new)
    # nor is a job id shared with it: the one of this cluster is meant
    assert json.loads(run("status", "12", "--json").output)["job"]["run_dir"] == str(new)
    # a run under ./runs that records no cluster, which this cluster's Slurm does not confirm, is not either
    make_run(env, "unrecorded", start_records(), job_id="14")
    assert json.loads(run("status", "--json").output)["job"]["run_dir"] == str(new)


def test_no_job_of_this_cluster_is_refused_and_a_live_command_needs_slurm_to_confirm(env, monkeypatch, listener):
    here = _this_cluster(env, monkeypatch)
    mine = make_run(env / "a", "mine", start_records(), job_id="3", port=listener.getsockname()[1])
    other = make_run(env / "b", "theirs", start_records(), job_id="4", port=listener.getsockname()[1])
    record_run(other, "4", submitted_at=300.0, identity={**here, "slurm_conf": "/elsewhere/slurm.conf"})
    r = run("status")
    assert r.exit_code == 2 and "no PHOENIX job of the Slurm cluster" in r.output
    assert "1 recorded for another cluster" in r.output and "Traceback" not in r.output
    record_run(mine, "3", submitted_at=200.0, identity=here)
    assert json.loads(run("status", "--json").output)["job"]["run_dir"] == str(mine)
    # inject-fault and drain act on a running job: Slurm (not reachable here) must confirm the default one
    for cmd in (["inject-fault", "--kind", "crash", "--rank", "0"], ["drain", "--rank", "0"]):
        r = run(*cmd)
        assert r.exit_code == 2 and "no longer known to this cluster's Slurm" in r.output, r.output
    assert_nothing_sent(listener)


def test_judge_default_confirms_by_the_batch_script_of_the_run(tmp_path):
    from phoenix_hpc.status import runs as R

    here = {"slurm_conf": "/c/slurm.conf", "cluster": "phoenix"}
    e = {"job_id": "5", "run_dir": str(tmp_path / "r"), "slurm_conf": "/c/slurm.conf", "cluster": "phoenix"}
    assert R.judge_default(e, here, {"Command": str(tmp_path / "r" / "job.sbatch")}) == R.CONFIRMED
    assert R.judge_default(e, here, {"Command": "/other/run/job.sbatch"}) == R.OTHER_RUN
    assert R.judge_default(e, here, None) == R.REMEMBERED
    assert R.judge_default({**e, "slurm_conf": "/d/slurm.conf"}, here, None) == R.OTHER_CLUSTER
    assert R.judge_default({**e, "cluster": "x"}, here, {"Command": str(tmp_path / "r" / "job.sbatch")}) == R.OTHER_CLUSTER
    unrecorded = {**e, "slurm_conf": None, "cluster": None}
    assert R.judge_default(unrecorded, here, None) == R.UNCONFIRMED
    assert R.judge_default(unrecorded, here, {"Command": str(tmp_path / "r" / "job.sbatch")}) == R.CONFIRMED


def test_identity_reads_the_cluster_name_of_slurm_conf(tmp_path):
    from phoenix_hpc.slurm.identity import cluster_identity, cluster_name

    assert cluster_name("# ClusterName=no\nclustername = a # c\nClusterName=b\n") == "b"
    assert cluster_name("SlurmctldHost=x\n") is None
    (tmp_path / "s.conf").write_text("ClusterName=phx\n")
    assert cluster_identity({"SLURM_CONF": str(tmp_path / "s.conf")}) == {
        "slurm_conf": str((tmp_path / "s.conf").resolve()), "cluster": "phx"}


@pytest.mark.parametrize("args,needle", [
    (["status", "999999"], "JOBID: 999999 is not a known job id"),
    (["status", "not-a-dir"], "RUN_DIR: 'not-a-dir' does not exist"),
])
def test_status_bad_input(env, args, needle):
    r = run(*args)
    assert r.exit_code == 2 and needle in r.output and "Traceback" not in r.output


def test_status_on_foreign_dir(env):
    (env / "foreign").mkdir()
    (env / "foreign" / "config.yaml").write_text("a: 1\n")
    r = run("status", str(env / "foreign"))
    assert r.exit_code == 2 and "is not a PHOENIX run directory" in r.output


def test_status_no_job_at_all(env):
    r = run("status")
    assert r.exit_code == 2 and "no PHOENIX job found" in r.output


def test_status_plot_bad_path(env):
    rd = make_run(env, "a", start_records())
    r = run("status", str(rd), "--plot", str(env / "nope" / "t.png"))
    assert r.exit_code == 2 and "--plot: cannot write" in r.output
    r = run("status", str(rd), "--plot", str(env / "t.jpg"))
    assert r.exit_code == 2 and "must end in .png" in r.output


def test_status_does_not_change_the_run_dir(env):
    rd = make_run(env, "a", start_records())
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in rd.iterdir()}
    assert run("status", str(rd), "--json").exit_code == 0
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in rd.iterdir()} == before


@pytest.mark.parametrize("args,needle", [
    (["--kind", "crash", "--rank", "4"], "--rank: 4 is outside the job; logical ranks are 0..3"),
    (["--kind", "crash", "--rank", "-1"], "--rank: -1 is not allowed; logical ranks start at 0"),
    (["--kind", "crash", "--node", "nid00099"], "--node: 'nid00099' is not a node of job"),
    (["--kind", "crash", "--coord", "0,4,0"], "--coord: (0,4,0) is outside the job's grid"),
    (["--kind", "crash", "--coord", "0,a"], "expected three integers pp,dp,tp"),
    (["--kind", "transient", "--rank", "1", "--phase", "d2h"],
     "--phase: a transient fault cannot land in phase 'd2h'; transient supports forward|h2h|optimizer"),
    (["--kind", "gpu-error", "--rank", "1", "--phase", "h2h"], "gpu-error supports forward|d2h|optimizer|recovery"),
    (["--kind", "crash", "--rank", "1", "--node", "nid00001"], "give exactly one of --rank R, --node NODE"),
    (["--kind", "crash"], "give exactly one of"),
    (["--kind", "crash", "--rank", "1", "--at-step", "3"], "--at-step: step 3 is already done (the job is at step 6)"),
    (["--kind", "crash", "--rank", "1", "--at-step", "21"], "beyond the job's last step (training.steps = 20)"),
    (["--kind", "crash", "--node", "nid00003"], "holds only standby slots"),
    (["--kind", "meteor", "--rank", "1"], "Invalid value for '--kind'"),
    (["--kind", "crash", "--rank", "1", "--phase", "backward"], "Invalid value for '--phase'"),
])
def test_inject_bad_input_sends_nothing(env, listener, args, needle):
    rd = make_run(env, "a", start_records(), port=listener.getsockname()[1])
    journal = (rd / "journal.jsonl").read_bytes()
    r = run("inject-fault", str(rd), *args)
    assert r.exit_code == 2, r.output
    assert needle in r.output and "Traceback" not in r.output
    assert_nothing_sent(listener)
    assert (rd / "journal.jsonl").read_bytes() == journal


def test_inject_into_finished_job(env, listener):
    rd = make_run(env, "a", start_records() + done_records(), port=listener.getsockname()[1])
    r = run("inject-fault", str(rd), "--kind", "crash", "--rank", "0")
    assert r.exit_code == 2 and "is done" in r.output and "nothing was sent" in r.output
    assert_nothing_sent(listener)


def test_inject_into_dead_rank_slot(env, listener):
    rd = make_run(env, "a", start_records() + node_loss_records()[:1], port=listener.getsockname()[1])
    r = run("inject-fault", str(rd), "--kind", "hang", "--node", "nid00002")
    assert r.exit_code == 2 and "nid00002 has no live slot" in r.output
    assert_nothing_sent(listener)


def test_inject_unknown_job(env):
    r = run("inject-fault", "999999", "--kind", "crash", "--rank", "0")
    assert r.exit_code == 2 and "JOBID: 999999 is not a known job id" in r.output


def test_ambiguous_job_id_is_refused_listing_the_candidates(env):
    # job ids restart at 1 on every `phoenix cluster up`: two runs recorded with job id 1
    a = make_run(env, "first", start_records() + done_records(), job_id="1", submitted_at=100.0)
    b = make_run(env, "second", start_records(), job_id="1", submitted_at=200.0)
    r = run("status", "1")
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "JOBID: 1 names 2 runs" in r.output and str(a) in r.output and str(b) in r.output
    assert json.loads(run("status", str(b), "--json").output)["job"]["run_dir"] == str(b)  # a run dir is exact


def test_slurm_not_reachable_is_one_line(env):
    make_run(env, "r", start_records(), job_id="5")
    d = json.loads(run("status", "5", "--json").output)
    (w,) = [w for w in d["warnings"] if w["code"] == "slurm"]
    assert w["message"] == "Slurm not reachable; shown from the journal"


def test_watch_into_a_pipe_prints_a_line_per_change_then_the_full_view(env, monkeypatch):
    import phoenix_hpc.cli.status as status_cli

    recs = start_records()[:-1] + [{"ts": 2.5, "event": "progress", "step": 3, "min_step": 3, "generation": 0}]
    rd = make_run(env, "w", recs, job_id="31")
    later = [[{"ts": 4.0, "event": "progress", "step": 9, "min_step": 8, "generation": 0}], done_records()]

    def sleep(_s):  # the job moves on while the watcher waits
        with (rd / "journal.jsonl").open("a") as f:
            f.write("".join(json.dumps(r) + "\n" for r in later.pop(0)))

    monkeypatch.setattr(status_cli, "time", types.SimpleNamespace(sleep=sleep))  # only the watch loop's sleep
    r = run("status", str(rd), "--watch", "--interval-s", "0.2")  # CliRunner's stdout is not a terminal
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    progress = [line for line in lines if line.startswith("t+")]
    assert [next(p for p in line.split("  ") if p.startswith("step ")) for line in progress] == [
        "step 3/20", "step 9/20", "step 20/20"]
    assert "running" in progress[0] and "done" in progress[-1]
    assert any(line.startswith("job") and "31" in line for line in lines)  # the full view at the end


def test_line_progress_prints_stage_changes_and_paced_progress():
    from phoenix_hpc.cli.output import LineProgress

    out, now = [], [0.0]
    lp = LineProgress(out.append, every_s=5.0, clock=lambda: now[0])
    for t, desc, step in [(0, "reference", 1), (1, "reference", 2), (6, "reference", 9), (7, "starting", None),
                          (8, "fault 1/3: crash @ forward", 12), (20, "fault 1/3: crash @ forward", 12)]:
        now[0] = t
        lp.update(desc, step, 50)
    assert out == ["reference: step 1/50", "reference: step 9/50", "starting: step -/50",
                   "fault 1/3: crash @ forward: step 12/50"]
