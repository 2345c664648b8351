"""`phoenix submit --resume RUN_DIR` bad input: exit code 2 naming the reason, nothing submitted, nothing
changed in the run directory."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from phoenix_hpc.recovery.ckpt_files import mark_complete, step_dir
from test_submit_cli import assert_bad, fake_dataset, invoke, write_cfg


def make_run(tmp: Path, journal=(), steps_done=(), dp=2) -> Path:
    """A run directory as `phoenix submit` and a stopped job leave it (config, job.json, journal,
    checkpoints of ``steps_done`` with one shard per DP rank)."""
    import hashlib

    cfg = yaml.safe_load(write_cfg(tmp, data={"path": str(fake_dataset(tmp))}).read_text())
    rd = tmp / "run"
    rd.mkdir()
    (rd / "config.yaml").write_text(yaml.safe_dump(cfg))
    (rd / "job.json").write_text(json.dumps({"job_id": "123", "site": "local"}))
    (rd / "journal.jsonl").write_text("".join(json.dumps({"ts": 1.0, "event": e, **f}) + "\n" for e, f in journal))
    grid = [cfg["parallelism"].get("tp", 1), cfg["parallelism"].get("pp", 1), dp]
    for s in steps_done:
        files = {}
        for d in range(dp):
            name = f"pp0-tp0-dp{d}.pt"
            (step_dir(rd / "checkpoints", s)).mkdir(parents=True, exist_ok=True)
            (step_dir(rd / "checkpoints", s) / name).write_bytes(b"shard %d" % d)
            files[name] = {"sha256": hashlib.sha256(b"shard %d" % d).hexdigest(), "bytes": 7}
        mark_complete(rd / "checkpoints", s, "snapshot", grid=grid, files=files)
    return rd


def _snapshot(rd: Path) -> dict:
    return {p.name: p.read_bytes() for p in rd.iterdir() if p.is_file()}


def test_resume_refuses_what_is_not_a_run_dir(tmp_path):
    (tmp_path / "empty").mkdir()
    assert_bad(invoke("--resume", tmp_path / "empty"), "is not a run directory")


def test_resume_refuses_a_finished_run(tmp_path):
    rd = make_run(tmp_path, journal=[("job_done", {"step": 50})], steps_done=[20])
    before = _snapshot(rd)
    assert_bad(invoke("--resume", rd), "finished (job_done at step 50)", "nothing to resume")
    assert _snapshot(rd) == before


def test_resume_refuses_a_run_without_a_complete_checkpoint(tmp_path):
    rd = make_run(tmp_path)
    (step_dir(rd / "checkpoints", 30)).mkdir(parents=True)  # written, never marked complete
    assert_bad(invoke("--resume", rd), "no complete checkpoint", "incomplete: step_00000030")


def test_resume_refuses_a_corrupt_checkpoint(tmp_path):
    rd = make_run(tmp_path, steps_done=[20])
    (step_dir(rd / "checkpoints", 20) / "pp0-tp0-dp1.pt").write_bytes(b"shard X")
    assert_bad(invoke("--resume", rd), "cannot be loaded", "pp0-tp0-dp1.pt fails its SHA-256 check")
    (step_dir(rd / "checkpoints", 20) / "pp0-tp0-dp1.pt").unlink()
    assert_bad(invoke("--resume", rd), "pp0-tp0-dp1.pt is missing")


def test_resume_refuses_a_config_whose_grid_cannot_load_the_checkpoint(tmp_path):
    rd = make_run(tmp_path, steps_done=[20], dp=4)
    marker = step_dir(rd / "checkpoints", 20) / "complete.json"  # written by a pp=1 grid; the config has pp=2
    marker.write_text(json.dumps(dict(json.loads(marker.read_text()), grid=[1, 1, 4])))
    assert_bad(invoke("--resume", rd), "written for grid (tp, pp, dp) = (1, 1, 4)",
               "tp and pp must be those of the checkpoint (1, 1)")


def test_resume_refuses_run_dir_and_a_missing_site_or_config(tmp_path):
    rd = make_run(tmp_path, steps_done=[20])
    assert_bad(invoke("--resume", rd, "--run-dir", tmp_path / "x"), "--run-dir: not allowed with --resume")
    assert_bad(invoke(), "--site: missing")
    assert_bad(invoke("--site", "local"), "CONFIG: missing")


def test_a_coordinator_timeout_not_above_the_heartbeat_timeout_is_refused(tmp_path):
    cfg = write_cfg(tmp_path, data={"path": str(fake_dataset(tmp_path))},
                    resilience={"heartbeat_timeout_s": 4.0, "coordinator_timeout_s": 4.0})
    assert_bad(invoke("--site", "local", cfg, "--dry-run"),
               "resilience.coordinator_timeout_s: value 4.0 -- must be more than resilience.heartbeat_timeout_s (4.0)")


class _Slurm:
    """show_job answers the states given, one per call (the last repeats)."""

    def __init__(self, *states):
        self.states, self.calls = list(states), 0

    def show_job(self, job_id):
        self.calls += 1
        return {"JobState": self.states[min(self.calls, len(self.states)) - 1]}


def test_coordinator_ended_reads_the_last_coordinator_record():
    from phoenix_hpc.cli.resume import coordinator_ended

    assert not coordinator_ended([])
    assert not coordinator_ended([{"event": "coordinator_started"}, {"event": "commit"}])
    assert coordinator_ended([{"event": "coordinator_started"}, {"event": "coordinator_exit"}])
    assert not coordinator_ended([{"event": "coordinator_exit"}, {"event": "coordinator_started"}])


def test_a_job_whose_coordinator_ended_is_waited_for_and_one_that_keeps_running_is_refused(capsys):
    from phoenix_hpc.cli.resume import wait_for_end

    now = [0.0]
    tick = lambda s: now.__setitem__(0, now[0] + s)  # noqa: E731
    ending = _Slurm("RUNNING", "COMPLETING", "COMPLETED")
    assert wait_for_end(ending, "7", "RUNNING", wait_s=90, clock=lambda: now[0], sleep=tick) == "COMPLETED"
    assert ending.calls == 3 and now[0] == 3.0
    assert "job 7 has ended its training" in capsys.readouterr().err
    now[0] = 0.0
    stuck = _Slurm("RUNNING")
    assert wait_for_end(stuck, "8", "RUNNING", wait_s=5, clock=lambda: now[0], sleep=tick) == "RUNNING"
    assert now[0] == 5.0


def test_a_second_resume_while_the_first_resumed_job_starts_is_refused_at_once_with_the_true_reason(tmp_path):
    """The journal's last coordinator record is the stopped job's ``coordinator_exit``; the resumed job 124
    is queued (its coordinator has not started): it is not "finishing", and nothing waits for it."""
    import pytest

    from phoenix_hpc.cli.resume import check_resume, coordinator_ended
    from phoenix_hpc.errors import SubmitError

    journal = [("coordinator_started", {"job_id": "123"}), ("commit", {"recoverable_step": 20}),
               ("coordinator_exit", {"job_state": "stopped"})]
    rd = make_run(tmp_path, journal=journal, steps_done=[20])
    (rd / "job.json").write_text(json.dumps({"job_id": "124", "site": "local", "jobs": [
        {"job_id": "123", "resume_step": None}, {"job_id": "124", "resume_step": 20}]}))
    records = [{"event": e, **f} for e, f in journal]
    assert coordinator_ended(records) and not coordinator_ended(records, "124") and coordinator_ended(records, "123")
    for state in ("PENDING", "RUNNING"):
        slurm = _Slurm(state)
        with pytest.raises(SubmitError) as e:
            check_resume(rd, slurm=slurm)
        assert slurm.calls == 1  # asked once, no wait
        msg = str(e.value)
        assert f"job 124, the resume of this run from step 20, is {state} and has not started training" in msg
        assert "scancel 124" in msg and "finishing" not in msg


def test_resume_without_run_dir_takes_the_most_recent_job_of_this_cluster(tmp_path, monkeypatch):
    from phoenix_hpc.slurm.identity import cluster_identity
    from phoenix_hpc.status.runs import record_run

    monkeypatch.setenv("PHOENIX_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SLURM_CONF", raising=False)  # no Slurm answers here: the run is one it forgot
    rd = make_run(tmp_path, journal=[("job_done", {"step": 50})], steps_done=[20])
    assert_bad(invoke("--resume", "--site", "local"), "--resume: no PHOENIX job found")
    other = {**cluster_identity(), "slurm_conf": "/elsewhere/slurm.conf"}
    record_run(rd, "123", submitted_at=100.0, identity=other)  # another cluster's run is not meant
    assert_bad(invoke("--resume", "--site", "local"), "--resume: no PHOENIX job of the Slurm cluster",
               "1 recorded for another cluster")
    record_run(rd, "123", submitted_at=200.0)  # this cluster's
    r = invoke("--resume", "--site", "local")
    assert_bad(r, f"--resume: the most recent job of this cluster: {rd}", f"the run in {rd} finished")
