"""The replica agreement on/off benchmark (bench/agreement_overhead.py): rank files in, the ratio and its spread
out; the kept record shown in section 1 of BENCHMARKS.md, re-rendered from BENCHMARKS.json."""

from __future__ import annotations

import json
import statistics

import pytest

from phoenix_hpc.bench import report
from phoenix_hpc.bench.agreement_overhead import OFF, ON, analyze, pair_ratios, summary_lines
from phoenix_hpc.errors import BenchError


def _rank(rank: int, on_ms: float, off_ms: float, rounds: int = 2, block: int = 4, jitter: float = 0.0) -> dict:
    """A rank file of an agreement case: 2 warm-up steps, then ABBA blocks of ``block`` steps."""
    steps = [{"mode": "warmup", "block": -1, "step": i, "step_ms": 999.0, "wait_ms": 0.0} for i in range(2)]
    blocks = []
    order = [m for r in range(rounds) for m in ((ON, OFF) if r % 2 == 0 else (OFF, ON))]
    for b, mode in enumerate(order):
        base = on_ms if mode == ON else off_ms
        for i in range(block):  # the block's first step is slow (dropped by the cleaning)
            steps.append({"mode": mode, "block": b, "step": 0, "step_ms": base * 3 if i == 0 else base + jitter * i,
                          "wait_ms": 0.1})
        cpu = 2.0e6 if mode == ON else 1.9e6
        blocks.append({"mode": mode, "block": b, "stats": {"d2h_mean_s": 0.010 if mode == ON else 0.009,
                                                           "cpu_ns_per_step": [{"copy": 9e9}] + [{"copy": cpu}] * 3}})
    return {"rank": rank, "checksum": "xxh3_64", "steps": steps, "blocks": blocks}


def test_rank_files_in_ratio_and_spread_out():
    ranks = [_rank(0, 101.0, 100.0), _rank(1, 100.0, 99.0)]  # the job's step: the slowest rank's
    a = analyze(ranks, trim=0.0)
    assert a["steps_on"] == a["steps_off"] == 2 * 3  # first step of each block dropped, warm-up dropped
    assert a["mean_ratio"]["value"] == pytest.approx(1.01) and a["median_ratio"]["value"] == pytest.approx(1.01)
    assert a["pair_ratios"] == [1.01, 1.01] and a["pair_ratio_stdev"] == 0.0
    assert a["protection_cpu_ms_per_step"] == {"on": 2.0, "off": 1.9}
    assert a["d2h_ms_mean"] == {"on": 10.0, "off": 9.0}


def test_pair_ratios_are_taken_per_abba_pair():
    steps = [{"mode": ON, "block": 0, "v": 10.0}, {"mode": OFF, "block": 1, "v": 8.0},
             {"mode": OFF, "block": 2, "v": 10.0}, {"mode": ON, "block": 3, "v": 11.0}, {"mode": ON, "block": 4, "v": 1.0}]
    assert pair_ratios(steps, range(len(steps))) == [10.0 / 8.0, 11.0 / 10.0]  # block 4's pair has no off side


def test_a_case_without_one_mode_is_refused():
    r = _rank(0, 100.0, 100.0)
    r["steps"] = [s for s in r["steps"] if s["mode"] != OFF]
    with pytest.raises(BenchError, match="off 0"):
        analyze([r])


def _result(ranks):
    return {"date": "2026-12-07T19:00:00+00:00", "wall_s": 90.0, "commit": "abc123", "dirty_files": [],
            "command": "python -m phoenix_hpc.bench.agreement_overhead --ranks 2", "ranks": 2, "size": "M",
            "params": 3_280_000, "seq_length": 256, "global_batch": 24, "rounds": 2, "block_steps": 4, "warmup": 2,
            "checksum": "xxh3_64", "cores": 2, "load_avg_1m": {"before": 1.5, "after": 2.1},
            "analysis": analyze(ranks, trim=0.0)}


