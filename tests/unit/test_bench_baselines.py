"""The recovery comparison of the benchmarks: ratio arithmetic with its bootstrap interval, the six phases,
the computed cost at 20 s steps, bad input (exit 2 naming the allowed values), the in-job restart's next
nodes, and the report text. Pure logic; no cluster."""

from __future__ import annotations

import json
import statistics

import pytest
from click.testing import CliRunner

from phoenix_hpc.bench import baselines as B
from phoenix_hpc.bench import stats as S
from phoenix_hpc.cli.main import cli
from phoenix_hpc.errors import BenchError


def test_mean_ratio_is_the_ratio_of_means_with_an_interval_around_it():
    num, den = [30.0, 28.0, 32.0], [1.0, 1.5, 0.5]
    r = S.mean_ratio(num, den, seed=7)
    assert r.value == pytest.approx(30.0 / 1.0)
    assert r.lo <= r.value <= r.hi and r.lo < r.hi
    # the interval's ends are ratios of resampled means: bounded by the extreme ones
    assert min(num) / max(den) <= r.lo and r.hi <= max(num) / min(den)
    assert S.mean_ratio(num, den, seed=7) == r  # deterministic for a seed


def test_mean_ratio_of_constant_samples_has_a_point_interval():
    r = S.mean_ratio([12.0, 12.0, 12.0], [3.0, 3.0, 3.0])
    assert (r.value, r.lo, r.hi) == (4.0, 4.0, 4.0)


def test_mean_ratio_interval_narrows_with_more_trials():
    few = S.mean_ratio([10.0, 20.0, 30.0], [1.0, 2.0, 3.0], seed=1)
    many = S.mean_ratio([10.0, 20.0, 30.0] * 10, [1.0, 2.0, 3.0] * 10, seed=1)
    assert many.value == pytest.approx(few.value) == pytest.approx(10.0)
    assert (many.hi - many.lo) < (few.hi - few.lo)


@pytest.mark.parametrize("num,den,match", [([], [1.0], "both sides"), ([1.0], [0.0, 0.0], "must be > 0"),
                                           ([-1.0], [1.0], ">= 0")])
def test_mean_ratio_refuses_bad_samples(num, den, match):
    with pytest.raises(BenchError, match=match):
        S.mean_ratio(num, den)


def test_journal_phases_add_up_to_the_total():
    p = B.journal_phases(2.0, {"detect": 0.1, "reconfigure": 0.3, "params": 0.2, "optimizer": 0.4, "replay": 0.5})
    assert p == {"detect": 0.1, "teardown": 0.5, "relaunch": 0.0, "init": 0.3, "load": 0.6, "replay": 0.5}
    assert sum(p.values()) == pytest.approx(2.0)


def test_computed_cost_replaces_the_measured_replay_by_the_expected_one_at_20_s_steps():
    phases = {"detect": 1.0, "teardown": 2.0, "relaunch": 3.0, "init": 4.0, "load": 5.0, "replay": 99.0}
    assert B.computed_cost(phases, 100) == pytest.approx(15.0 + 49.5 * 20)
    assert B.computed_cost(phases, 1) == pytest.approx(15.0)
    assert B.computed_cost(phases, 100, step_s=2.0, replay_steps=1) == pytest.approx(17.0)


def _trial(total, replay=0.0, steps=0):
    ph = {p: 0.0 for p in B.PHASES}
    ph["detect"], ph["replay"] = total - replay, replay
    return {"total_s": total, "phases": ph, "steps_replayed": steps}


def test_summarize_gives_each_baseline_and_k_its_ratio_and_computed_cost():
    hs = [_trial(1.0), _trial(1.0), _trial(1.0), {"name": "x", "error": "failed"}]
    trials = {"in-job": {"10": [_trial(10.0, 1.0, 5), _trial(12.0, 1.0, 5), _trial(14.0, 1.0, 5)]},
              "requeue": {"10": [{"error": "no job"}]}}
    c = B.summarize(trials, hs, seed=3)
    row = c["in-job"]["10"]
    assert row["n"] == 3 and row["total_s"]["mean"] == pytest.approx(12.0)
    assert row["ratio"]["value"] == pytest.approx(12.0) and row["ratio"]["lo"] <= 12.0 <= row["ratio"]["hi"]
    assert row["computed_at_step_s"] == pytest.approx(11.0 + 4.5 * 20)
    # Eq. 5: the hot swap loses E[phi] = half of the step in flight besides the steps it replays (none here)
    assert c["hot-swap"]["n"] == 3 and c["hot-swap"]["computed_at_step_s"] == pytest.approx(1.0 + 0.5 * 20)
    assert row["computed_ratio"] == pytest.approx((11.0 + 90.0) / 11.0)
    assert c["requeue"]["10"]["n"] == 0 and "ratio" not in c["requeue"]["10"]


