"""``phoenix model``: JSON output, tables, plots and exit codes (CliRunner), plus the real executable."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from phoenix_hpc.cli.main import cli

EFFICIENCY = ["model", "efficiency", "--mttf-s", "1080", "--step-s", "20", "--ckpt-every", "100", "--restart-s",
              "600", "--ckpt-overhead-s", "5", "--hotswap-s", "30", "--phi", "0.5", "--overhead-ratio", "1", "--json"]
LOSS_RISK = ["model", "loss-risk", "--shards", "128", "--p-fail", "1e-6", "--k", "1", "--steps", "100000", "--json"]
SIM = ["model", "simulate", "--mttf-s", "1080", "--step-s", "20", "--steps", "2000", "--ckpt-every", "100",
       "--restart-s", "normal:600,60", "--trials", "50", "--overhead-ratio", "1"]


def run(args):
    return CliRunner().invoke(cli, args)


def check_efficiency(d):
    assert d["checkpoint_restart"]["disruption_s"] == pytest.approx(1595)
    assert round(d["checkpoint_restart"]["efficiency"], 3) == 0.404
    assert d["phoenix"]["disruption_s"] == pytest.approx(40)
    assert round(d["phoenix"]["efficiency"], 3) == 0.964
    assert d["expected_replay_steps"] == 49.5


def check_loss_risk(d):
    ind = d["independent"]
    assert ind["per_step"] == pytest.approx(1.28e-10, rel=1e-9)
    assert ind["over_run_union_bound"] == pytest.approx(1.28e-5, rel=1e-9)


def test_efficiency_json():
    r = run(EFFICIENCY)
    assert r.exit_code == 0, r.output
    check_efficiency(json.loads(r.stdout))


def test_loss_risk_json_and_domain_aware():
    r = run(LOSS_RISK)
    assert r.exit_code == 0, r.output
    check_loss_risk(json.loads(r.stdout))
    r = run(["model", "loss-risk", "--shards", "128", "--q-domain-fail", "1e-4", "--k", "1", "--steps", "100000",
             "--json"])
    d = json.loads(r.stdout)["domain_aware"]
    assert d["over_run_union_bound"] == pytest.approx(0.128)
    assert d["by_k"][2]["over_run_union_bound"] == pytest.approx(1.28e-5)


def test_loss_risk_derives_p():
    r = run(["model", "loss-risk", "--shards", "128", "--k", "1", "--steps", "100000", "--interruption-interval-s",
             "1080", "--nodes", "25000", "--step-s", "20", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)["independent"]
    assert 7.3e-7 < d["p_fail"] < 7.5e-7 and d["source"].startswith("derived")


def test_tables_and_plots(tmp_path):
    r = run(EFFICIENCY[:-1] + ["--plot", str(tmp_path / "eta.png")])
    assert r.exit_code == 0, r.output
    assert "1595" in r.stdout and "0.964" in r.stdout
    assert (tmp_path / "eta.png").read_bytes()[:4] == b"\x89PNG"
    r = run(LOSS_RISK[:-1] + ["--q-domain-fail", "1e-4", "--plot", str(tmp_path / "k.png")])
    assert r.exit_code == 0, r.output
    assert "1.28e-10" in r.stdout and "0.128" in r.stdout
    assert (tmp_path / "k.png").stat().st_size > 1000
    assert [p.name for p in tmp_path.iterdir()] and not list(tmp_path.glob(".*"))  # no temp files left


def test_simulate_json_and_journal(tmp_path):
    r = run(SIM + ["--hotswap-s", "30", "--json", "--seed", "3"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["trials"] == 50 and d["fault_clock"] == "wall"
    assert d["lost_ratio"]["mean"] > 1
    assert d["checkpoint_restart"]["lost_s"]["low"] <= d["checkpoint_restart"]["lost_s"]["mean"]
    assert json.loads(run(SIM + ["--hotswap-s", "30", "--json", "--seed", "3"]).stdout) == d
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "journal.jsonl").write_text(
        json.dumps({"ts": 1.0, "event": "recovery_done", "total_s": 25.0,
                    "phases": {"detect": 2, "reconfigure": 20, "params": 1, "optimizer": 1, "replay": 1},
                    "steps_replayed": 1}) + "\n")
    r = run(SIM + ["--hotswap-journal", str(run_dir), "--plot", str(tmp_path / "h.png")])
    assert r.exit_code == 0, r.output
    assert "PHOENIX" in r.stdout and (tmp_path / "h.png").exists()


def test_fit_csv_and_journals(tmp_path):
    csv = tmp_path / "s.csv"
    csv.write_text("gpus,seconds\n32,16.0\n64,17.1\n128,19.9\n256,24.6\n512,29.8\n")
    r = run(["model", "fit", "--csv", str(csv), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["best"] != "constant" and {x["law"] for x in d["laws"]} == {"constant", "linear", "log", "power"}
    assert [p["gpus"] for p in d["laws"][0]["predictions"]] == [10000, 100000]
    r = run(["model", "fit", "--csv", str(csv), "--plot", str(tmp_path / "f.png")])
    assert r.exit_code == 0 and "best:" in r.stdout and (tmp_path / "f.png").exists()
    dirs = []
    for n, ts in ((64, [17.0, 17.4]), (128, [19.8, 20.3]), (512, [29.5, 30.1])):
        d = tmp_path / f"run{n}"
        d.mkdir()
        (d / "journal.jsonl").write_text("".join(
            json.dumps({"ts": 1.0, "event": "recovery_done", "total_s": t,
                        "phases": {"detect": 2, "reconfigure": t - 5, "params": 1, "optimizer": 1, "replay": 1},
                        "steps_replayed": 1}) + "\n" for t in ts))
        dirs += ["--journal", str(d), "--gpus", str(n)]
    r = run(["model", "fit", *dirs, "--phase", "reconfigure", "--target-gpus", "4096", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["points"] == 6 and d["sizes"] == [64, 128, 512]
    assert [p["gpus"] for p in d["laws"][0]["predictions"]] == [4096]


@pytest.mark.parametrize("args, needle", [
    (["model", "efficiency", "--mttf-s", "-1080", "--step-s", "20", "--ckpt-every", "100", "--restart-s", "600",
      "--hotswap-s", "30"], "--mttf-s"),
    (["model", "efficiency", "--mttf-s", "1080", "--step-s", "20", "--ckpt-every", "0", "--restart-s", "600",
      "--hotswap-s", "30"], "--ckpt-every"),
    (["model", "efficiency", "--mttf-s", "1080", "--step-s", "20", "--ckpt-every", "100", "--restart-s", "600",
      "--hotswap-s", "30", "--phi", "1.5"], "--phi"),
    (["model", "efficiency", "--mttf-s", "1080", "--step-s", "20", "--ckpt-every", "100", "--restart-s", "600",
      "--hotswap-s", "30", "--plot", "out.pdf"], "--plot"),
    (["model", "loss-risk", "--shards", "128", "--p-fail", "2", "--k", "1", "--steps", "100"], "--p-fail"),
    (["model", "loss-risk", "--shards", "128", "--p-fail", "1e-6", "--k", "-1", "--steps", "100"], "--k"),
    (["model", "loss-risk", "--shards", "128", "--k", "1", "--steps", "100"], "--p-fail"),
    (["model", "loss-risk", "--shards", "128", "--q-domain-fail", "-0.1", "--steps", "100"], "--q-domain-fail"),
    (["model", "loss-risk", "--shards", "128", "--k", "1", "--steps", "100", "--nodes", "4"], "--interruption"),
    (SIM + ["--hotswap-s", "gamma:3,4"], "--hotswap-s"),
    (SIM + ["--hotswap-s", "-30"], "--hotswap-s"),
    (SIM, "--hotswap-s"),
    (SIM + ["--hotswap-s", "30", "--arrivals", "weibull:-1"], "--arrivals"),
    (SIM + ["--hotswap-s", "30", "--fault-clock", "gpu"], "--fault-clock"),
    (SIM + ["--hotswap-journal", "/nonexistent/run"], "--hotswap-journal: "),
    (["model", "fit"], "--csv"),
    (["model", "fit", "--journal", "a", "--gpus", "1", "--gpus", "2"], "--gpus"),
])
def test_bad_input_exits_2_with_a_message(args, needle):
    r = run(args)
    assert r.exit_code == 2, r.output
    assert needle in r.stderr
    assert "Traceback" not in r.output


def test_fit_bad_csv_exits_2(tmp_path):
    p = tmp_path / "s.csv"
    p.write_text("gpus,time\n64,17\n")
    r = run(["model", "fit", "--csv", str(p)])
    assert r.exit_code == 2 and "missing column(s) seconds" in r.stderr
    p.write_text("gpus,seconds\n64,17\n128,20\n")
    r = run(["model", "fit", "--csv", str(p)])
    assert r.exit_code == 2 and "at least 3" in r.stderr
    p.write_text("gpus,seconds\n64,17\n128,20,3\n256,25\n")  # a value past the header's columns
    r = run(["model", "fit", "--csv", str(p)])
    assert r.exit_code == 2 and "line 3: 3 values is not allowed; the header names 2 column(s)" in r.stderr
    p.write_text("gpus,seconds\n64,17\n128,20\n256,nan\n")
    r = run(["model", "fit", "--csv", str(p)])
    assert r.exit_code == 2 and "seconds: nan is not allowed" in r.stderr and "np." not in r.stderr
    p.write_text("gpus,seconds\n64,17\n128,20\n256,25\n")
    r = run(["model", "fit", "--csv", str(p), "--phase", "detect"])  # a journal's phase: says nothing of a CSV
    assert r.exit_code == 2 and "--phase: 'detect' is not allowed with --csv" in r.stderr


def test_an_overflowing_result_names_the_inputs_and_a_bad_hotswap_journal_names_its_option(tmp_path):
    base = ["model", "efficiency", "--mttf-s", "1000", "--ckpt-every", "100", "--restart-s", "150", "--hotswap-s", "30"]
    r = run([*base, "--step-s", "1e307", "--overhead-ratio", "1"])
    assert r.exit_code == 2 and "--step-s 1e+307" in r.stderr and "overflows to infinity" in r.stderr, r.stderr
    assert "--disruption-s" not in r.stderr
    r = run(["model", "simulate", "--mttf-s", "1000", "--step-s", "20", "--steps", "100", "--ckpt-every", "10",
             "--restart-s", "150", "--trials", "2", "--hotswap-journal", str(tmp_path)])
    assert r.exit_code == 2 and r.stderr.startswith(f"error: --hotswap-journal: {str(tmp_path)!r}"), r.stderr


def _phoenix() -> str:
    exe = Path(sys.executable).parent / "phoenix"
    assert exe.exists(), f"the phoenix entry point is not installed beside {sys.executable}"
    return str(exe)


@pytest.mark.parametrize("args, check", [(EFFICIENCY, check_efficiency), (LOSS_RISK, check_loss_risk)])
def test_real_executable(args, check):
    out = subprocess.run([_phoenix(), *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    check(json.loads(out.stdout))


def test_simulate_with_spares_reports_shrinks():
    r = run(SIM + ["--hotswap-s", "30", "--spares", "0", "--dp", "4", "--pp", "2", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["inputs"]["spares"] == 0 and d["inputs"]["shrink_shape"] == {"replicas": 1, "nodes_per_shrink": 2,
                                                                           "freed_spares": 1}
    assert d["phoenix"]["shrinks"]["mean"] > 0 and d["phoenix"]["slow_s"] > 0
    r = run(SIM + ["--hotswap-s", "30", "--spares", "1", "--dp", "4"])
    assert r.exit_code == 0, r.output
    assert "shrinks" in r.output and "running shrunk" in r.output


@pytest.mark.parametrize("extra, needle", [
    (["--spares", "1"], "--dp: missing"),
    (["--dp", "4"], "--spares: missing"),
    (["--spares", "-1", "--dp", "4"], "--spares"),
    (["--spares", "1", "--dp", "4", "--shrink-s", "soon"], "--shrink-s"),
])
def test_simulate_spares_bad_input(extra, needle):
    r = run(SIM + ["--hotswap-s", "30", *extra])
    assert r.exit_code == 2, r.output
    assert needle in r.output and "Traceback" not in r.output


def test_efficiency_charges_the_measured_overhead_and_the_interval_and_finds_the_crossover():
    """--overhead-ratio 1.1: (1.1 - 1) x 1080 s = 108 s per fault; --protect-every 3: 3 (3 - 1) / 2 = 3 more
    steps of 20 s replayed; crossover M* = (1595 - (30 + 10 + 60)) / 0.1 = 14950 s."""
    r = run(EFFICIENCY[:-3] + ["--overhead-ratio", "1.1", "--protect-every", "3", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["phoenix"]["overhead_s"] == pytest.approx(108) and d["phoenix"]["replay_s"] == pytest.approx(70)
    assert d["phoenix"]["disruption_s"] == pytest.approx(208) and d["crossover_mttf_s"] == pytest.approx(14950)
    assert d["inputs"]["overhead_ratio_source"] == "given (--overhead-ratio)"
    r = run(EFFICIENCY[:-3] + ["--protect-every", "0"])
    assert r.exit_code == 2 and "--protect-every: 0 is not allowed" in r.output, r.output


CPU_RUN = {"overhead_ratio": 1.07, "date": "D", "commit": "abc",
           "machine": {"cpu": "Xeon", "logical_cpus": 2, "gpu": "none (CPU torch engine, gloo)", "cluster_nodes": 8}}
GPU_REPORT = {"mode": "gpu", "started": "G1", "device": {"name": "NVIDIA H200"},
              "checks": [{"check": "d2h", "items": [{"name": "d2h.overhead", "status": "passed",
                                                     "numbers": {"ratio": 2.19}}]}]}


def _with_benchmarks(monkeypatch, tmp_path, content) -> Path:
    from phoenix_hpc.cli import model as cli_model

    p = tmp_path / "BENCHMARKS.json"
    p.write_text(content if isinstance(content, str) else json.dumps(content))
    monkeypatch.setattr(cli_model, "default_overhead_ratio", functools.partial(cli_model.default_overhead_ratio, path=p))
    return p


def test_the_papers_example_charges_no_cpu_host_ratio_to_a_gpu_cluster():
    """The paper's inputs without --overhead-ratio give the paper's 0.404 / 0.964 with this repository's
    BENCHMARKS.json (its ratio was measured on a CPU host), and the measured ratios are printed, not charged."""
    r = run(EFFICIENCY[:-3] + ["--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    check_efficiency(d)
    assert d["inputs"]["hardware"] == "gpu-cluster" and d["inputs"]["overhead_ratio"] == 1
    assert d["inputs"]["overhead_ratio_source"].startswith("no ratio measured on a GPU cluster, so none charged")
    kinds = {m["kind"] for m in d["inputs"]["measured_overhead_ratios_not_charged"]}
    assert "cpu-host" in kinds, d["inputs"]
    r = run(EFFICIENCY[:-3])
    assert r.exit_code == 0 and "0.404" in r.stdout and "0.964" in r.stdout, r.output
    assert "measured overhead ratios not charged" in r.stdout and "on a CPU host" in r.stdout


def test_the_default_charges_only_a_ratio_of_the_hardware_modelled(tmp_path, monkeypatch):
    _with_benchmarks(monkeypatch, tmp_path, {**CPU_RUN, "gpu_reports": [GPU_REPORT]})
    d = json.loads(run(EFFICIENCY[:-3] + ["--json"]).stdout)
    assert d["inputs"]["overhead_ratio"] == 1 and d["phoenix"]["overhead_s"] == 0
    assert [(m["ratio"], m["kind"]) for m in d["inputs"]["measured_overhead_ratios_not_charged"]] == [
        (1.07, "cpu-host"), (2.19, "one-gpu")]
    d = json.loads(run(EFFICIENCY[:-3] + ["--hardware", "cpu-host", "--json"]).stdout)
    assert d["inputs"]["overhead_ratio"] == 1.07 and d["phoenix"]["overhead_s"] == pytest.approx(0.07 * 1080)
    src = d["inputs"]["overhead_ratio_source"]
    assert src.startswith("measured on a CPU host: Xeon, 2 logical CPUs") and "commit abc" in src, src
    assert [m["kind"] for m in d["inputs"]["measured_overhead_ratios_not_charged"]] == ["one-gpu"]
    # a run whose ranks ran on GPUs is a GPU cluster's ratio: charged by default
    _with_benchmarks(monkeypatch, tmp_path, {**CPU_RUN, "machine": {"gpu": "4x NVIDIA A100", "cluster_nodes": 2}})
    d = json.loads(run(EFFICIENCY[:-3] + ["--json"]).stdout)
    assert d["inputs"]["overhead_ratio"] == 1.07 and d["inputs"]["overhead_ratio_source"].startswith(
        "measured on a GPU cluster: 4x NVIDIA A100")
    # the same rule in simulate
    _with_benchmarks(monkeypatch, tmp_path, CPU_RUN)
    r = run(SIM[:-2] + ["--hotswap-s", "30", "--hardware", "cpu-host", "--json"])
    assert json.loads(r.stdout)["inputs"]["overhead_ratio"] == 1.07, r.output
    r = run(EFFICIENCY[:-3] + ["--hardware", "tpu"])
    assert r.exit_code == 2 and "--hardware" in r.output and "gpu-cluster" in r.output, r.output


def test_measured_ratios_from_the_benchmark_file(tmp_path):
    from phoenix_hpc.model import measured_overhead as mo

    p = tmp_path / "BENCHMARKS.json"
    assert mo.read_measured(tmp_path / "missing.json") == []
    for d in ({"date": "D"}, {"overhead_ratio": None}):  # no figure; null: a run without overhead cases
        p.write_text(json.dumps(d))
        assert mo.read_measured(p) == []
        assert mo.choose([], "cpu-host")[0] == 1.0
    p.write_text(json.dumps({**CPU_RUN, "overhead_ratio": 0.998}))  # noise: said, charged 1
    r, src = mo.choose(mo.read_measured(p), "cpu-host")
    assert r == 1.0 and src.endswith("commit abc: measured 0.998, below 1 (noise), charged as 1")
    # a run of other sections kept the overhead section: its source is the run that measured it
    p.write_text(json.dumps({**CPU_RUN, "date": "D2", "commit": "new", "overhead": {"kept_from": "D1, commit old"}}))
    r, src = mo.choose(mo.read_measured(p), "cpu-host")
    assert src.endswith("the run of D1, commit old") and "new" not in src
    # only a passed d2h.overhead item counts, from the newest report that has one
    failed = {**GPU_REPORT, "started": "G2", "checks": [{"check": "d2h", "items": [
        {"name": "d2h.overhead", "status": "failed", "numbers": {"ratio": 9.0}}]}]}
    withdrawn = {**GPU_REPORT, "started": "G3", "withdrawn": "a change taken out again"}
    (m,) = mo.from_benchmarks({"gpu_reports": [withdrawn, failed, GPU_REPORT]})
    assert (m.ratio, m.kind) == (2.19, "one-gpu") and "G1" in m.source


@pytest.mark.parametrize("value", [float("nan"), 0, -1, "1.2", True, [1.2]])
def test_a_bad_benchmark_figure_is_refused_naming_the_file(tmp_path, value, monkeypatch):
    """A figure in the file that is not a number > 0 stops the command with exit 2 naming the file (not an
    option the user did not give), whichever hardware is modelled; an explicit --overhead-ratio is used
    without reading it."""
    p = _with_benchmarks(monkeypatch, tmp_path, {"overhead_ratio": value})
    r = run(EFFICIENCY[:-3] + ["--json"])
    assert r.exit_code == 2 and f"{p.name}: overhead_ratio" in r.output and "--overhead-ratio" in r.output, r.output
    assert "Traceback" not in r.output
    r = run(EFFICIENCY)  # given explicitly: the file is not consulted
    assert r.exit_code == 0, r.output
    p.write_text("{not json")
    r = run(EFFICIENCY[:-3] + ["--json"])
    assert r.exit_code == 2 and "cannot be read as JSON" in r.output, r.output


@pytest.mark.parametrize("cmd", [EFFICIENCY, SIM + ["--hotswap-s", "30"]])
@pytest.mark.parametrize("ratio", ["0.5", "0.999", "0", "-1", "nan", "inf"])
def test_a_ratio_below_one_is_refused_not_charged_as_one(cmd, ratio):
    args = list(cmd)
    args[args.index("--overhead-ratio") + 1] = ratio
    r = run(args)
    assert r.exit_code == 2 and f"--overhead-ratio: {float(ratio)!r} is not allowed" in r.output, r.output


def test_the_interval_is_bounded_by_the_checkpoint_interval_as_in_the_job_config():
    r = run(EFFICIENCY[:-1] + ["--protect-every", "100", "--json"])
    assert r.exit_code == 0, r.output
    for m in ("101", "99999999999999999999"):
        r = run(EFFICIENCY[:-1] + ["--protect-every", m])
        assert r.exit_code == 2 and f"--protect-every: {m} is not allowed" in r.output, r.output
        assert "--ckpt-every (100)" in r.output


def test_every_baseline_gets_its_own_crossover_labelled():
    """C_in-job = 40 + 990 = 1030 s, C_requeue = 300 + 990 = 1290 s, PHOENIX without the tax 30 + 10 = 40 s;
    r = 1.05: M* = (C - 40) / 0.05 = 19800 s and 25000 s."""
    args = ["model", "efficiency", "--mttf-s", "1080", "--step-s", "20", "--ckpt-every", "100", "--hotswap-s", "30",
            "--baseline", "in-job=40", "--baseline", "requeue=300", "--overhead-ratio", "1.05"]
    d = json.loads(run(args + ["--json"]).stdout)
    assert d["baselines"]["in-job"]["crossover_mttf_s"] == pytest.approx(19800)
    assert d["baselines"]["requeue"]["crossover_mttf_s"] == pytest.approx(25000)
    r = run(args)
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "crossover with in-job: above an MTTF of 1.98e+04 s in-job" in text
    assert "crossover with requeue: above an MTTF of 2.5e+04 s requeue" in text
    assert "C_in-job / C_PHOENIX" in text and "C_requeue / C_PHOENIX" in text


def test_the_plot_draws_phoenix_with_its_tax_at_every_mttf(tmp_path, monkeypatch):
    """The PHOENIX curve is Eq. 4 with the tax (r - 1) x MTTF of each MTTF on the axis: it levels off at 1/r
    and crosses checkpoint-restart at the crossover printed, instead of one disruption for every MTTF."""
    from phoenix_hpc.model import plots

    seen = {}

    def capture(path, mttf_s, curves, marks=()):
        seen.update(curves=dict(curves), marks=list(marks))
        return path

    monkeypatch.setattr(plots, "efficiency_vs_mttf", capture)
    r = run(EFFICIENCY[:-3] + ["--overhead-ratio", "1.319", "--plot", str(tmp_path / "e.png"), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    x = d["crossover_mttf_s"]
    (ck_label, ck), (px_label, px) = seen["curves"].items()
    assert ck_label.startswith("ckpt-restart") and px_label.startswith("PHOENIX (r = 1.319")
    assert px(1e9) == pytest.approx(1 / 1.319, rel=1e-6)  # no faults: the tax alone
    assert px(x) == pytest.approx(ck(x), rel=1e-9)
    assert px(x / 2) > ck(x / 2) and px(x * 2) < ck(x * 2)
    assert px(1080) == pytest.approx(d["phoenix"]["efficiency"])
    assert seen["marks"] == [("crossover with ckpt-restart", x, 0)]


def test_simulate_runs_phoenix_steps_slower_by_the_overhead_ratio():
    base = json.loads(run(SIM + ["--hotswap-s", "30", "--json", "--seed", "3"]).stdout)
    r = run(SIM[:-2] + ["--overhead-ratio", "1.1", "--hotswap-s", "30", "--json", "--seed", "3"])
    assert r.exit_code == 0, r.output
    taxed = json.loads(r.stdout)
    # 2000 steps x 20 s x 0.1 = 4000 s more lost per campaign, at least (replays run slower too)
    assert taxed["phoenix"]["lost_s"]["mean"] >= base["phoenix"]["lost_s"]["mean"] + 4000 - 1e-6
    assert taxed["phoenix"]["efficiency"]["mean"] < base["phoenix"]["efficiency"]["mean"]
    assert taxed["inputs"]["overhead_ratio"] == 1.1 and base["checkpoint_restart"] == taxed["checkpoint_restart"]


def test_simulate_takes_the_protection_interval_and_prints_the_crossover():
    r = run(SIM + ["--hotswap-s", "30", "--protect-every", "4", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["inputs"]["protect_every"] == 4 and d["analytic_eq4"]["crossover_mttf_s"] is None  # r = 1: infinite
    r = run(SIM[:-1] + ["1.1", "--hotswap-s", "30", "--protect-every", "4"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "a fault loses at most 7 steps" in text and "crossover (Eq. 4, means): above an MTTF of" in text
    r = run(SIM + ["--hotswap-s", "30", "--protect-every", "101"])
    assert r.exit_code == 2 and "--protect-every: 101 is not allowed" in r.output, r.output
