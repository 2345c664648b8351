"""The GPU check's pure parts: report items and rendering, wheel pins and tags, the PCIe limit, the ABBA
analysis, Llama options, the model size formula and the memory verdict; and the runner's bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from phoenix_hpc.bench.report import GPU_REPORT_DIR, gpu_section, load_gpu_reports
from phoenix_hpc.gpucheck import CHECKS, env, protect, report, wheels
from phoenix_hpc.gpucheck.check_d2h import param_count
from phoenix_hpc.gpucheck.check_memory import verdict
from phoenix_hpc.gpucheck.run import check_module

ROOT = Path(__file__).resolve().parents[2]


def test_item_needs_a_known_status_and_a_reason_unless_passed():
    assert report.item("a.b", "passed")["reason"] == ""
    with pytest.raises(ValueError, match="status 'ok'"):
        report.item("a.b", "ok")
    with pytest.raises(ValueError, match="needs a reason"):
        report.item("a.b", "skipped")
    assert report.equal_item("x", 1, 1, "n")["status"] == "passed"
    it = report.equal_item("x", (1, [2.0]), (1, [2.5]), "hash, losses")
    assert it["status"] == "failed" and "got (1, [2.0]), expected (1, [2.5])" in it["reason"]


def test_report_summary_exit_code_and_markdown():
    checks = [{"check": "nccl", "wall_s": 1.0, "timeout_s": 60, "items": [report.item("nccl.x", "passed", numbers={"abort_ms": 1.5})]},
              {"check": "megatron", "wall_s": 2.0, "timeout_s": 150, "items": [
                  report.item("megatron.rebuild", "skipped", "engine has no teardown yet"),
                  report.item("megatron.restore", "failed", "hash | differs", limit="world size 1")]}]
    rep = report.build_report("gpu", "2026-01-01T00:00:00+00:00", 3.0, {"torch": "2.11"}, {"name": "H200"}, checks)
    assert rep["summary"] == {"passed": 1, "failed": 1, "skipped": 1}
    assert report.exit_code(rep) == 1
    md = report.render_markdown(rep)
    assert "| megatron | megatron.rebuild | **skipped** | engine has no teardown yet |" in md
    assert "hash / differs" in md and "- abort_ms: 1.5" in md and "- one GPU: world size 1" in md
    assert report.exit_code(report.build_report("gpu", "t", 0, {}, {}, checks[:1])) == 0
    with pytest.raises(ValueError, match="mode"):
        report.build_report("cpu", "t", 0, {}, {}, [])


def test_gpu_pins_come_from_pyproject_and_match_the_installed_versions():
    pins = wheels.read_pins(ROOT / "pyproject.toml")
    assert [n for n, _ in pins] == list(wheels.GPU_MISSING)
    over = wheels.gpu_versions()
    assert over == {"megatron-core": "0.19.2"}  # the newest release the engine claims, checked on the GPU
    for name, ver in pins:  # the CPU suite runs exactly the versions the GPU machine gets, but the overrides
        assert ver == over[name] if name in over else version(name) == ver, name
    with pytest.raises(ValueError, match="exact pin"):
        wheels.gpu_pins(["pydantic>=2.6"], ("pydantic",))
    with pytest.raises(ValueError, match="no dependency 'megatron-core'"):
        wheels.gpu_pins(["pydantic==2.1"], ("megatron-core",))
    assert wheels.gpu_pins(["Python_Hostlist == 2.3.0"], ("python-hostlist",)) == [("python-hostlist", "2.3.0")]


def test_wheel_tags_and_matching_name_the_fetch_command():
    assert wheels.parse_wheel_name("megatron_core-0.16.1-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl") == (
        "megatron_core", "0.16.1", "cp312", "cp312", "manylinux_2_24_x86_64.manylinux_2_28_x86_64")
    assert wheels.parse_wheel_name("x-1-1b-py3-none-any.whl")[1:] == ("1", "py3", "none", "any")
    assert wheels.parse_wheel_name("x-1.tar.gz") is None
    assert wheels.tags_fit("py3", "none", "any")
    assert wheels.tags_fit("cp312", "cp312", "manylinux2014_x86_64.manylinux_2_17_x86_64")
    assert not wheels.tags_fit("cp311", "cp311", "manylinux_2_28_x86_64")
    assert not wheels.tags_fit("cp312", "cp312", "macosx_11_0_arm64")
    assert not wheels.tags_fit("cp312", "cp312", "manylinux_2_28_aarch64")
    pins = [("megatron-core", "0.16.1"), ("pydantic", "2.14.4"), ("python-hostlist", "2.3.0")]
    files = ["megatron_core-0.16.1-cp312-cp312-macosx_11_0_arm64.whl", "pydantic-2.13.0-py3-none-any.whl",
             "python_hostlist-2.3.0-py3-none-any.whl"]
    chosen, problems = wheels.match_wheels(pins, files)
    assert chosen == ["python_hostlist-2.3.0-py3-none-any.whl"]
    assert problems[0].startswith("megatron-core==0.16.1: no wheel for CPython 3.12 on manylinux x86-64")
    assert problems[1].startswith("pydantic==2.14.4: only other versions (pydantic-2.13.0-py3-none-any.whl)")
    assert all("fetch it with scripts/gpu-wheels.sh" in p for p in problems)


def test_pcie_limit_and_nvidia_smi_parsing():
    assert env.link_limit_gbs(5, 16) == pytest.approx(63.02, abs=0.01)  # 32 GT/s x 16 x 128/130 / 8
    assert env.link_limit_gbs(4, 16) == pytest.approx(31.51, abs=0.01)
    assert env.link_limit_gbs(2, 8) == pytest.approx(4.0)
    with pytest.raises(ValueError, match="gen 7"):
        env.link_limit_gbs(7, 16)
    smi = env.parse_smi_csv("570.86.15, 5, 16, 1, 16\n")
    assert smi["driver_version"] == "570.86.15"
    assert env.pcie_facts(smi) == {"gen_max": 5, "width_max": 16, "limit_gbs": 63.0, "gen_current": "1",
                                   "width_current": "16"}
    assert env.pcie_facts(env.parse_smi_csv("570.1, [N/A], [N/A], [N/A], [N/A]")) == {}


def _steps(on_ms, off_ms, block=3):
    out, step, b = [], 0, 0
    for on in (True, False, False, True):
        for i in range(block):
            step += 1
            ms = (on_ms if on else off_ms) + (50.0 if i == 0 else 0.0)  # the first step of a block is slow
            out.append({"mode": "on" if on else "off", "block": b, "step": step, "step_ms": ms,
                        "wait_ms": 2.0 if on else 0.0})
        b += 1
    return out


def test_abba_summary_drops_the_first_step_of_each_block():
    s = protect.summarize_abba(_steps(120.0, 100.0))
    assert s["ratio"] == pytest.approx(1.2) and s["steps_on"] == s["steps_off"] == 4
    assert s["exposed_wait_ms_median"] == 2.0 and s["on_ms_median"] == 120.0
    kept_all = protect.summarize_abba(_steps(120.0, 100.0), drop_first=0, trim=0.0)
    assert kept_all["steps_on"] == 6 and kept_all["on_ms_median"] == 120.0
    assert protect.gbs(2 * 10**9, 0.5) == 4.0 and protect.gbs(1, 0) == 0.0


def test_param_count_formula_matches_the_torch_gpt():
    import torch

    from phoenix_hpc.engines.torch_gpt import GPTShape, GPTStage

    m = GPTStage(GPTShape(3, 32, 4, 50, 16), 1, 0, 0, torch.float32)
    assert param_count(3, 32, 50, 16) == sum(p.numel() for p in m.parameters())
    assert 0.95e9 < param_count(20, 2048, 256, 1024) < 1.05e9  # the D2H check's ~1B model


def test_memory_verdict():
    assert verdict(1000 << 20, (1000 << 20) + 4096, 2000 << 20) == ""
    assert "formula gives" in verdict(1000 << 20, 999 << 20, 2000 << 20)
    assert "formula gives" in verdict(1000 << 20, 1100 << 20, 2000 << 20)
    assert "resident" in verdict(1000 << 20, 1000 << 20, 10)


def test_every_check_module_has_the_interface():
    for name in CHECKS:
        mod = check_module(name)
        assert mod.NAME == name and mod.TIMEOUT_S > 0 and all(i.split(".")[0] for i in mod.ITEMS)
    assert sum(check_module(n).TIMEOUT_S for n in CHECKS) >= 300  # the budget, not the sum, bounds the run


def test_runner_refuses_bad_input_and_no_cuda(tmp_path):
    def run(*args, **env_extra):
        import os

        return subprocess.run([sys.executable, "-m", "phoenix_hpc.gpucheck.run", *args], capture_output=True,
                              text=True, env={**os.environ, **env_extra}, timeout=120)

    r = run("--only", "nccl,gpu", str(tmp_path / "o"))
    assert r.returncode == 2 and "unknown check(s) ['gpu']" in r.stderr and not (tmp_path / "o").exists()
    r = run("--budget-s", "0", str(tmp_path / "o"))
    assert r.returncode == 2 and "--budget-s 0.0: must be > 0" in r.stderr
    (tmp_path / "f").write_text("x")
    r = run("--dry-run", str(tmp_path / "f"))
    assert r.returncode == 2 and "exists and is not a folder" in r.stderr
    r = run(str(tmp_path / "o"), CUDA_VISIBLE_DEVICES="")
    assert r.returncode == 2 and "no CUDA device is visible" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()


def test_benchmarks_section_says_plainly_when_no_gpu_check_ran():
    none = "\n".join(gpu_section(None))
    assert "**No GPU check has run yet**" in none
    dry = report.build_report("dry-run", "t", 1.0, {}, {}, [])
    assert "**No GPU check has run yet**" in "\n".join(gpu_section(dry))
    checks = [{"check": "d2h", "items": [report.item("d2h.overhead", "passed", numbers={"ratio": 1.31234, "d2h_gbs": 48.2,
                                                                                         "params": 10})]}]
    rep = report.build_report("gpu", "2026-01-01", 300.0, {"torch": "2.11", "cuda": "13.0", "driver": "580",
                                                           "megatron_core": "0.16.1"}, {"name": "NVIDIA H200"}, checks)
    text = "\n".join(gpu_section(rep))
    assert "NVIDIA H200, torch 2.11, CUDA 13.0, driver 580, megatron-core 0.16.1; checks d2h: 1 passed, 0 failed" in text
    assert "| d2h.overhead | 1 | passed | ratio 1.312, d2h_gbs 48.2 |  |" in text


def test_gpu_section_takes_each_item_from_the_newest_run_that_has_it(tmp_path):
    import json

    def run(started, checks):
        return report.build_report("gpu", started, 9.0, {"torch": "2.11"}, {"name": "H200"}, checks)

    old = run("2026-01-01T00:00:00", [
        {"check": "nccl", "items": [report.item("nccl.a", "failed", "broken")]},
        {"check": "memory", "items": [report.item("memory.host", "passed", numbers={"rss_growth_over_expected": 1.5})]}])
    new = run("2026-01-02T00:00:00", [{"check": "nccl", "items": [report.item("nccl.a", "passed")]}])
    (tmp_path / "a.json").write_text(json.dumps(old))
    (tmp_path / "b.json").write_text(json.dumps(new))
    (tmp_path / "dry.json").write_text(json.dumps(report.build_report("dry-run", "2027", 1.0, {}, {}, [])))
    (tmp_path / "junk.json").write_text("{not json")
    reps = load_gpu_reports(tmp_path)
    assert [r["file"] for r in reps] == ["b.json", "a.json"]
    text = "\n".join(gpu_section(reps))
    assert "| nccl.a | 1 | passed |" in text and "broken" not in text
    assert "| memory.host | 2 | passed | rss_growth_over_expected 1.5 |" in text
    assert "1. 2026-01-02T00:00:00" in text and "2. 2026-01-01T00:00:00" in text
    assert load_gpu_reports(tmp_path / "missing") == []
    assert "Note:" not in text
    (tmp_path / "a.note").write_text("made with an experiment\n  reverted since.\n")
    text = "\n".join(gpu_section(load_gpu_reports(tmp_path)))
    run2 = text.split("\n2. 2026-01-01T00:00:00", 1)[1].split("\n")
    assert run2[1] == "   Note: made with an experiment reverted since."  # under its own run, not the other
    assert text.count("Note:") == 1
    assert "1. 2026-01-02T00:00:00, commit unknown: not recorded, H200" in text


def test_a_withdrawn_run_is_listed_with_its_commit_but_its_items_are_not_shown(tmp_path):
    import json

    def run(started, checks, commit):
        return report.build_report("gpu", started, 9.0, {"torch": "2.11"}, {"name": "H200"}, checks,
                                   code={"commit": commit, "source_digest": "d"})

    (tmp_path / "old.json").write_text(json.dumps(run("2026-01-01", [
        {"check": "d2h", "items": [report.item("d2h.x", "passed", numbers={"ratio": 1.5})]}], "aaa")))
    (tmp_path / "new.json").write_text(json.dumps(run("2026-01-02", [
        {"check": "d2h", "items": [report.item("d2h.x", "failed", "slow", numbers={"ratio": 2.5})]}], "bbb")))
    (tmp_path / "new.withdrawn").write_text("an experiment\n taken out again\n")
    text = "\n".join(gpu_section(load_gpu_reports(tmp_path)))
    assert "1. 2026-01-02, commit bbb, H200" in text and "2. 2026-01-01, commit aaa, H200" in text
    assert "   Withdrawn (its items are not shown below): an experiment taken out again" in text
    assert "| d2h.x | 2 | passed | ratio 1.5 |" in text and "2.5" not in text


def test_benchmarks_md_has_the_generated_gpu_section():
    assert "\n".join(gpu_section(load_gpu_reports(ROOT / GPU_REPORT_DIR))) in (ROOT / "BENCHMARKS.md").read_text()


def test_check_timeout_keeps_budget_for_the_checks_to_come():
    from phoenix_hpc.gpucheck.run import MIN_CHECK_S, check_timeout

    assert check_timeout(120, 450, 2) == 120
    assert check_timeout(200, 150, 1) == 150 - MIN_CHECK_S
    assert check_timeout(200, 20, 1) == 0.0


def test_runner_orchestration_on_cpu_records_a_check_that_fails_and_one_that_times_out(tmp_path, monkeypatch):
    """The GPU path of the runner (child process per check, result file, report) on a CPU machine: the NCCL
    check's child fails at its first CUDA call, and the report says so; a tiny timeout kills the child."""
    import json

    from phoenix_hpc.gpucheck import run as R

    monkeypatch.setattr(env, "device_facts", lambda: {"name": "none (CPU test)"})
    rc = R.gpu_run(tmp_path, ["nccl"], 300.0)
    rep = json.loads((tmp_path / "gpu-report.json").read_text())
    from phoenix_hpc.gpucheck import check_nccl

    n = len(check_nccl.ITEMS)
    assert rc == 1 and rep["mode"] == "gpu" and rep["summary"] == {"passed": 0, "failed": n, "skipped": 0}
    items = rep["checks"][0]["items"]
    assert [i["name"] for i in items] == ["nccl.create_abort_create", "nccl.generation_abort"]
    assert all(i["status"] == "failed" and "cuda" in i["reason"].lower() for i in items)
    assert (tmp_path / "logs" / "nccl.log").exists() and "**failed**" in (tmp_path / "gpu-report.md").read_text()
    timed = R.run_check("megatron", tmp_path, 0.5)
    assert [i["status"] for i in timed["items"]] == ["failed"] * len(timed["items"])
    assert timed["items"][0]["reason"].startswith("timed out after 0 s")