def test_bad_baseline_names_and_intervals_name_the_allowed_values():
    assert B.parse_baselines("in-job,requeue") == ("in-job", "requeue")
    assert B.parse_ks("100,10") == (100, 10)
    with pytest.raises(BenchError, match=r"allowed: .*\['requeue', 'in-job', 'in-process'\]"):
        B.parse_baselines("in-job,elastic")
    for bad in ("0", "10,-5", "ten"):
        with pytest.raises(BenchError, match="K must be an integer >= 1"):
            B.parse_ks(bad)


@pytest.mark.parametrize("args,needle", [(["--baselines", "elastic"], "requeue"),
                                         (["--ks", "0"], "K must be an integer >= 1"),
                                         (["--trials", "0"], "an integer >= 1")])
def test_phoenix_bench_refuses_bad_input_with_exit_2_before_any_cluster(args, needle):
    res = CliRunner().invoke(cli, ["bench", "--sections", "recovery", *args])
    assert res.exit_code == 2, res.output
    assert needle in res.output


def test_bench_run_refuses_bad_input_with_exit_2(capsys):
    from phoenix_hpc.bench.run import main

    assert main(["--cluster-dir", "x", "--work-dir", "y", "--out-dir", "z", "--ks", "5,0"]) == 2
    assert "K must be an integer >= 1" in capsys.readouterr().err