def test_the_kept_record_is_shown_in_section_1_and_read_back(tmp_path):
    res = _result([_rank(0, 101.0, 100.0, jitter=0.5), _rank(1, 100.0, 99.0)])
    (tmp_path / "BENCHMARKS.json").write_text(json.dumps({"commit": "abc123", "overhead": {"error": "not run"}}))
    report.keep_record(tmp_path, "agreement_overhead", res)
    kept = json.loads((tmp_path / report.AGREEMENT_RECORD).read_text())
    assert kept["analysis"]["mean_ratio"] == res["analysis"]["mean_ratio"]
    data = json.loads((tmp_path / "BENCHMARKS.json").read_text())
    assert data["agreement_overhead"]["command"] == res["command"] and data["overhead"] == {"error": "not run"}
    md = (tmp_path / "BENCHMARKS.md").read_text()
    m = res["analysis"]["mean_ratio"]
    assert "### Replica agreement on and off" in md and res["command"] in md
    assert f"mean ratio **{m['value']:.4f}** [95 % CI {m['lo']:.4f}, {m['hi']:.4f}]" in md
    assert "1-minute load average 1.5 before, 2.1 after" in md and report.AGREEMENT_COST not in md
    # a later re-render reads the kept record from the repository's copy
    assert report.with_kept_records({}, tmp_path)["agreement_overhead"] == kept


def test_without_a_kept_record_section_1_says_it_is_not_measured_on_its_own():
    lines = report.agreement_lines({}, lambda key: [])
    assert lines == [report.AGREEMENT_COST]


def test_the_summary_names_the_mean_ratio_its_spread_and_the_load():
    res = _result([_rank(0, 102.0, 100.0, rounds=3, jitter=1.0)])
    text = "\n".join(summary_lines(res))
    pairs = res["analysis"]["pair_ratios"]
    assert f"standard deviation {statistics.stdev(pairs):.4f}" in text
    assert f"spread {min(pairs):.4f} .. {max(pairs):.4f}" in text and "on 2 logical CPUs" in text
    assert "the 95 % CI of the mean ratio excludes 1: the step time differed by +2.0 %" in text


def test_the_summary_says_when_no_difference_is_resolved():
    res = _result([_rank(0, 100.0, 100.0, rounds=3, jitter=5.0)])
    assert "contains 1" in "\n".join(summary_lines(res)) and "no difference" in "\n".join(summary_lines(res))


def _no_run(*_a, **_k):
    raise AssertionError("the benchmark ran although its output could not be written")


@pytest.mark.parametrize("flags, field", [
    (["--json", "{tmp}/missing/out.json"], "--json"),
    (["--json", "{tmp}"], "--json"),
    (["--update-benchmarks", "{tmp}/bad"], "--update-benchmarks"),
    (["--update-benchmarks", "{tmp}/list"], "--update-benchmarks"),
    (["--update-benchmarks", "{tmp}/file"], "--update-benchmarks"),
])
def test_an_output_that_cannot_be_written_is_refused_before_the_run(tmp_path, monkeypatch, capsys, flags, field):
    from phoenix_hpc.bench import agreement_overhead, control_plane
    from phoenix_hpc.data import prepare

    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "BENCHMARKS.json").write_text("{not json")
    (tmp_path / "list").mkdir()
    (tmp_path / "list" / "BENCHMARKS.json").write_text("[1, 2]")
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(prepare, "prepare_dataset", _no_run)
    monkeypatch.setattr(control_plane, "run_one", _no_run)
    argv = [x.format(tmp=tmp_path) for x in flags]
    for main in (agreement_overhead.main, control_plane.main):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {field}: {argv[1]!r} is not allowed") and "Traceback" not in err
    assert (tmp_path / "bad" / "BENCHMARKS.json").read_text() == "{not json"
    assert report.output_error(str(tmp_path / "out.json"), str(tmp_path / "new")) is None


@pytest.mark.parametrize("trim, words", [(0.05, "slowest 5 % of each mode trimmed"),
                                         (0.1, "slowest 10 % of each mode trimmed")])
def test_section_1_names_the_trim_the_run_used(trim, words):
    res = dict(_result([_rank(0, 101.0, 100.0, rounds=4, jitter=0.5)]))
    res["analysis"] = analyze([_rank(0, 101.0, 100.0, rounds=4, jitter=0.5)], trim=trim)
    text = "\n".join(report.agreement_lines({"agreement_overhead": res}, lambda key: []))
    assert words in text and text.count("% of each mode trimmed") == 1


def test_flags_that_make_an_invalid_job_config_are_refused_before_the_run(monkeypatch, capsys):
    from phoenix_hpc.bench import agreement_overhead
    from phoenix_hpc.data import prepare

    monkeypatch.setattr(prepare, "prepare_dataset", _no_run)
    assert agreement_overhead.main(["--global-batch", "24", "--micro-batch", "7"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --global-batch/--micro-batch/--seq/--ranks make a job config that is not allowed")
    assert "training.global_batch_size (24) must be a multiple of training.micro_batch_size (7)" in err
    assert "Traceback" not in err
