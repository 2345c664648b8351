"""Closed-form cost model: the published worked example and Eq. (6) numbers, and input checks."""

from __future__ import annotations

import math

import pytest

from phoenix_hpc.errors import ModelError
from phoenix_hpc.model import analytic as a


def test_published_checkpoint_restart_example():
    assert a.expected_replay_steps(100) == 49.5
    c = a.ckpt_disruption_s(step_s=20, ckpt_every=100, restart_s=600, ckpt_overhead_s=5)
    assert c == pytest.approx(1595.0)
    assert a.efficiency(1080, c) == pytest.approx(1080 / 2675)
    assert round(a.efficiency(1080, c), 3) == 0.404


def test_published_phoenix_example_charges_no_checkpoint_overhead():
    c = a.phoenix_disruption_s(step_s=20, hotswap_s=30, phi=0.5)
    assert c == pytest.approx(40.0)
    assert round(a.efficiency(1080, c), 3) == 0.964
    # an explicit PHOENIX overhead is added, not the checkpoint one
    assert a.phoenix_disruption_s(20, 30, 0.5, phoenix_overhead_s=5) == pytest.approx(45.0)


def test_compare_schemes_matches_parts():
    r = a.compare_schemes(mttf_s=1080, step_s=20, ckpt_every=100, restart_s=600, ckpt_overhead_s=5,
                          hotswap_s=30, phi=0.5)
    assert r.checkpoint_restart.replay_s == pytest.approx(990)
    assert r.checkpoint_restart.disruption_s == pytest.approx(1595)
    assert r.phoenix.disruption_s == pytest.approx(40)
    assert r.disruption_ratio == pytest.approx(1595 / 40)
    assert r.failure_rate_per_s == pytest.approx(1 / 1080)
    assert r.checkpoint_restart.disruption_rate == pytest.approx(1595 / 1080)  # Eq. 3


def test_loss_bound_published_numbers():
    per = a.loss_bound_per_step(shards=128, p_fail=1e-6, k=1)
    assert per == pytest.approx(1.28e-10, rel=1e-12)
    assert a.loss_bound_over_run(per, 100_000) == pytest.approx(1.28e-5, rel=1e-12)
    q1 = a.loss_risk(128, 1e-4, 1, 100_000)
    q2 = a.loss_risk(128, 1e-4, 2, 100_000)
    assert q1.over_run_union_bound == pytest.approx(0.128, rel=1e-12)
    assert q2.over_run_union_bound == pytest.approx(1.28e-5, rel=1e-12)
    # independent steps give slightly less than the union bound
    assert q1.over_run_independent_steps == pytest.approx(1 - (1 - 1.28e-6) ** 100_000, rel=1e-9)
    assert q1.over_run_independent_steps < q1.over_run_union_bound


def test_loss_bound_is_capped_and_monotone_in_k():
    assert a.loss_bound_per_step(128, 0.5, 0) == 1.0
    risks = [a.loss_bound_per_step(64, 1e-3, k) for k in range(5)]
    assert all(x > y for x, y in zip(risks, risks[1:]))


def test_per_step_failure_prob_derivation():
    # 100K GPUs as 25,000 four-GPU nodes, an interruption every 1080 s, 20 s steps -> ~7.4e-7 (paper: ~1e-6)
    p = a.per_step_failure_prob(1080, 25_000, 20)
    assert p == pytest.approx(-math.expm1(-20 / (1080 * 25_000)))
    assert 7.3e-7 < p < 7.5e-7
    assert a.per_step_failure_prob(1080, 12_500, 20) == pytest.approx(2 * p, rel=1e-6)


@pytest.mark.parametrize("call, option", [
    (lambda: a.ckpt_disruption_s(-1, 100, 600, 5), "--step-s"),
    (lambda: a.ckpt_disruption_s(20, 0, 600, 5), "--ckpt-every"),
    (lambda: a.ckpt_disruption_s(20, 100, -600, 5), "--restart-s"),
    (lambda: a.ckpt_disruption_s(20, 100, 600, -5), "--ckpt-overhead-s"),
    (lambda: a.phoenix_disruption_s(20, 30, 1.0), "--phi"),
    (lambda: a.phoenix_disruption_s(20, -30, 0.5), "--hotswap-s"),
    (lambda: a.efficiency(0, 10), "--mttf-s"),
    (lambda: a.efficiency(float("nan"), 10), "--mttf-s"),
    (lambda: a.loss_bound_per_step(128, 1.5, 1), "--p-fail"),
    (lambda: a.loss_bound_per_step(128, -0.1, 1), "--p-fail"),
    (lambda: a.loss_bound_per_step(128, 1e-6, -1), "--k"),
    (lambda: a.loss_bound_per_step(0, 1e-6, 1), "--shards"),
    (lambda: a.loss_bound_over_run(1e-10, 0), "--steps"),
    (lambda: a.per_step_failure_prob(1080, 0, 20), "--nodes"),
])
def test_bad_input_names_the_option(call, option):
    with pytest.raises(ModelError) as ei:
        call()
    assert option in str(ei.value)
    assert "not allowed" in str(ei.value)
    assert ei.value.exit_code == 2
