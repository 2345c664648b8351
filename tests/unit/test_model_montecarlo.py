"""Monte Carlo campaign simulator: agreement with the analytic model, reproducibility, monotonicity."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from phoenix_hpc.errors import ModelError
from phoenix_hpc.model import analytic, dist, journal, montecarlo as mc


def campaign(**kw) -> mc.Campaign:
    base = dict(mttf_s=1080.0, step_s=20.0, steps=10_000, ckpt_every=100,
                restart=dist.parse_dist("restart_s", "const:600"), hotswap=dist.parse_dist("hotswap_s", "const:30"),
                ckpt_overhead_s=5.0, fault_clock="progress", trials=400, seed=7)
    base.update(kw)
    return mc.Campaign(**base)


def test_progress_clock_mean_matches_analytic_within_ci():
    """With faults ticking on new progress only (the assumption of Eq. 4), faults ~ Poisson(W/MTTF) and the
    lost time per fault has mean Eq. (5) for PHOENIX and Eq. (2) + t_step/2 (the partial step) for ckpt."""
    c = campaign()
    r = mc.simulate(c)
    work = c.steps * c.step_s
    n_faults = work / c.mttf_s
    px_c = analytic.phoenix_disruption_s(20, 30, 0.5)
    ck_c = analytic.ckpt_disruption_s(20, 100, 600, 5) + 20 * 0.5
    for est, expected in ((r.phoenix.lost_s, n_faults * px_c), (r.checkpoint_restart.lost_s, n_faults * ck_c),
                          (r.phoenix.faults, n_faults)):
        assert est.low <= expected <= est.high, (est, expected)
    assert r.phoenix.cost_per_fault_s == pytest.approx(px_c, rel=0.01)
    assert r.checkpoint_restart.cost_per_fault_s == pytest.approx(ck_c, rel=0.01)
    # eta: trial means of W / wall against Eq. (4) (Jensen gap is tiny for ~185 faults per campaign)
    assert r.phoenix.efficiency.mean == pytest.approx(analytic.efficiency(1080, px_c), abs=2e-3)
    assert r.checkpoint_restart.efficiency.mean == pytest.approx(analytic.efficiency(1080, ck_c), abs=5e-3)
    assert r.lost_ratio.low <= ck_c / px_c <= r.lost_ratio.high


def test_random_costs_use_their_mean():
    c = campaign(restart=dist.parse_dist("restart_s", "exp:600"), hotswap=dist.parse_dist("hotswap_s", "uniform:20,40"))
    r = mc.simulate(c)
    n_faults = c.steps * c.step_s / c.mttf_s
    assert r.phoenix.lost_s.low <= n_faults * 40 <= r.phoenix.lost_s.high
    assert r.checkpoint_restart.lost_s.low <= n_faults * 1615 <= r.checkpoint_restart.lost_s.high


def test_seeded_runs_are_reproducible_and_seeds_differ():
    c = campaign(trials=50, fault_clock="wall")
    a1, b1 = mc.run_trials(c)
    a2, b2 = mc.run_trials(c)
    np.testing.assert_array_equal(a1.wall_s, a2.wall_s)
    np.testing.assert_array_equal(b1.lost_s, b2.lost_s)
    assert mc.simulate(c) == mc.simulate(c)
    a3, _ = mc.run_trials(campaign(trials=50, fault_clock="wall", seed=8))
    assert not np.array_equal(a1.wall_s, a3.wall_s)


@pytest.mark.parametrize("clock", ["wall", "progress"])
def test_more_faults_more_lost_time(clock):
    lost_ck, lost_px, faults = [], [], []
    for mttf in (4000.0, 2000.0, 1000.0):
        r = mc.simulate(campaign(mttf_s=mttf, fault_clock=clock, trials=100))
        lost_ck.append(r.checkpoint_restart.lost_s.mean)
        lost_px.append(r.phoenix.lost_s.mean)
        faults.append(r.phoenix.faults.mean)
    assert faults[0] < faults[1] < faults[2]
    assert lost_ck[0] < lost_ck[1] < lost_ck[2]
    assert lost_px[0] < lost_px[1] < lost_px[2]


def test_accounting_identity_and_wall_clock_is_worse():
    c = campaign(fault_clock="wall", trials=100, ckpt_write_s=10.0)
    ck, px = mc.run_trials(c)
    work = c.steps * c.step_s
    for t in (ck, px):
        assert t.finished.all()
        np.testing.assert_allclose(t.wall_s, work + t.downtime_s + t.replay_s + t.write_s, rtol=1e-9)
    # faults during restarts and replay make checkpoint-restart worse than Eq. (4) promises
    prog = mc.simulate(campaign(trials=100, ckpt_write_s=10.0))
    wall = mc.simulate(c)
    assert wall.checkpoint_restart.efficiency.high < prog.checkpoint_restart.efficiency.low


def test_checkpoint_writes_without_faults():
    c = campaign(mttf_s=1e15, trials=3, ckpt_write_s=10.0, steps=1000, ckpt_every=100)
    ck, px = mc.run_trials(c)
    assert (ck.faults == 0).all()
    np.testing.assert_allclose(ck.write_s, 10 * 10.0)
    np.testing.assert_allclose(px.lost_s, 0.0)


def test_bursty_arrivals_keep_the_mean_and_cluster():
    rng = np.random.default_rng(0)
    arr = mc.parse_arrivals("weibull:0.7")
    x = arr.sample(rng, 1080.0, 200_000)
    assert x.mean() == pytest.approx(1080.0, rel=0.02)
    # shape < 1: more short gaps than an exponential of the same mean
    assert (x < 108).mean() > (mc.Arrivals().sample(rng, 1080.0, 200_000) < 108).mean()
    r = mc.simulate(campaign(arrivals=arr, trials=50, fault_clock="wall"))
    assert r.arrivals == "weibull:0.7" and r.phoenix.faults.mean > 0


def test_max_faults_marks_unfinished():
    r = mc.simulate(campaign(trials=5, max_faults=3, fault_clock="wall"))
    assert r.checkpoint_restart.unfinished_trials == 5


@pytest.mark.timeout(30)  # the old loop never ended: a hang fails here, not a duration
def test_max_faults_also_ends_the_faults_that_strike_during_recoveries():
    """An MTTF far below the recovery time: on the wall clock nearly every recovery is hit again before it
    ends (about e^(600/1) faults in a row for a restart); max_faults ends those trials too."""
    r = mc.simulate(campaign(mttf_s=1.0, trials=2, max_faults=50, fault_clock="wall"))
    assert r.checkpoint_restart.unfinished_trials == 2 and r.phoenix.unfinished_trials == 2
    assert r.checkpoint_restart.faults.mean == 50 and r.phoenix.faults.mean == 50  # stopped at max_faults


@pytest.mark.parametrize("spec", ["gauss:30,5", "normal:30", "const:-1", "uniform:5,1", "lognormal:a,b", "", "nan"])
def test_bad_distribution_spec(spec):
    with pytest.raises(ModelError) as ei:
        dist.parse_dist("hotswap_s", spec)
    assert "--hotswap-s" in str(ei.value)


def test_distribution_specs_sample_sensibly():
    rng = np.random.default_rng(1)
    assert dist.parse_dist("x", "30").sample(rng, 3).tolist() == [30.0, 30.0, 30.0]
    n = dist.parse_dist("x", "normal:30,5").sample(rng, 50_000)
    assert n.min() >= 0 and n.mean() == pytest.approx(30, rel=0.01)
    ln = dist.parse_dist("x", "lognormal:30,10").sample(rng, 100_000)
    assert ln.mean() == pytest.approx(30, rel=0.02) and ln.std() == pytest.approx(10, rel=0.05)


@pytest.mark.parametrize("field, value", [("mttf_s", 0.0), ("trials", 1), ("fault_clock", "cpu"),
                                          ("ckpt_every", 0), ("steps", 0), ("ckpt_write_s", -1.0)])
def test_bad_campaign(field, value):
    with pytest.raises(ModelError) as ei:
        mc.simulate(campaign(**{field: value}))
    assert "--" + field.replace("_", "-") in str(ei.value)


def _write_journal(path, totals, tail=""):
    lines = [json.dumps({"ts": 0.0, "event": "register", "slot": 3})]
    for i, t in enumerate(totals):
        lines.append(json.dumps({"ts": 1.0 + i, "event": "recovery_done", "total_s": t,
                                 "phases": {"detect": 1, "reconfigure": t - 3, "params": 1, "optimizer": 0.5,
                                            "replay": 0.5}, "steps_replayed": 1}))
        lines.append(json.dumps({"ts": 1.5 + i, "event": "commit", "step": i}))
    path.write_text("\n".join(lines) + "\n" + tail)


def test_journal_recoveries(tmp_path):
    _write_journal(tmp_path / "journal.jsonl", [17.0, 19.5], tail='{"ts": 9, "event": "recov')
    assert journal.read_recoveries(tmp_path) == [17.0, 19.5]
    assert journal.read_recoveries(tmp_path / "journal.jsonl", "reconfigure") == [14.0, 16.5]
    d = dist.empirical(journal.read_recoveries(tmp_path), "run")
    assert set(d.sample(np.random.default_rng(0), 100).tolist()) <= {17.0, 19.5}
    assert d.mean_s == pytest.approx(18.25)


def test_journal_errors(tmp_path):
    with pytest.raises(ModelError, match="--journal"):
        journal.read_recoveries(tmp_path / "nope")
    (tmp_path / "journal.jsonl").write_text('{"ts": 1, "event": "recovery_done"}\n')
    with pytest.raises(ModelError, match="total_s"):
        journal.read_recoveries(tmp_path)
    (tmp_path / "journal.jsonl").write_text('garbage\n{"ts": 1, "event": "x"}\n')
    with pytest.raises(ModelError, match="line 1"):
        journal.read_recoveries(tmp_path)
    (tmp_path / "journal.jsonl").write_text('{"ts": 1, "event": "recovery_done", "total_s": -3}\n')
    with pytest.raises(ModelError, match="must be >= 0"):
        journal.read_recoveries(tmp_path)
    with pytest.raises(ModelError, match="--phase"):
        journal.read_recoveries(tmp_path, "warmup")
    with pytest.raises(ModelError, match="no recovery_done"):
        dist.empirical([], "run")
    assert math.isfinite(dist.parse_dist("x", "exp:0").sample(np.random.default_rng(0), 2).sum())


# --- spares running out: the (S+1)-th fault shrinks the job (phoenix_hpc.model.spares rules) ----------------

def test_shrinks_are_the_faults_beyond_the_spares():
    """dp large and nothing freed by a shrink: every fault after the S-th is a shrink, per trial."""
    c = campaign(spares=2, dp=10_000, shape=mc.ShrinkShape(1, 1, 0), trials=200)
    _, px = mc.run_trials(c)
    assert np.array_equal(px.shrinks, np.maximum(0.0, px.faults - 2))
    assert px.stops.sum() == 0 and px.shrinks.sum() > 0
    assert np.array_equal(px.final_dp, 10_000 - px.shrinks)


@pytest.mark.parametrize("clock", ["progress", "wall"])
def test_lost_time_accounts_for_running_shrunk(clock):
    """wall = W + downtime + replay + slow-down: nothing is lost or double counted."""
    c = campaign(spares=1, dp=4, shape=mc.ShrinkShape(1, 2, 1), fault_clock=clock, trials=200)
    _, px = mc.run_trials(c)
    work = c.steps * c.step_s
    assert np.allclose(px.wall_s - work, px.lost_s)
    assert (px.slow_s > 0).any() and (px.slow_s >= 0).all()


def test_enough_spares_is_the_unlimited_case():
    base = mc.run_trials(campaign(trials=100))[1]
    many = mc.run_trials(campaign(trials=100, spares=10**6, dp=8))[1]
    assert np.array_equal(base.wall_s, many.wall_s) and many.shrinks.sum() == 0 and many.slow_s.sum() == 0


def test_fewer_spares_lose_more_time():
    lost = [mc.simulate(campaign(trials=200, spares=s, dp=4, shape=mc.ShrinkShape(1, 1, 0))).phoenix.lost_s.mean
            for s in (0, 50, 500)]
    assert lost[0] > lost[1] > 0 and lost[1] >= lost[2]


def test_a_stop_rolls_back_to_the_checkpoint_and_restores_the_job():
    """dp=1: no shrink is possible, so the first fault without a spare stops the job (a restart from the
    checkpoint), and the resubmitted job has its spares and dp again."""
    c = campaign(spares=0, dp=1, shape=mc.ShrinkShape(1, 1, 0), trials=100)
    ck, px = mc.run_trials(c)
    assert np.array_equal(px.stops, px.faults) and px.shrinks.sum() == 0
    assert (px.final_dp == 1).all()
    # each stop costs a restart (600 s) as the checkpoint scheme's faults do
    assert px.downtime_s.mean() == pytest.approx(600 * px.faults.mean())


@pytest.mark.parametrize("kw, option", [
    (dict(spares=-1, dp=4), "--spares"),
    (dict(spares=1, dp=0), "--dp"),
    (dict(spares=1, dp=2, shape=mc.ShrinkShape(3, 1, 0)), "--shrink-replicas"),
])
def test_bad_spares_inputs(kw, option):
    with pytest.raises(ModelError, match=option):
        mc.simulate(campaign(**kw))


def test_interval_rollback_resumes_from_the_newest_committed_snapshot():
    """m = 3: a snapshot of S(t) (t a multiple of 3) commits in step t + 3, so with j finished steps the job
    resumes from t = 3 floor((j - 3) / 3) plus the one step Eq. (5) leaves out; m = 1 keeps the finished steps."""
    import numpy as np

    from phoenix_hpc.model.montecarlo import interval_rollback

    step = 2.0
    p = np.array([0.5, 3.0, 6.5, 7.0, 12.1, 13.9, 19.0]) * step  # j = 0, 3, 6, 7, 12, 13, 19
    assert list(interval_rollback(p, step, 1) / step) == [0, 3, 6, 7, 12, 13, 19]
    # j = 0..5: S(0) is the newest committed (S(3) commits in step 6), resume at min(j, 0 + 1); j = 6..8: S(3),
    # resume at 4; j = 12, 13: S(9), at 10; j = 19: S(15), at 16
    assert list(interval_rollback(p, step, 3) / step) == [0, 1, 4, 4, 10, 10, 16]
    # after a resume at step 8 the snapshots start again there: j = 13 finished steps is 5 after it, S(8)
    # is the newest committed (S(11) commits in step 14): resume at 9, never below 8 (a fault at 8.5 too)
    assert list(interval_rollback(np.array([13.5, 8.5]) * step, step, 3, 8 * step) / step) == [9, 8]
    j = np.arange(3, 3 + 3 * 1000) + 0.5  # uniform over the interval: 3(m - 1)/2 = 3 steps more on average
    extra = np.floor(j) - interval_rollback(j * step, step, 3) / step
    assert extra.min() == 2 and extra.max() == 4 and extra.mean() == pytest.approx(3.0)


def test_a_protection_interval_adds_its_rollback_to_phoenix_only():
    one, four = mc.simulate(campaign()), mc.simulate(campaign(protect_every=4))
    assert four.checkpoint_restart == one.checkpoint_restart
    # 3 (4 - 1) / 2 = 4.5 steps of 20 s more per fault (and a few more faults in the longer campaign)
    per_fault = (four.phoenix.lost_s.mean - one.phoenix.lost_s.mean) / four.phoenix.faults.mean
    assert 80 < per_fault < 100
    with pytest.raises(ModelError, match="--protect-every: 101 is not allowed"):
        mc.simulate(campaign(protect_every=101))
