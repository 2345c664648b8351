"""Spares planning (phoenix_hpc.model.spares): the Poisson count against a hand-computed case, the shrink
rules, and ``phoenix model spares`` (CliRunner)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from phoenix_hpc.cli.main import cli
from phoenix_hpc.errors import ModelError
from phoenix_hpc.model import spares as sp

ROOT = Path(__file__).resolve().parents[2]

# Hand computation for mu = 100 nodes x 200 h / 10000 h = 2: P(X <= S) = e^-2 (1 + 2 + 2 + 4/3 + 2/3 + 4/15 + 4/45)
# partial sums 1, 3, 5, 6.3333, 7, 7.2667, 7.3556 times e^-2 = 0.135335:
HAND_CDF = [0.135335, 0.406006, 0.676676, 0.857123, 0.947347, 0.983436, 0.995466]


def test_expected_failures_is_nodes_times_hours_over_mttf():
    assert sp.expected_node_failures(100, 10000, 200) == pytest.approx(2.0)
    assert sp.expected_node_failures(32, 50700, 24) == pytest.approx(32 * 24 / 50700)


def test_poisson_cdf_matches_hand_computation():
    for s, p in enumerate(HAND_CDF):
        assert sp.prob_at_most(2.0, s) == pytest.approx(p, abs=2e-6), s


@pytest.mark.parametrize("target, needed", [(0.99, 6), (0.98, 5), (0.95, 5), (0.9, 4), (0.5, 2), (0.1, 0)])
def test_spares_needed_is_smallest_s_reaching_target(target, needed):
    assert sp.spares_needed(2.0, target) == needed


def test_no_failures_expected_needs_no_spare():
    assert sp.spares_needed(0.0, 0.999) == 0
    assert sp.prob_at_most(0.0, 0) == 1.0


@pytest.mark.parametrize("call, option", [
    (lambda: sp.expected_node_failures(10, -5, 1), "--mttf-node-h"),
    (lambda: sp.expected_node_failures(10, 0, 1), "--mttf-node-h"),
    (lambda: sp.expected_node_failures(0, 100, 1), "--nodes"),
    (lambda: sp.expected_node_failures(10, 100, -1), "--hours"),
    (lambda: sp.spares_needed(1.0, 1.0), "--target"),
    (lambda: sp.spares_needed(1.0, 0.0), "--target"),
    (lambda: sp.spares_needed(1.0, 1.5), "--target"),
    (lambda: sp.spares_needed(1.0, float("nan")), "--target"),
    (lambda: sp.shrink_throughput(0), "--dp"),
])
def test_bad_input_names_the_option(call, option):
    with pytest.raises(ModelError) as ei:
        call()
    assert option in str(ei.value)


def test_shrink_throughput():
    assert sp.shrink_throughput(8) == pytest.approx(7 / 8)
    assert sp.shrink_throughput(4, 2) == pytest.approx(0.5)
    assert sp.shrink_throughput(1) == 0.0


@pytest.mark.parametrize("grid, shape", [
    ((4, 2, 8, 4), (1, 2, 1)),   # Perlmutter 7B: a replica is 2 nodes; 1 freed
    ((1, 4, 8, 1), (1, 4, 3)),   # Vista 7B: a replica is 4 nodes; 3 freed
    ((1, 2, 2, 1), (1, 2, 1)),   # the local pp=2 x dp=2 job
    ((1, 1, 4, 4), (4, 1, 0)),   # 4 replicas on one node: all of them go
    ((2, 2, 2, 4), (2, 2, 1)),   # a node holds 2 replicas' stage 0; their stage-1 node is freed
])
def test_shrink_shape_from_the_rank_layout(grid, shape):
    s = sp.shrink_shape(*grid)
    assert (s.replicas, s.nodes_per_shrink, s.freed_spares) == shape


def test_events_hot_swap_then_shrink_then_freed_spares_are_used():
    shape = sp.shrink_shape(1, 2, 4, 1)  # pp=2: a shrink frees 1 node
    evs = sp.events_for(5, spares=1, dp=4, shape=shape)
    assert evs == [("hot_swap", 0, 4), ("shrink", 1, 3), ("hot_swap", 0, 3), ("shrink", 1, 2),
                   ("hot_swap", 0, 2)]


def test_events_stop_when_no_replica_would_be_left():
    shape = sp.ShrinkShape(1, 1, 0)
    assert sp.events_for(4, spares=1, dp=2, shape=shape) == [("hot_swap", 0, 2), ("shrink", 0, 1), ("stop", 0, 1)]


def test_shrink_statistics_hand_cases():
    one = sp.ShrinkShape(1, 1, 0)
    # dp large, nothing freed: shrinks = max(0, X - S); E = E[X] - S + sum_{x<S} (S - x) P(X = x)
    e0, stop0 = sp.shrink_statistics(2.0, 0, 1000, one)
    assert e0 == pytest.approx(2.0, rel=1e-9) and stop0 == 0.0
    e1, _ = sp.shrink_statistics(2.0, 1, 1000, one)
    assert e1 == pytest.approx(2.0 - 1 + math.exp(-2.0), rel=1e-9)
    # dp=1, no spare: the first failure stops the job
    e, stop = sp.shrink_statistics(2.0, 0, 1, one)
    assert e == 0.0 and stop == pytest.approx(1 - math.exp(-2.0))


def test_plan_spares_with_grid_and_job_spares():
    plan = sp.plan_spares(100, 10000, 200, 0.99, dp=8, shape=sp.shrink_shape(4, 2, 8, 4), spares=2)
    assert plan.expected_failures == pytest.approx(2.0) and plan.spares_needed == 6
    assert [round(p, 6) for _, p in plan.by_spares[:7]] == pytest.approx(HAND_CDF, abs=2e-6)
    assert plan.throughput_after_shrink == pytest.approx(7 / 8) and plan.lost_per_shrink == pytest.approx(1 / 8)
    assert plan.p_no_shrink == pytest.approx(HAND_CDF[2], abs=2e-6)
    assert 0 < plan.expected_shrinks < 2.0


def run(*args):
    return CliRunner().invoke(cli, ["model", "spares", *map(str, args)])


def test_cli_json_hand_case():
    r = run("--nodes", 100, "--mttf-node-h", 10000, "--hours", 200, "--dp", 8, "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["spares_needed"] == 6 and d["expected_failures"] == pytest.approx(2.0)
    assert d["throughput_after_shrink"] == pytest.approx(7 / 8)
    assert d["mttf_source"] == "given"


def test_cli_table_names_the_needed_spares():
    r = run("--nodes", 100, "--mttf-node-h", 10000, "--hours", 200, "--target", 0.95)
    assert r.exit_code == 0, r.output
    assert "spares needed for P(no shrink) >= 0.95: 5" in r.output


def test_cli_from_config_and_site():
    r = run("--config", ROOT / "examples" / "vista-7b.yaml", "--site", "vista", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["nodes"] == 32 and d["hours"] == 24 and d["dp"] == 8 and d["spares"] == 2
    assert d["mttf_node_h"] == 50700 and "assumption" in d["mttf_source"]
    assert d["shape"] == {"replicas": 1, "nodes_per_shrink": 4, "freed_spares": 3}


@pytest.mark.parametrize("args, needles", [
    (["--nodes", 10, "--mttf-node-h", -5, "--hours", 1], ["--mttf-node-h", "-5", "> 0"]),
    (["--nodes", 10, "--mttf-node-h", 100, "--hours", 1, "--target", 1], ["--target", "1.0", "between 0 and 1"]),
    (["--nodes", 10, "--mttf-node-h", 100, "--hours", 1, "--target", 0], ["--target", "between 0 and 1"]),
    (["--nodes", 0, "--mttf-node-h", 100, "--hours", 1], ["--nodes", "0", ">= 1"]),
    (["--mttf-node-h", 100, "--hours", 1], ["--nodes", "missing"]),
    (["--nodes", 10, "--hours", 1], ["--mttf-node-h", "missing"]),
    (["--nodes", 10, "--mttf-node-h", 100, "--hours", 1, "--spares", 2], ["--dp", "missing"]),
    (["--nodes", 10, "--mttf-node-h", 100, "--hours", 1, "--dp", 3, "--gpus-per-node", 2], ["--gpus-per-node"]),
    (["--config", ROOT / "examples" / "vista-7b.yaml"], ["--site", "missing"]),
])
def test_cli_bad_input_exit_2(args, needles):
    r = run(*args)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    for n in needles:
        assert n in r.output, r.output


def test_mean_throughput_hand_case():
    """S=0, dp=2, nothing freed: dp 2 -> 1 after the first failure, 0 (stop) after the second. Over [0, T]:
    [1 x P(X >= 1) + 1/2 x P(X >= 2)] / mu; mu = 2: (0.864665 + 0.5 x 0.593994) / 2 = 0.580831."""
    assert sp.mean_throughput(2.0, 0, 2, sp.ShrinkShape(1, 1, 0)) == pytest.approx(0.580831, abs=2e-6)
    assert sp.mean_throughput(0.0, 0, 2, sp.ShrinkShape(1, 1, 0)) == 1.0
    assert sp.mean_throughput(1e-6, 0, 8, sp.ShrinkShape(1, 1, 0)) == pytest.approx(1.0, abs=1e-6)
    # more spares never lose throughput
    vals = [sp.mean_throughput(2.0, s, 8, sp.ShrinkShape(1, 2, 1)) for s in range(5)]
    assert vals == sorted(vals) and vals[-1] < 1.0


def test_large_inputs_stay_fast_or_are_refused():
    """Sums run over the Poisson horizon and the events up to a stop, never over dp or spares themselves."""
    plan = sp.plan_spares(1000, 10, 1000, dp=10**6, shape=sp.shrink_shape(8, 16, 10**6, 4), spares=10**9)
    assert plan.expected_shrinks == 0.0 and plan.mean_throughput == pytest.approx(1.0)
    assert len(plan.by_spares) == 9
    with pytest.raises(ModelError, match="--mttf-node-h.*expected node failures"):
        sp.expected_node_failures(100000, 1, 10)