def test_refresh_gpu_rerenders_from_the_json_and_refuses_a_folder_without_one(tmp_path, capsys):
    import json

    from phoenix_hpc.bench import report as R

    assert R.main(["refresh-gpu", str(tmp_path)]) == 2
    assert "no BENCHMARKS.json" in capsys.readouterr().err and not (tmp_path / "BENCHMARKS.md").exists()
    assert R.main(["refresh", "x", "y"]) == 2
    data = json.loads((ROOT / "BENCHMARKS.json").read_text())
    (tmp_path / "BENCHMARKS.json").write_text(json.dumps(data))
    assert R.main(["refresh-gpu", str(tmp_path)]) == 0
    assert (tmp_path / "BENCHMARKS.md").read_text() == (ROOT / "BENCHMARKS.md").read_text()


def test_the_checks_take_a_protected_jobs_nccl_variables_and_refuse_what_it_refuses(monkeypatch):
    from phoenix_hpc.gpucheck import common

    monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", raising=False)
    monkeypatch.setenv("TORCH_NCCL_ENABLE_MONITORING", "1")  # a user's value is kept
    assert common.job_nccl_env() == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2", "TORCH_NCCL_ENABLE_MONITORING": "1"}
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
    from phoenix_hpc.errors import EngineError

    with pytest.raises(EngineError, match="TORCH_NCCL_ASYNC_ERROR_HANDLING='3'"):
        common.job_nccl_env()


