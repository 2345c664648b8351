"""``phoenix drill`` of the in-job checkpoint-restart baseline: which configs and kinds it accepts, the plan
(every fault costs a whole node, expects an in-job restart), the outcome measured from every srun step's
records, and when the job counts as over (drills/in_job.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from phoenix_hpc.cli.main import cli
from phoenix_hpc.drills.drill import DrillFault, DrillOutcome, plan_drill
from phoenix_hpc.drills.in_job import ACTION, IN_JOB_KINDS, drill_mode, match_in_job, restarting, run_over
from phoenix_hpc.status.derive import derive_status
from phoenix_hpc.errors import FaultError

ROOT = Path(__file__).resolve().parents[2]
GPT_SMALL = ROOT / "examples" / "gpt-small.yaml"


def test_drill_mode_takes_phoenix_and_in_job_and_refuses_the_rest_naming_the_fields():
    assert drill_mode(True, "phoenix", "requeue") == "phoenix"
    assert drill_mode(True, "checkpoint-restart", "in-job") == "in-job"
    for args in ((True, "checkpoint-restart", "requeue"), (False, "phoenix", "requeue")):
        with pytest.raises(FaultError, match=r"resilience.checkpoint.restart = in-job \(got enabled=.*, mode="):
            drill_mode(*args)


def test_an_in_job_plan_expects_restarts_costs_a_node_per_fault_and_refuses_other_kinds():
    plan = plan_drill(2, 0, steps=60, world=4, gpus_per_node=2, spare_nodes=2, kinds=IN_JOB_KINDS, in_job=True)
    assert [f.expect for f in plan] == [ACTION, ACTION] and {f.kind for f in plan} <= set(IN_JOB_KINDS)
    # the in-memory protection's phases (d2h, h2h) do not run in this mode
    assert {f.phase for f in plan_drill(3, 1, steps=90, world=4, gpus_per_node=1, spare_nodes=3, kinds=IN_JOB_KINDS,
                                        in_job=True)} <= {"forward", "optimizer"}
    assert all(DrillOutcome(f).expected_action == ACTION for f in plan)
    # a crash keeps its node in a hot swap (one slot), but an in-job restart leaves the node out: 2 nodes, 2 faults
    with pytest.raises(FaultError, match="--faults: 3 is not allowed .* every fault takes one of the job's 2 spare "
                                         r"node\(s\); at most 2"):
        plan_drill(3, 0, steps=60, world=4, gpus_per_node=2, spare_nodes=2, kinds=["crash"], in_job=True)
    assert len(plan_drill(3, 0, steps=60, world=4, gpus_per_node=2, spare_nodes=2, kinds=["crash"])) == 3
    with pytest.raises(FaultError, match="--kinds: 'bogus' is not a fault kind; allowed with .* crash, kill-node, hang"):
        plan_drill(1, 0, steps=60, world=4, gpus_per_node=1, spare_nodes=2, kinds=["bogus"], in_job=True)
    with pytest.raises(FaultError, match="--kinds: names no kind"):
        plan_drill(1, 0, steps=60, world=4, gpus_per_node=1, spare_nodes=2, kinds=[], in_job=True)
    for kind in ("transient", "link-down", "corrupt-replica"):
        with pytest.raises(FaultError, match=f"--kinds: '{kind}' is not allowed with resilience.checkpoint.restart = "
                                             "in-job; allowed: crash, kill-node, hang"):
            plan_drill(1, 0, steps=60, world=4, gpus_per_node=1, spare_nodes=2, kinds=[kind], in_job=True)


def _r(ts, event, **kw):
    return {"ts": ts, "event": event, **kw}


# two srun steps of one Slurm job: a crash landed at step 12 (forward) at t=10, the checkpoint of step 10
RECORDS = [
    _r(1.0, "coordinator_started", job_id="7"), _r(9.0, "progress", step=12, min_step=11),
    _r(10.2, "slots_dead", slots=[1]), _r(10.3, "decision", action="hot_swap"),
    _r(10.4, "restart_in_job", dead_nodes=["nid00002"], checkpoint_step=10), _r(10.5, "coordinator_exit"),
    _r(13.0, "coordinator_started", job_id="7"), _r(14.0, "registered", role="active"),
    _r(15.0, "progress", step=11, min_step=11), _r(16.5, "progress", step=12, min_step=12),
    _r(30.0, "job_done", step=40, final_hash="ab"),
]
FIRED = [{"request_id": "r1", "world_rank": 1, "step": 12, "phase": "forward_backward", "ts": 10.0},
         {"request_id": "other", "world_rank": 0, "step": 20, "phase": "forward", "ts": 20.0}]
RESTARTS = [{"ts": 12.0, "nodes": ["nid00001", "nid00003"], "spares": 0, "checkpoint_step": 10}]


def _outcome():
    out = DrillOutcome(DrillFault(0, "crash", "forward", 12, 1, ACTION))
    out.request_id = "r1"
    return out


def test_an_in_job_outcome_is_measured_over_both_srun_steps():
    out = match_in_job(_outcome(), RECORDS, FIRED, RESTARTS)
    assert out.landed == [{"world_rank": 1, "step": 12, "phase": "forward", "ts": 10.0}]
    assert out.landed_as_requested and out.action == ACTION and out.recovery_state == "done"
    assert out.phases == {"detect": 0.2, "teardown": 1.8, "relaunch": 1.0, "replay": 3.5}
    assert out.total_s == 6.5 and out.detect_s == 0.2
    assert out.steps_replayed == 1  # step 11 was completed, lost with the step, trained again from checkpoint 10
    assert out.passed


def test_an_in_job_outcome_is_pending_until_the_new_step_is_back_at_the_fault_step_and_ignores_later_restarts():
    out = match_in_job(_outcome(), RECORDS[:9], FIRED, RESTARTS)  # the new step reached step 11 only
    assert out.recovery_state == "restarting" and out.total_s is None and not out.passed
    assert set(out.phases) == {"detect", "teardown", "relaunch"}
    out = match_in_job(_outcome(), RECORDS, FIRED, RESTARTS, before_ts=10.4)  # the restart is the next fault's
    assert out.action is None and out.recovery_state is None and out.phases == {}
    no_ck = [dict(r, checkpoint_step=None) if r["event"] == "restart_in_job" else r for r in RECORDS]
    assert match_in_job(_outcome(), no_ck, FIRED, RESTARTS).steps_replayed == 11  # from step 0


def test_an_in_job_run_is_over_only_when_its_end_is_not_a_restart_or_slurm_ended_it():
    first_step = RECORDS[:6]  # the coordinator exited for an in-job restart; the batch script starts the next step
    assert restarting(first_step) and not run_over(True, "RUNNING", restarting(first_step))
    assert run_over(True, "COMPLETED", True)  # e.g. too few nodes left for another step
    assert not run_over(False, "RUNNING", restarting(RECORDS[:9]))
    assert not restarting(RECORDS) and run_over(True, "RUNNING", False) and run_over(True, None, False)
    # the status says whether its own records hold the restart: the first step's end while the next step's
    # coordinator has started but not yet registered (records read then lack the restart, the status of a
    # moment before does not): the drill read the two apart and took the restart for the job's end
    ended = first_step[:-1] + [dict(first_step[-1], job_state="failed")]  # as the coordinator journals it
    st = derive_status(ended, None, now=12.0)
    assert st.finished and st.job.in_job_restart and not run_over(st.finished, "RUNNING", st.job.in_job_restart)
    st = derive_status(ended + RECORDS[6:7], None, now=13.5)  # the next step's coordinator, not registered yet
    assert not st.finished and not st.job.in_job_restart


def _in_job_config(tmp_path: Path, **rz) -> Path:
    cfg = yaml.safe_load(GPT_SMALL.read_text())
    cfg["resilience"].update({"mode": "checkpoint-restart", **rz})
    cfg["resilience"]["checkpoint"] = {**cfg["resilience"].get("checkpoint", {}), "restart": "in-job"}
    p = tmp_path / "in-job.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def test_drill_cli_plans_an_in_job_drill_and_refuses_what_that_mode_cannot_do(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PHOENIX_HOME", str(tmp_path / "home"))
    cfg = _in_job_config(tmp_path)
    r = CliRunner().invoke(cli, ["drill", str(cfg), "--site", "local", "--faults", "2", "--dry-run", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["mode"] == "in-job"
    plan = json.loads(r.output)["plan"]
    assert len(plan) == 2 and {p["kind"] for p in plan} <= set(IN_JOB_KINDS)
    for extra, needle in ((["--kinds", "transient"], "--kinds: 'transient' is not allowed"),
                          (["--faults", "0", "--kill-batch-host-at", "20"], "--kill-batch-host-at: not with"),
                          (["--faults", "3"], "--faults: 3 is not allowed"), (["--kinds", ","], "--kinds: names no")):
        r = CliRunner().invoke(cli, ["drill", str(cfg), "--site", "local", "--dry-run", *extra])
        assert r.exit_code == 2 and needle in r.output and "Traceback" not in r.output, (extra, r.output)
    requeue = yaml.safe_load(cfg.read_text())
    requeue["resilience"]["checkpoint"]["restart"] = "requeue"
    cfg.write_text(yaml.safe_dump(requeue))
    r = CliRunner().invoke(cli, ["drill", str(cfg), "--site", "local", "--dry-run"])
    assert r.exit_code == 2 and "checkpoint.restart='requeue'" in r.output, r.output


def test_the_inject_job_over_probe_reads_only_the_newest_job_and_an_in_job_restart_is_not_an_end(tmp_path):
    from phoenix_hpc.control.journal import Journal
    from phoenix_hpc.drills.inject import job_over_probe

    t = iter(range(1, 100))
    j = Journal(tmp_path, clock=lambda: float(next(t)))
    j.append("coordinator_started", job_id="1")
    j.append("job_done", step=10)
    j.append("coordinator_exit", job_state="done")
    j.append("coordinator_started", job_id="2")  # phoenix submit --resume into the same run directory
    assert job_over_probe(tmp_path)() is None
    j.append("restart_in_job", dead_nodes=["nid00002"], checkpoint_step=10)
    j.append("coordinator_exit", job_state="failed")  # the srun step ends, the batch script starts the next one
    assert job_over_probe(tmp_path)() is None
    j.append("coordinator_started", job_id="2")
    j.append("coordinator_exit", job_state="failed")
    assert job_over_probe(tmp_path)() == "the job's coordinator exited"
