"""Pure statistics of the benchmarks: interleaving, warm-up, trimming, summaries, bootstrap ratio."""

import statistics

import pytest

from phoenix_hpc.bench import stats as S
from phoenix_hpc.errors import BenchError


def test_interleaved_order_is_abba():
    assert S.interleaved_order(1) == [True, False]
    assert S.interleaved_order(3) == [True, False, False, True, True, False]
    # every two rounds: on and off occupy mirrored positions, so a linear drift cancels
    order = S.interleaved_order(2)
    pos_on = sum(i for i, x in enumerate(order) if x)
    pos_off = sum(i for i, x in enumerate(order) if not x)
    assert pos_on == pos_off
    with pytest.raises(BenchError, match="rounds"):
        S.interleaved_order(0)


def test_drop_warmup_and_trim():
    xs = [100.0] * 10 + [5.0, 1.0, 3.0, 2.0, 4.0, 50.0, 6.0, 7.0, 8.0, 9.0,
                         10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 17.0, 18.0, 19.0]
    kept = S.drop_warmup(xs, 10)
    assert len(kept) == 20 and 100.0 not in kept
    t = S.trim_slowest(kept, 0.05)  # 5 % of 20 = 1 value: the slowest (50.0)
    assert len(t) == 19 and max(t) == 19.0 and t == sorted(t)
    assert S.clean_steps(xs, 10, 0.05) == t
    assert S.trim_slowest([3.0], 0.5) == [3.0]  # at least one value kept
    with pytest.raises(BenchError, match="warm-up"):
        S.drop_warmup([1.0, 2.0], 2)
    with pytest.raises(BenchError, match="fraction"):
        S.trim_slowest([1.0], 1.0)


def test_quantile_matches_linear_interpolation():
    xs = [4.0, 1.0, 3.0, 2.0]
    assert S.quantile(xs, 0.0) == 1.0 and S.quantile(xs, 1.0) == 4.0
    assert S.quantile(xs, 0.5) == pytest.approx(2.5)
    assert S.quantile(xs, 0.25) == pytest.approx(1.75)
    assert statistics.quantiles(xs, n=4, method="inclusive") == pytest.approx(
        [S.quantile(xs, q) for q in (0.25, 0.5, 0.75)])


def test_summarize():
    s = S.summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s.n == 5 and s.median == 3.0 and s.min == 1.0 and s.max == 100.0
    assert s.iqr == pytest.approx(s.q75 - s.q25) and s.q25 == 2.0 and s.q75 == 4.0
    with pytest.raises(BenchError):
        S.summarize([])


def test_median_ratio_ci_contains_value_and_is_deterministic():
    on = [10.5 + 0.1 * (i % 7) for i in range(60)]
    off = [10.0 + 0.1 * (i % 5) for i in range(60)]
    r = S.median_ratio(on, off, resamples=500, seed=3)
    assert r.value == pytest.approx(statistics.median(on) / statistics.median(off))
    assert r.lo <= r.value <= r.hi
    assert r.lo > 1.0  # on is clearly slower than off here
    assert S.median_ratio(on, off, resamples=500, seed=3) == r
    same = S.median_ratio(off, off, resamples=500, seed=1)
    assert same.value == 1.0 and same.lo <= 1.0 <= same.hi


def test_median_ratio_ci_widens_with_noise():
    quiet = [10.0 + 0.01 * (i % 3) for i in range(40)]
    noisy = [10.0 + 3.0 * ((i * 7) % 5) for i in range(40)]
    a = S.median_ratio(quiet, quiet, resamples=400, seed=0)
    b = S.median_ratio(noisy, quiet, resamples=400, seed=0)
    assert (b.hi - b.lo) > (a.hi - a.lo)


def test_median_ratio_rejects_bad_input():
    with pytest.raises(BenchError, match="both sides"):
        S.median_ratio([], [1.0])
    with pytest.raises(BenchError, match="denominator"):
        S.median_ratio([1.0], [0.0])
    with pytest.raises(BenchError, match="level"):
        S.median_ratio([1.0], [1.0], level=1.0)


def test_job_step_times_take_the_slowest_rank():
    assert S.job_step_times([[1.0, 5.0], [2.0, 3.0]]) == [2.0, 5.0]
    with pytest.raises(BenchError, match="different numbers"):
        S.job_step_times([[1.0], [1.0, 2.0]])


def test_expected_memory_and_replay():
    # DESIGN.md section 4: 2 x snapshot + 2k x optimizer shard
    assert S.expected_host_bytes(100, 30, 1) == 260
    assert S.expected_host_bytes(100, 30, 2) == 320
    assert S.expected_replay_steps(100) == 49.5
    assert S.expected_replay_steps(1) == 0.0
    assert S.disruption_ratio(300.0, 20.0) == 15.0
    with pytest.raises(BenchError):
        S.disruption_ratio(1.0, 0.0)