def test_the_monitoring_diagnosis_puts_the_variable_back_also_when_the_abort_fails(monkeypatch):
    import torch

    from phoenix_hpc.gpucheck import check_nccl

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    seen = []

    def bring_up(key):
        seen.append((key, os.environ.get("TORCH_NCCL_ENABLE_MONITORING")))
        return object(), None

    monkeypatch.setenv("TORCH_NCCL_ENABLE_MONITORING", "0")
    assert isinstance(check_nccl.abort_time_with_monitoring(bring_up, lambda g: None), float)
    assert seen == [("diag_monitoring", "1")] and os.environ["TORCH_NCCL_ENABLE_MONITORING"] == "0"

    def failing(g):
        raise RuntimeError("abort failed")

    monkeypatch.delenv("TORCH_NCCL_ENABLE_MONITORING")
    assert check_nccl.abort_time_with_monitoring(bring_up, failing) == "RuntimeError: abort failed"
    assert "TORCH_NCCL_ENABLE_MONITORING" not in os.environ


def test_a_bench_job_config_refuses_a_sequence_length_below_one():
    from phoenix_hpc.bench import jobs
    from phoenix_hpc.errors import BenchError

    kw = dict(name="x", size="M", pp=1, nodes=2, spares=0, steps=1, data_path="d")
    assert jobs.job_config(**kw, seq_length=256)["model"]["seq_length"] == 256
    assert jobs.job_config(**kw)["model"]["seq_length"] == 128
    with pytest.raises(BenchError, match="seq_length: 0 -- allowed: a positive integer"):
        jobs.job_config(**kw, seq_length=0)
