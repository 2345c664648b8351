"""The demo's pure parts: run summary, comparison and report; fault step, victim node, derived config, each
run's own folders, cluster folder; and its refusals of bad options (exit 2 before anything starts)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from click.testing import CliRunner

from phoenix_hpc.cli.main import cli
from phoenix_hpc.config.load import load_job_config
from phoenix_hpc.drills.folders import run_folders
from phoenix_hpc.demo.report import compare, final_loss, format_report, summarize_run
from phoenix_hpc.demo.run import (NODE_LOSS, REFERENCE, Demo, DemoOptions, default_cluster_dir, derived_config,
                                  fault_step, outside_run_dir, pick_victim, run_configs)
from phoenix_hpc.errors import DemoError

ROOT = Path(__file__).resolve().parents[2]
H1, H2 = "a" * 64, "b" * 64


def _rank(r, pp, dp, loss, status="done"):
    return {"rank": r, "coord": {"pp": pp, "dp": dp, "tp": 0}, "grid": {"tp": 1, "pp": 2, "dp": 2},
            "status": status, "final_loss": loss}


RANKS = [_rank(0, 0, 0, None), _rank(1, 0, 1, None), _rank(2, 1, 0, 2.0), _rank(3, 1, 1, 3.0)]


def _records(final_hash=H1, fault=False, end="job_done"):
    recs = [{"ts": 100.0, "event": "coordinator_started"}]
    if fault:
        recs += [
            {"ts": 110.0, "event": "inject_forwarded", "kind": "node_loss", "phase": "forward_backward",
             "at_step": 6, "targets": [1], "target": {"node": "nid00002"}, "request_id": "r1"},
            {"ts": 121.0, "event": "slots_dead", "slots": [1], "nodes": ["nid00002"], "kind": "heartbeat_timeout",
             "reason": "heartbeat timeout"},
            {"ts": 125.0, "event": "recovery_plan", "joins": [{"world_rank": 4, "node": "nid00005",
                                                               "logical_rank": 1, "coord": [0, 1, 0]}],
             "transfers": [{"kind": "params", "shard_id": "param/pp0/tp0", "sender": 0, "receiver": 4, "step": 4},
                           {"kind": "optimizer", "shard_id": "opt/pp0/tp0/dp1", "sender": 0, "receiver": 4,
                            "step": 4}]},
            {"ts": 130.0, "event": "recovery_done", "generation": 1, "action": "hot_swap", "total_s": 20.0,
             "phases": {"detect": 10.0, "reconfigure": 3.0, "params": 2.0, "optimizer": 2.5, "replay": 0.5},
             "steps_replayed": 1, "recoverable_step": 4},
        ]
    recs.append({"ts": 150.0, "event": end, "step": 12, **({"final_hash": final_hash} if end == "job_done" else {})})
    return recs


FIRED = [{"ts": 111.0, "request_id": "r1", "world_rank": 1, "step": 6, "phase": "forward_backward"}]


def test_final_loss_is_the_mean_over_the_last_stage_and_skips_unfinished_ranks():
    assert final_loss(RANKS) == (2.5, [2, 3])
    assert final_loss([*RANKS[:3], _rank(3, 1, 1, 9.0, status="failed")]) == (2.0, [2])
    assert final_loss([]) == (None, [])


def test_identical_hashes_after_a_recovery_pass_and_the_report_shows_everything():
    ref = summarize_run("/r/ref", "1", _records(), RANKS)
    flt = summarize_run("/r/flt", "2", _records(fault=True), RANKS, FIRED)
    v = compare(ref, flt)
    assert v.identical and v.recovered and v.passed and not v.problems
    assert flt.wall_s == 50.0 and flt.steps == 12 and flt.joins[0]["world_rank"] == 4
    text = format_report(ref, flt, v, timeline="/r/timeline.png", demo_wall_s=200.0)
    assert text.count(H1) == 2 and "YES" in text and "PASSED" in text
    for needle in ("kill-node on node nid00002 at step 6, phase forward", "world rank 1 died at step 6",
                   "spare world rank 4 on nid00005 became logical rank 1", "optimizer shard opt/pp0/tp0/dp1",
                   "detect                    10.00 s", "replay                    0.50 s",
                   "(quiesce and other)       2.00 s", "steps replayed              1", "/r/timeline.png",
                   "final loss (ranks 2,3)      2.500000"):
        assert needle in text, needle


def test_different_hashes_fail_and_name_both():
    ref = summarize_run("/r/ref", "1", _records(H1), RANKS)
    flt = summarize_run("/r/flt", "2", _records(H2, fault=True), RANKS)
    v = compare(ref, flt)
    assert not v.identical and not v.passed
    assert any(H1 in p and H2 in p for p in v.problems)
    text = format_report(ref, flt, v, timeline=None)
    assert "FAILED" in text and "identical final state       NO" in text


def test_a_run_without_job_done_or_without_a_recovery_fails():
    ref = summarize_run("/r/ref", "1", _records(), RANKS)
    v = compare(ref, summarize_run("/r/flt", "2", _records(fault=True, end="fallback"), RANKS))
    assert not v.passed and any("did not finish" in p for p in v.problems)
    v = compare(ref, summarize_run("/r/flt", "2", _records(), RANKS))  # no fault landed: equal hash, no recovery
    assert v.identical and not v.passed and any("did not land" in p for p in v.problems)


def test_fault_step_defaults_to_mid_run_and_stays_ahead_of_the_job():
    assert fault_step(50, None, None) == 25
    assert fault_step(50, None, 30) == 32
    assert fault_step(50, 10, 3) == 10
    for requested in (1, 50, 0):
        with pytest.raises(DemoError, match="--at-step"):
            fault_step(50, requested, None)
    with pytest.raises(DemoError, match="too late"):
        fault_step(12, None, 10)


def _slot(w, node, state="active", logical=None):
    return SimpleNamespace(world_rank=w, node=node, state=state, logical_rank=w if logical is None else logical)


SLOTS = [_slot(0, "n1"), _slot(1, "n2"), _slot(2, "n3"), _slot(3, "n4"), _slot(4, "n5", "standby", None)]


def test_victim_is_the_node_of_logical_rank_1_never_the_batch_host():
    assert pick_victim(SLOTS, "n1", None) == "n2"
    assert pick_victim([_slot(0, "n1"), _slot(1, "n1"), _slot(2, "n3")], "n1", None) == "n3"
    assert pick_victim(SLOTS, "n1", "n4") == "n4"
    with pytest.raises(DemoError, match="batch host"):
        pick_victim(SLOTS, "n1", "n1")
    with pytest.raises(DemoError, match="no active slot"):
        pick_victim(SLOTS, "n1", "n5")


def test_derived_config_changes_steps_and_data_only():
    ex = {"name": "x", "training": {"steps": 50, "lr": 0.1}, "data": {"path": "../data/stdlib"}}
    out = derived_config(ex, 12, "/abs/stdlib")
    assert out == {"name": "x", "training": {"steps": 12, "lr": 0.1}, "data": {"path": "/abs/stdlib"}}
    assert ex["training"]["steps"] == 50 and ex["data"]["path"] == "../data/stdlib"


def _user_config(tmp_path: Path, **checkpoint) -> Path:
    data = yaml.safe_load((ROOT / "examples" / "gpt-small.yaml").read_text())
    data["data"]["path"] = str(tmp_path / "data" / "stdlib")
    data["resilience"]["checkpoint"].update(checkpoint)
    p = tmp_path / "user" / "gpt-small.yaml"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


@pytest.mark.parametrize("steps", [50, 12])
def test_an_absolute_checkpoint_folder_gives_each_demo_run_its_own_folder_under_its_run_dir(tmp_path, steps):
    """The node-loss run must not start from the reference's checkpoints, nor either write into the user's
    folder: each run is submitted with its checkpoint folder under its own run directory."""
    user_ckpt = tmp_path / "user" / "ckpt"
    path = _user_config(tmp_path, path=str(user_ckpt))
    said: list[str] = []
    demo = Demo(DemoOptions(config=path, work_dir=tmp_path / "w", cluster_dir=tmp_path / "c"), echo=said.append)
    configs = demo._configs(load_job_config(path), steps)
    assert configs[REFERENCE] != configs[NODE_LOSS] and path not in configs.values()
    folders = {}
    for run, config in configs.items():
        run_cfg = load_job_config(config)  # what `phoenix submit` reads
        assert run_cfg.training.steps == steps and run_cfg.data.path == str(tmp_path / "data" / "stdlib")
        folders[run] = run_folders(run_cfg, demo.base / run)["checkpoints"]
        assert folders[run] == str(demo.base / run / "checkpoints")
    assert folders[REFERENCE] != folders[NODE_LOSS] and str(user_ckpt) not in folders.values()
    assert any("folders for checkpoints lie outside the run directories" in line for line in said)


def test_a_config_that_keeps_to_its_run_dir_is_submitted_as_it_is(tmp_path):
    """The shipped example (default checkpoint folder RUN_DIR/checkpoints): the user's file, or the --steps
    copy of it, for both runs, as before."""
    example = ROOT / "examples" / "gpt-small.yaml"
    cfg = load_job_config(example)
    demo = Demo(DemoOptions(config=example, work_dir=tmp_path / "w", cluster_dir=tmp_path / "c"), echo=print)
    assert run_configs(cfg, 50, {r: demo.base / r for r in (REFERENCE, NODE_LOSS)}) is None
    assert demo._configs(cfg, cfg.training.steps) == {REFERENCE: example, NODE_LOSS: example}
    short = demo._configs(cfg, 12)
    assert short[REFERENCE] == short[NODE_LOSS] == demo.base / "gpt-small.yaml"


def test_folders_outside_the_run_dir_are_named(tmp_path):
    rd = tmp_path / "runs" / "reference"
    assert outside_run_dir(load_job_config(_user_config(tmp_path, path="ckpt")), rd) == []
    assert outside_run_dir(load_job_config(_user_config(tmp_path, path="../ckpt")), rd) == ["checkpoints"]
    p = _user_config(tmp_path, path=str(rd / "inside"), save_megatron=str(tmp_path / "mega"))
    assert outside_run_dir(load_job_config(p), rd) == ["save_megatron"]


def test_cluster_dir_is_short_enough_and_stable(tmp_path):
    assert default_cluster_dir(Path("/w")) == Path("/w/cluster")
    long = Path("/" + "x" * 80)
    d = default_cluster_dir(long)
    assert len(str(d)) <= 60 and d == default_cluster_dir(long) and d != default_cluster_dir(Path("/" + "y" * 80))


@pytest.mark.parametrize("args, field", [
    (["--config", "no-such.yaml"], "--config"),
    (["--config", str(ROOT / "examples" / "gpt-small.yaml"), "--steps", "12", "--at-step", "12"], "--at-step"),
    (["--steps", "3"], "--steps"),
])
def test_bad_options_exit_2_naming_the_option_before_anything_starts(args, field, tmp_path):
    res = CliRunner().invoke(cli, ["demo", *args, "--work-dir", str(tmp_path / "w")])
    assert res.exit_code == 2, res.output
    assert field in res.output and "Traceback" not in res.output
    assert not (tmp_path / "w").exists()


def test_live_step_is_the_newest_step_of_any_rank_and_ignores_a_torn_line(tmp_path):
    from phoenix_hpc.demo.run import live_step

    assert live_step(tmp_path) is None
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    (ranks / "rank0.steps.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    (ranks / "rank1.steps.jsonl").write_text('{"step": 1}\n{"ste')
    assert live_step(tmp_path) == 2
    (ranks / "rank1.steps.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n')
    assert live_step(tmp_path) == 3


def test_a_node_name_outside_the_demos_cluster_is_refused_before_anything_starts():
    from phoenix_hpc.demo.run import check_node_name

    check_node_name(None)
    check_node_name("nid00006")
    for bad in ("nosuch", "nid00007", "nid0001"):
        with pytest.raises(DemoError, match=f"--node: '{bad}' is not a node of the demo's cluster .allowed: nid00001 .. nid00006"):
            check_node_name(bad)
    config = Path(__file__).resolve().parents[2] / "examples" / "gpt-small.yaml"
    r = CliRunner().invoke(cli, ["demo", "--node", "nosuch", "--config", str(config)])
    assert r.exit_code == 2 and "--node: 'nosuch'" in r.output and "Traceback" not in r.output