def test_model_efficiency_takes_each_baselines_restart_time():
    base = ["model", "efficiency", "--mttf-s", "3600", "--step-s", "20", "--ckpt-every", "100", "--hotswap-s", "2",
            "--json"]
    res = CliRunner().invoke(cli, base + ["--baseline", "requeue=30", "--baseline", "in-job=10"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["baselines"]["requeue"]["disruption_s"] == pytest.approx(30 + 49.5 * 20)
    assert d["baselines"]["in-job"]["disruption_s"] == pytest.approx(10 + 49.5 * 20)
    assert d["baselines"]["in-job"]["disruption_ratio"] < d["baselines"]["requeue"]["disruption_ratio"]
    bad = CliRunner().invoke(cli, base + ["--baseline", "elastic=3"])
    assert bad.exit_code == 2 and "in-process" in bad.output and "elastic" in bad.output
    none = CliRunner().invoke(cli, base)
    assert none.exit_code == 2 and "--restart-s" in none.output


def test_in_job_next_step_nodes_leave_out_the_dead_ones():
    from phoenix_hpc.control.in_job import next_step_nodes

    assert next_step_nodes(["n1", "n2", "n3", "n4", "n5"], ["n4"], 4) == (["n1", "n2", "n3", "n5"], 0)
    assert next_step_nodes(["n1", "n2", "n3"], [], 2) == (["n1", "n2", "n3"], 1)
    with pytest.raises(ValueError, match="1 node.* left"):
        next_step_nodes(["n1", "n2"], ["n2"], 2)


def test_in_job_next_nodes_command_consumes_the_request(tmp_path, capsys):
    from phoenix_hpc.control.in_job import main, write_restart_request

    assert main(["next-nodes", "--run-dir", str(tmp_path), "--nodes", "nid[00001-00005]", "--active", "4"]) == 4
    write_restart_request(tmp_path, ["nid00004"], 10, "node lost")
    assert main(["next-nodes", "--run-dir", str(tmp_path), "--nodes", "nid[00001-00005]", "--active", "4"]) == 0
    assert capsys.readouterr().out.split() == ["nid[00001-00003,00005]", "0"]
    assert not (tmp_path / "in_job_restart.json").exists()
    (rec,) = [json.loads(x) for x in (tmp_path / "in_job_restarts.jsonl").read_text().splitlines()]
    assert rec["dead_nodes"] == ["nid00004"] and rec["checkpoint_step"] == 10


def test_replayed_steps_are_those_after_the_restart_up_to_the_fault_step():
    from phoenix_hpc.bench.recovery import replayed_after_restore

    steps = [{"step": s, "step_time_ms": 1.0} for s in (1, 2, 3, 4, 5, 6, 7)]
    steps += [{"step": s, "step_time_ms": 2.0} for s in (6, 7, 8, 9)]
    assert [s["step"] for s in replayed_after_restore(steps, 7)] == [6, 7]
    assert replayed_after_restore(steps[:7], 7) == []


def test_report_renders_every_scheme_with_ratios_and_the_computed_cost():
    from phoenix_hpc.bench.report_recovery import render

    hs = [_trial(1.0), _trial(2.0), _trial(1.5)]
    for i, h in enumerate(hs):
        h.update(name=f"hotswap-{i}", fault_step=12)
    bl = {n: {"10": [dict(_trial(v, 0.5, 4), name=f"{n}-K10-{i}", fault_step=14, checkpoint_step=10)
                     for i, v in enumerate((8.0, 9.0, 10.0))]} for n in B.BASELINES}
    rec = {"trials": 3, "schemes": list(B.SCHEMES), "hotswap": hs, "baselines": bl,
           "comparison": B.summarize(bl, hs)}
    text = "\n".join(render(rec))
    for n in B.SCHEMES:
        assert f"| {n} |" in text
    assert "Computed, not measured" in text and "phoenix model efficiency" in text and "--baseline in-job=" in text
    assert text.count("| requeue-K10-") == 3
    assert f"**{statistics.fmean([8.0, 9.0, 10.0]) / 1.5:.1f}x**" in text


def test_a_run_of_one_section_keeps_the_others_from_the_previous_report(tmp_path):
    from phoenix_hpc.bench.run import keep_previous_sections

    prev = tmp_path / "BENCHMARKS.json"
    prev.write_text(json.dumps({"date": "D", "commit": "C", "overhead": {"cases": []}, "recovery": {"old": 1}}))
    res = keep_previous_sections({"recovery": {"new": 1}}, prev, ["recovery"])
    assert res["recovery"] == {"new": 1} and res["overhead"]["kept_from"] == "D, commit C"
    assert res["kept_sections"] == ["overhead"]


def test_the_model_command_takes_each_side_s_mean_restart_time_without_replay_never_a_negative_one():
    from phoenix_hpc.bench.report_recovery import model_command

    # in-process at K=100 as measured once: trials that replayed very few and very many steps, so the median
    # replay exceeds the mean total; each trial's restart without its replay is 1 s
    ip = [_trial(1.0 + r, r, n) for r, n in ((0.1, 2), (6.0, 73), (7.0, 87))]
    c = B.summarize({"in-process": {"100": ip}}, [_trial(1.2, 0.2, 1)] * 3)
    assert c["in-process"]["100"]["restart_s"] == pytest.approx(1.0)
    assert c["hot-swap"]["restart_s"] == pytest.approx(1.0)
    assert c["in-process"]["100"]["total_s"]["mean"] - c["in-process"]["100"]["phases_median"]["replay"] < 0
    cmd = model_command(c, "100")
    assert "--hotswap-s 1.00 " in cmd and cmd.endswith("--baseline in-process=1.00"), cmd


def test_the_hot_swap_detect_is_measured_from_the_kill_not_from_the_last_heartbeat():
    from phoenix_hpc.bench.recovery import true_detect
    from phoenix_hpc.errors import BenchError

    done = {"total_s": 1.3, "phases": {"detect": 0.35, "reconfigure": 0.2, "replay": 0.1}}
    journal = [{"ts": 99.0, "event": "fault"},  # before the kill: another matter
               {"ts": 100.02, "event": "slots_dead"}, {"ts": 100.03, "event": "fault"},
               {"ts": 100.05, "event": "decision"}]
    phases, total = true_detect(done, journal, t_fault=100.0)
    assert phases == {"detect": 0.02, "reconfigure": 0.2, "replay": 0.1}
    assert total == 0.97  # 1.3 - 0.35 + 0.02
    assert done["phases"]["detect"] == 0.35  # the journal's record is left as it was
    with pytest.raises(BenchError, match="no journal record of the fault"):
        true_detect(done, journal[:1], t_fault=100.0)
