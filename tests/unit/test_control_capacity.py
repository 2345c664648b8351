"""The control-plane capacity arithmetic: CPU line, submit's load verdicts, age percentiles, the report's
fit and section splice."""

from __future__ import annotations

import math

import pytest

from phoenix_hpc.bench import control_plane_report as R
from phoenix_hpc.bench.control_plane import parse_ranks
from phoenix_hpc.control.capacity import Capacity, capacity_of, check_heartbeat_load, fit_cpu_line
from phoenix_hpc.control.loadstats import AgeWindow, percentile

CAP = Capacity(cpu_s_per_message=50e-6, idle_cores=0.02, max_ranks=16008, source="test numbers")


def test_fit_cpu_line_recovers_a_line_and_clips_negative_idle():
    rates = [1000.0, 4000.0, 16000.0]
    cost, idle = fit_cpu_line(rates, [0.03 + 40e-6 * r for r in rates])
    assert cost == pytest.approx(40e-6)
    assert idle == pytest.approx(0.03)
    cost, idle = fit_cpu_line([1000.0, 2000.0], [0.01, 0.05])  # the line would cross below zero at rate 0
    assert idle == 0.0
    assert cost == pytest.approx((1000 * 0.01 + 2000 * 0.05) / (1000 ** 2 + 2000 ** 2))
    with pytest.raises(ValueError, match="same message rate"):
        fit_cpu_line([5.0, 5.0], [0.1, 0.2])
    with pytest.raises(ValueError, match="2 or more"):
        fit_cpu_line([5.0], [0.1])


def test_capacity_table_is_checked_and_gives_the_one_core_rate():
    cap = capacity_of({"cpu_s_per_message": 50e-6, "idle_cores": 0.02, "max_ranks": 100, "source": "s"})
    assert cap.max_messages_per_s == pytest.approx(0.98 / 50e-6)
    for bad in ({"cpu_s_per_message": 0, "idle_cores": 0, "max_ranks": 1, "source": "s"},
                {"cpu_s_per_message": 1e-5, "idle_cores": 1.0, "max_ranks": 1, "source": "s"},
                {"idle_cores": 0, "max_ranks": 1, "source": "s"}):
        with pytest.raises(ValueError, match="capacity table"):
            capacity_of(bad)


def test_small_job_passes_silently():
    v = check_heartbeat_load(48, 0.5, 4.0, CAP)
    assert v.heartbeats_per_s == 96
    assert v.cores == pytest.approx(0.02 + 96 * 50e-6)
    assert v.problems == () and v.warnings == ()


def test_more_than_half_a_core_warns_and_names_the_numbers():
    v = check_heartbeat_load(12000, 1.0, 10.0, CAP)  # 0.62 cores
    assert not v.problems
    assert len(v.warnings) == 1 and "0.62 cores" in v.warnings[0] and "12,000/s" in v.warnings[0]


def test_beyond_the_simulated_ranks_warns_extrapolated():
    v = check_heartbeat_load(40000, 10.0, 30.0, CAP)  # 0.22 cores, but more slots than measured
    assert not v.problems
    assert any("more than the 16008" in w for w in v.warnings)


def test_a_whole_core_is_impossible_and_names_the_smallest_interval():
    v = check_heartbeat_load(32768, 1.0, 10.0, CAP)  # 32768/s x 50 us = 1.66 cores
    assert len(v.problems) == 1
    p = v.problems[0]
    assert p.startswith("resilience.heartbeat_interval_s: 1 s with 32768 slots")
    assert "1.66 cores" in p and "19,600/s" in p
    need = 32768 * 50e-6 / (0.5 - 0.02)
    assert f"heartbeat_interval_s >= {need:.2g} s" in p
    assert check_heartbeat_load(32768, need, 10.0, CAP).problems == ()


def test_a_timeout_shorter_than_one_round_is_impossible():
    # 16000 slots x 50 us = 0.8 s per round; at interval 2 s the load is 0.42 cores but the timeout 2.5 s
    # is not longer than 2 s + 0.8 s
    v = check_heartbeat_load(16000, 2.0, 2.5, CAP)
    assert len(v.problems) == 1 and v.problems[0].startswith("resilience.heartbeat_timeout_s: 2.5 s")
    assert "heartbeat_timeout_s > 2.8 s" in v.problems[0]
    assert check_heartbeat_load(16000, 2.0, 2.9, CAP).problems == ()


def test_package_capacity_table_loads():
    from phoenix_hpc.control.capacity import load_capacity

    cap = load_capacity()
    assert cap.cpu_s_per_message > 0 and "BENCHMARKS.md" in cap.source


def test_percentile_and_age_window():
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == pytest.approx(2.5)
    assert percentile([1.0, 2.0, 3.0, 4.0], 1.0) == 4.0
    with pytest.raises(ValueError):
        percentile([], 0.5)
    now = [100.0]
    w = AgeWindow(clock=lambda: now[0])
    for sent in (99.99, 99.98, 99.9, "x", float("nan"), True):
        w.add(sent)
    got = w.take()
    assert got["n"] == 3 and got["max_ms"] == pytest.approx(100.0, abs=1e-6)
    assert got["p50_ms"] == pytest.approx(20.0, abs=1e-6)
    assert w.take() is None


def _runs():
    rows = []
    for n in (1000, 4000, 16000):
        rows.append({"ranks": n, "slots": n + 8, "step_s": 2.0, "coordinator_cores": 0.01 + 30e-6 * 1.5 * n,
                     "handled_heartbeats_per_s": float(n), "sent_commits_per_s": n / 2,
                     "heartbeat_age_p99_ms": 2.0 + n / 1000, "detect_exit_s": 0.05 + n * 1e-5,
                     "quiesce_s": 0.1 + n * 1e-4, "plan_s": 1e-6 * n, "plan_delivered_s": 2e-5 * n,
                     "detect_silence_s": 10.05})
    return rows


def test_analyse_fits_laws_extrapolates_and_judges_goals():
    a = R.analyse(_runs())
    f = a["fits"]["heartbeat_age_p99_s"]
    assert f["law"] == "linear" and f["at_100k"] == pytest.approx(0.102, rel=1e-3)
    assert a["cpu"]["cpu_s_per_message"] == pytest.approx(30e-6, rel=1e-3)
    assert a["cpu"]["max_ranks"] == 16008
    g = a["goals"]
    assert a["goals_at"] == 16000
    assert g["plan_deliver_s"]["value"] == pytest.approx(0.016 + 0.32) and g["plan_deliver_s"]["met"] is True
    assert g["coordinator_cores"]["met"] is True
    lines = R.findings({"runs": _runs(), "analysis": a})
    assert any("pushing the signed plan" in s for s in lines)


def test_analyse_leaves_out_a_figure_with_too_few_values():
    rows = _runs()
    rows[0]["quiesce_s"] = None
    a = R.analyse(rows)
    assert "not_fitted" in a["fits"]["quiesce_s"]


def test_parse_ranks_refuses_bad_counts():
    assert parse_ranks("200,1000") == [200, 1000]
    for bad in ("0", "abc", "1001", "200000"):
        with pytest.raises(ValueError, match="--ranks"):
            parse_ranks(bad)
