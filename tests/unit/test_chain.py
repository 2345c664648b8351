"""Chained runs (resources.chain / --chain): the input checks, the start/end decisions of a job of the chain
(with a recording Slurm client: the queue of the next job and its cancel), and the run's jobs as status
shows them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from phoenix_hpc.cli import chain
from phoenix_hpc.recovery.ckpt_files import mark_complete, step_dir
from phoenix_hpc.status.jobs import run_jobs
from phoenix_hpc.status.render import run_job_line
from test_resume_cli import make_run
from test_submit_cli import GPT_SMALL, assert_bad, in_tmp, invoke, write_cfg  # noqa: F401 -- fixture


# --- bad input ------------------------------------------------------------------------------------------
def test_chain_below_zero_is_refused(in_tmp):  # noqa: F811
    assert_bad(invoke("--site", "local", GPT_SMALL, "--dry-run", "--chain", "-1"), "--chain: -1 is not allowed",
               "greater than or equal to 0")
    cfg = write_cfg(in_tmp, resources={"nodes": 2, "spares": 1, "chain": -2})
    assert_bad(invoke("--site", "local", cfg, "--dry-run"), "resources.chain")


def test_chain_above_the_site_limit_is_refused(in_tmp):  # noqa: F811
    r = invoke("--site", "local", GPT_SMALL, "--dry-run", "--chain", "4")
    assert_bad(r, "resources.chain: 4 is more than site local allows (scheduler.max_chain 3)", "allowed: 0 to 3")
    assert list(in_tmp.iterdir()) == []
    from test_submit_cli import write_cfg

    r = invoke("--site", "local", write_cfg(in_tmp), "--dry-run", "--chain", "3", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["chain"] == 3 and "phoenix_hpc.cli.chain start" in out["script"]


def test_a_chain_that_is_not_an_integer_is_refused(in_tmp):  # noqa: F811
    r = invoke("--site", "local", GPT_SMALL, "--dry-run", "--chain", "two")
    assert r.exit_code == 2 and "--chain" in r.output and "Traceback" not in r.output


# --- start / end ----------------------------------------------------------------------------------------
class RecordingSlurm:
    """Records submit/cancel calls; returns job ids 500, 501, ..."""

    def __init__(self):
        self.calls: list[tuple] = []

    def submit(self, script, extra_args=()):
        self.calls.append(("submit", str(script), list(extra_args)))
        return str(500 + sum(1 for c in self.calls if c[0] == "submit") - 1)

    def cancel(self, job_id, signal=None, batch=False):
        self.calls.append(("cancel", job_id))


def chained_run(tmp: Path, chain_n: int, **kw) -> Path:
    rd = make_run(tmp, **kw)
    cfg = yaml.safe_load((rd / "config.yaml").read_text())
    cfg["resources"]["chain"] = chain_n
    cfg["parallelism"]["dp"] = 2  # as `phoenix submit` writes it (resolved)
    (rd / "config.yaml").write_text(yaml.safe_dump(cfg))
    (rd / "job.json").write_text(json.dumps({"job_id": "123", "site": "local",
                                             "jobs": [{"job_id": "123", "resume_step": None, "chain_index": 0}]}))
    return rd


def test_the_first_job_queues_the_next_after_itself_and_the_chain_stops_at_n(tmp_path):
    rd = chained_run(tmp_path, 1)
    slurm, lines = RecordingSlurm(), []
    assert chain.start(rd, "123", slurm, lines.append) == chain.EXIT_GO
    assert slurm.calls == [("submit", str(rd / "job.sbatch"), ["--dependency=afternotok:123"])]
    jobs = json.loads((rd / "job.json").read_text())["jobs"]
    assert [(j["job_id"], j.get("chain_index"), j.get("after")) for j in jobs] == [("123", 0, None), ("500", 1, "123")]
    # the queued job starts (the first one ended early): it is job 1 of 1, so it queues nothing
    assert chain.start(rd, "500", slurm, lines.append) == chain.EXIT_GO
    assert len(slurm.calls) == 1 and json.loads((rd / "job.json").read_text())["job_id"] == "500"
    assert any("job 1 of 1" in ln and "no complete checkpoint: the training starts over" in ln for ln in lines)
    # a start run twice (a requeued batch script) does not queue a second successor
    assert chain.start(rd, "123", slurm, lines.append) == chain.EXIT_GO and len(slurm.calls) == 1


def test_a_job_sbatched_by_hand_is_recorded_after_the_wait_for_its_entry(tmp_path):
    rd = chained_run(tmp_path, 1)
    slurm = RecordingSlurm()
    assert chain.start(rd, "777", slurm, lambda _: None, wait_s=0.6) == chain.EXIT_GO
    jobs = json.loads((rd / "job.json").read_text())["jobs"]
    assert [j["job_id"] for j in jobs] == ["123", "777", "500"] and jobs[2]["after"] == "777"


def test_a_queued_job_records_the_checkpoint_it_resumes_from(tmp_path):
    rd = chained_run(tmp_path, 2, steps_done=[10, 20])
    slurm = RecordingSlurm()
    chain.start(rd, "123", slurm, lambda _: None)
    chain.start(rd, "500", slurm, lambda _: None)
    jobs = {j["job_id"]: j for j in json.loads((rd / "job.json").read_text())["jobs"]}
    assert jobs["500"]["resume_step"] == 20 and jobs["501"]["after"] == "500" and jobs["501"]["chain_index"] == 2


def test_a_queued_job_of_a_finished_run_does_nothing(tmp_path):
    rd = chained_run(tmp_path, 1, journal=[("job_done", {"step": 50})])
    slurm = RecordingSlurm()
    chain.start(rd, "123", slurm, lambda _: None)
    assert chain.start(rd, "500", slurm, lambda _: None) == chain.EXIT_FINISHED
    assert len(slurm.calls) == 1


def test_a_queued_job_refuses_a_checkpoint_the_grid_cannot_load(tmp_path):
    rd = chained_run(tmp_path, 2, steps_done=[20], dp=4)
    marker = step_dir(rd / "checkpoints", 20) / "complete.json"  # written at pp = 1; the run has pp = 2
    marker.write_text(json.dumps(dict(json.loads(marker.read_text()), grid=[1, 1, 4])))
    slurm, lines = RecordingSlurm(), []
    assert chain.start(rd, "123", slurm, lines.append) == chain.EXIT_BAD
    assert slurm.calls == [] and "written for grid (tp, pp, dp) = (1, 1, 4)" in lines[-1]


def test_a_queued_job_continues_from_a_checkpoint_of_another_dp(tmp_path):
    """A run that shrank (dp 2 -> 1) wrote its newest checkpoint at dp = 1: the next job loads it at dp = 2
    (the torch engine re-partitions the optimizer slices)."""
    rd = chained_run(tmp_path, 2, steps_done=[20], dp=1)
    slurm, lines = RecordingSlurm(), []
    assert chain.start(rd, "123", slurm, lines.append) == chain.EXIT_GO, lines
    assert [c[0] for c in slurm.calls] == ["submit"]


def test_the_end_cancels_the_next_job_only_when_the_run_finished(tmp_path):
    rd = chained_run(tmp_path, 1)
    slurm, lines = RecordingSlurm(), []
    chain.start(rd, "123", slurm, lines.append)
    chain.end(rd, "123", 3, slurm, lines.append)
    assert ("cancel", "500") not in slurm.calls and "job 500 continues the run" in lines[-1]
    chain.end(rd, "123", 0, slurm, lines.append)
    assert slurm.calls[-1] == ("cancel", "500")


def test_a_resume_by_hand_is_refused_while_the_chain_has_a_job_queued(tmp_path):
    rd = chained_run(tmp_path, 1, steps_done=[20])
    chain.start(rd, "123", RecordingSlurm(), lambda _: None)

    class Pending:
        def show_job(self, job_id):
            return {"JobState": "PENDING"}

    from phoenix_hpc.cli.resume import check_resume
    from phoenix_hpc.errors import SubmitError

    with pytest.raises(SubmitError, match="job 500, queued by the chain .* still PENDING: it starts by itself when "
                                          "job 123 ends"):
        check_resume(rd, slurm=Pending())


def test_the_end_message_names_the_queued_job_and_the_resume_command():
    from phoenix_hpc.control.ending import continue_hint

    assert continue_hint("/r", None) == "phoenix submit --resume /r"
    hint = continue_hint("/r un", "77")
    assert "job 77, queued by the chain" in hint and "scancel 77" in hint and "phoenix submit --resume '/r un'" in hint


# --- the run's jobs in status -----------------------------------------------------------------------------
def _rec(ts, event, **f):
    return {"ts": ts, "event": event, **f}


def test_status_jobs_of_a_run_continued_after_a_lost_batch_host():
    entries = [{"job_id": "1", "resume_step": None, "chain_index": 0},
               {"job_id": "2", "resume_step": 20, "chain_index": 1, "after": "1"}]
    records = [_rec(1, "coordinator_started", job_id="1"), _rec(2, "commit", recoverable_step=22),
               _rec(3, "checkpoint", step=20), _rec(4, "progress", step=24, min_step=23),
               _rec(10, "coordinator_started", job_id="2"), _rec(11, "progress", step=30, min_step=30),
               _rec(12, "job_done", step=40, final_hash="h")]
    jobs = run_jobs(entries, records, {"1": {"JobState": "NODE_FAIL", "BatchHost": "n1"},
                                       "2": {"JobState": "COMPLETED", "BatchHost": "n2"}}, {"n1": "DOWN"})
    a, b = jobs
    assert (a.end, a.cause, a.last_step, a.committed_step, a.lost_steps, a.committed_lost_steps) == \
        ("none", "batch-host loss", 24, 22, 4, 2)
    assert (b.end, b.cause, b.resume_step, b.last_step, b.lost_steps) == ("job_done", "finished", 20, 40, None)
    assert run_job_line(a) == "1: submitted, from step 0, reached step 24, ended by batch-host loss, steps lost 4 (committed 2)"
    assert run_job_line(b) == "2: chain 1, after 1, from checkpoint 20, reached step 40, ended by finished"


def test_status_jobs_of_a_time_limit_and_of_a_queued_job():
    entries = [{"job_id": "1", "chain_index": 0}, {"job_id": "2", "chain_index": 1, "after": "1"}]
    records = [_rec(1, "coordinator_started", job_id="1"), _rec(2, "progress", step=17, min_step=17),
               _rec(3, "commit", recoverable_step=16),
               _rec(4, "coordinator_stopped", signal="USR1", checkpoint_step=16)]
    a, b = run_jobs(entries, records, {"1": {"JobState": "FAILED"}, "2": {"JobState": "PENDING"}}, {})
    assert (a.cause, a.signal, a.lost_steps) == ("time limit", "USR1", None)  # the next has not started
    assert b.end == "queued" and "queued (PENDING)" in run_job_line(b)
    # no final record, Slurm ended it normally and its batch host is up: the coordinator was lost
    (c,) = run_jobs([{"job_id": "1"}], records[:3], {"1": {"JobState": "FAILED", "BatchHost": "n1"}}, {"n1": "IDLE"})
    assert c.cause == "coordinator loss"


def test_status_of_a_job_that_lost_its_batch_host_says_so_and_lists_the_queued_job():
    from phoenix_hpc.status.derive import derive_status
    from phoenix_hpc.status.model import RunFiles, SlurmInfo

    records = [_rec(1, "coordinator_started", job_id="1"), _rec(2, "progress", step=14, min_step=14)]
    run = RunFiles(run_dir="/r", job={"job_id": "1", "jobs": [{"job_id": "1", "chain_index": 0},
                                                              {"job_id": "2", "chain_index": 1, "after": "1"}]})
    slurm = SlurmInfo(job={"JobId": "1", "JobState": "NODE_FAIL", "BatchHost": "n1"},
                      nodes={"n1": {"NodeName": "n1", "State": "DOWN*"}}, run_jobs={"2": {"JobState": "PENDING"}})
    st = derive_status(records, slurm, 5.0, run)
    assert st.job.end_cause == "batch-host loss" and st.job.state == "ended"
    assert [(j.job_id, j.end) for j in st.run_jobs] == [("1", "none"), ("2", "queued")]


# --- phoenix drill --kill-batch-host-at ---------------------------------------------------------------------
def test_drill_batch_host_step_and_outcome():
    from phoenix_hpc.errors import FaultError
    from phoenix_hpc.drills.drill import DrillFault, batch_host_outcome, check_batch_host_step

    plan = [DrillFault(0, "crash", "forward", 12, 1)]
    check_batch_host_step(14, 50, plan)
    for bad in (13, 49):
        with pytest.raises(FaultError, match=f"--kill-batch-host-at: {bad} is not allowed: it must be a step from 14 "
                                             ".* to 48"):
            check_batch_host_step(bad, 50, plan)
    entries = [{"job_id": "1", "chain_index": 0}, {"job_id": "2", "chain_index": 1, "after": "1", "resume_step": 10}]
    records = [_rec(1, "coordinator_started", job_id="1"), _rec(2, "progress", step=17, min_step=16),
               _rec(3, "commit", recoverable_step=16), _rec(4, "coordinator_started", job_id="2"),
               _rec(5, "job_done", step=40)]
    jobs = run_jobs(entries, records, {"1": {"JobState": "NODE_FAIL"}, "2": {"JobState": "COMPLETED"}}, {})
    out = batch_host_outcome(jobs, "1", "nid00001", 17)
    assert out["passed"] and (out["next_job_id"], out["resume_step"], out["lost_steps"], out["committed_lost_steps"]) \
        == ("2", 10, 7, 6)
    assert not batch_host_outcome(jobs[:1], "1", "nid00001", 17)["passed"]  # no job continued the run


def test_drill_batch_host_refused_off_the_local_cluster_and_in_its_step_range(in_tmp):  # noqa: F811
    from click.testing import CliRunner

    from phoenix_hpc.cli.main import cli

    r = CliRunner().invoke(cli, ["drill", str(GPT_SMALL), "--site", "local", "--faults", "0",
                                 "--kill-batch-host-at", "60", "--dry-run"])
    assert r.exit_code == 2 and "--kill-batch-host-at: 60 is not allowed" in r.output, r.output
    r = CliRunner().invoke(cli, ["drill", str(GPT_SMALL), "--site", "local", "--faults", "0",
                                 "--kill-batch-host-at", "20", "--dry-run", "--json"])
    assert r.exit_code == 0 and json.loads(r.output) == {"plan": [], "kill_batch_host_at": 20, "mode": "phoenix"}, r.output


def test_a_batch_host_slurm_removed_from_the_job_is_a_batch_host_loss_after_the_node_came_back():
    records = [_rec(1, "coordinator_started", job_id="1"), _rec(2, "progress", step=30, min_step=30)]
    (a,) = run_jobs([{"job_id": "1"}], records, {"1": {"JobState": "CANCELLED", "BatchHost": "nid00001",
                                                      "NodeList": "nid[00002-00003]"}}, {"nid00001": "IDLE"})
    assert a.cause == "batch-host loss"


def test_a_job_whose_coordinator_died_counts_the_steps_its_ranks_logged_after_the_journal_stopped():
    """The journal lags the ranks (progress every few steps) and stops with a killed coordinator: the steps
    the ranks logged inside each job's time window (its started_at to the next job's) count as finished."""
    entries = [{"job_id": "1", "resume_step": None, "started_at": 100.0},
               {"job_id": "2", "resume_step": 10, "after": "1", "started_at": 300.0}]
    records = [{"event": "coordinator_started", "job_id": "1"}, {"event": "progress", "step": 10},
               {"event": "checkpoint", "step": 10},
               {"event": "coordinator_started", "job_id": "2"}, {"event": "job_done", "step": 40}]
    logged = [(101.0 + s, s) for s in range(1, 16)] + [(301.0 + s, s) for s in range(11, 41)]
    a, b = run_jobs(entries, records, {"1": {"JobState": "TIMEOUT", "BatchHost": "n1", "NodeList": "n[2-3]"}},
                    {"n1": "IDLE"}, logged)
    assert (a.last_step, a.lost_steps, a.cause) == (15, 5, "batch-host loss")
    assert (b.last_step, b.end) == (40, "job_done")
    a0, _ = run_jobs(entries, records, {}, {})  # without the ranks' logs: only what the journal says
    assert (a0.last_step, a0.lost_steps) == (10, 0)
