"""Pure statistics of the benchmarks (no I/O, no clock, no randomness except a seeded generator).

The per-step overhead method follows the one published for PHOENIX (docs/design.md section 1):
protection on and off run interleaved inside the same job (so drifts of a shared machine hit both), the
first warm-up steps are dropped, the slowest few percent of the remaining steps are trimmed (stragglers
from other tenants), and the ratio is taken of the medians. Its uncertainty is a percentile bootstrap
(Efron and Tibshirani, *An Introduction to the Bootstrap*, 1993, ch. 13) that resamples the steps of each
side independently (``scipy.stats.bootstrap``, ``method="percentile"``).

All times are in the unit they are given in (the callers use milliseconds for steps and seconds for
recovery phases); functions return floats in that unit.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from phoenix_hpc.errors import BenchError


def interleaved_order(rounds: int) -> list[bool]:
    """ABBA order of ``rounds`` on/off pairs: ``True`` = protection on. Round r is (on, off) for even r and
    (off, on) for odd r, so a linear drift of the machine cancels over every two rounds.

    Raises BenchError when ``rounds < 1``.
    """
    if rounds < 1:
        raise BenchError(f"rounds: need at least 1 on/off pair, got {rounds}")
    out: list[bool] = []
    for r in range(rounds):
        out += [True, False] if r % 2 == 0 else [False, True]
    return out


def drop_warmup(values: Sequence[float], warmup: int) -> list[float]:
    """``values`` without the first ``warmup`` entries. Raises BenchError if nothing would be left."""
    if warmup < 0:
        raise BenchError(f"warmup: must be >= 0, got {warmup}")
    if len(values) <= warmup:
        raise BenchError(f"warmup: {warmup} warm-up steps leave none of {len(values)} steps")
    return list(values[warmup:])


def kept_steps(steps: Sequence[dict]) -> list[int]:
    """Indices of the steps an interleaved overhead case keeps (pure): ``steps`` are ``{"mode", "block"}``
    dicts in order; dropped are the warm-up steps (mode ``warmup``) and the first step of every block (an
    on block's first step writes fresh buffers and starts the runtime's threads; off blocks lose theirs
    for symmetry)."""
    first: dict = {}
    for i, s in enumerate(steps):
        first.setdefault(s["block"], i)
    return [i for i, s in enumerate(steps) if s["mode"] != "warmup" and first[s["block"]] != i]


def trim_slowest(values: Sequence[float], fraction: float) -> list[float]:
    """``values`` sorted ascending without the slowest ``round(n * fraction)`` (at least one value kept).

    Raises BenchError for ``fraction`` outside [0, 1) or an empty input.
    """
    if not 0.0 <= fraction < 1.0:
        raise BenchError(f"trim fraction: must be in [0, 1), got {fraction}")
    if not values:
        raise BenchError("trim: no values")
    xs = sorted(values)
    drop = int(round(len(xs) * fraction))
    return xs[: max(1, len(xs) - drop)]


def quantile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default "linear" method, Hyndman and Fan type 7)."""
    if not values:
        raise BenchError("quantile: no values")
    if not 0.0 <= q <= 1.0:
        raise BenchError(f"quantile: q must be in [0, 1], got {q}")
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Summary:
    """Robust summary of one sample: count, median, inter-quartile range (q75 - q25), mean, min, max."""

    n: int
    median: float
    iqr: float
    q25: float
    q75: float
    mean: float
    min: float
    max: float

    def as_dict(self) -> dict:
        return asdict(self)


def summarize(values: Sequence[float]) -> Summary:
    """:class:`Summary` of ``values``. Raises BenchError when empty."""
    if not values:
        raise BenchError("summarize: no values")
    q25, q75 = quantile(values, 0.25), quantile(values, 0.75)
    return Summary(n=len(values), median=statistics.median(values), iqr=q75 - q25, q25=q25, q75=q75,
                   mean=statistics.fmean(values), min=min(values), max=max(values))


@dataclass(frozen=True)
class Ratio:
    """``value`` = median(numerator) / median(denominator), with a ``level`` percentile-bootstrap
    confidence interval ``[lo, hi]`` from ``resamples`` resamples."""

    value: float
    lo: float
    hi: float
    level: float
    resamples: int

    def as_dict(self) -> dict:
        return asdict(self)


def median_ratio(num: Sequence[float], den: Sequence[float], *, resamples: int = 2000, level: float = 0.95,
                 seed: int = 0) -> Ratio:
    """Ratio of medians ``median(num) / median(den)`` with a percentile bootstrap CI.

    Each resample draws ``len(num)`` values from ``num`` and ``len(den)`` from ``den`` with replacement
    (independent samples); the CI is the ``(1-level)/2`` and ``(1+level)/2`` quantiles of the resampled
    ratios. Deterministic for a given ``seed``.

    Raises BenchError: an empty side, a non-positive median of ``den``, ``resamples < 1`` or ``level``
    outside (0, 1).
    """
    return _bootstrap_ratio(num, den, statistics.median, "median", resamples, level, seed)


def _bootstrap_ratio(num: Sequence[float], den: Sequence[float], stat, name: str, resamples: int, level: float,
                     seed: int) -> Ratio:
    """``stat(num) / stat(den)`` with the percentile-bootstrap CI of :func:`median_ratio` and
    :func:`mean_ratio`: ``scipy.stats.bootstrap`` (``method="percentile"``, independent samples) with
    ``numpy.random.default_rng(seed)``. ``stat`` is :func:`statistics.median` or :func:`statistics.fmean`
    (``name`` names it in errors); numpy's median and mean compute it over each resample. A side of one
    value is the same in every resample (scipy resamples only samples of two or more values); both of one
    value give a point interval. A resample whose denominator's statistic is not > 0 counts as an infinite
    ratio (possible only where ``den`` holds zeros).

    Raises BenchError: an empty side, ``resamples < 1``, ``level`` outside (0, 1) or ``stat(den) <= 0``."""
    import numpy as np
    from scipy import stats as sps

    if not num or not den:
        raise BenchError(f"ratio: need values on both sides, got {len(num)} and {len(den)}")
    if resamples < 1:
        raise BenchError(f"resamples: must be >= 1, got {resamples}")
    if not 0.0 < level < 1.0:
        raise BenchError(f"level: must be in (0, 1), got {level}")
    d = stat(den)
    if d <= 0:
        raise BenchError(f"ratio: the denominator's {name} is {d}, must be > 0")
    value = stat(num) / d
    vec = {"median": np.median, "mean": np.mean}[name]
    sides = [np.asarray(num, dtype=float), np.asarray(den, dtype=float)]
    varied = [i for i, x in enumerate(sides) if len(x) > 1]  # the sides scipy resamples
    if not varied:
        return Ratio(value=value, lo=value, hi=value, level=level, resamples=resamples)

    def ratio(*xs, axis=-1):
        it = iter(xs)
        n, m = (vec(next(it), axis=axis) if i in varied else vec(sides[i]) for i in (0, 1))
        return np.divide(n, m, out=np.full(np.broadcast(n, m).shape, np.inf), where=np.asarray(m) > 0)

    res = sps.bootstrap([sides[i] for i in varied], ratio, n_resamples=resamples, confidence_level=level,
                        method="percentile", paired=False, vectorized=True, rng=np.random.default_rng(seed))
    ci = res.confidence_interval
    return Ratio(value=value, lo=float(ci.low), hi=float(ci.high), level=level, resamples=resamples)


def clean_steps(step_ms: Sequence[float], warmup: int, trim: float) -> list[float]:
    """The published cleaning in one call: drop ``warmup`` first steps, then trim the slowest ``trim``."""
    return trim_slowest(drop_warmup(step_ms, warmup), trim)


def job_step_times(per_rank: Sequence[Sequence[float]]) -> list[float]:
    """The job's time of each step: the slowest rank's (all ranks wait for it at the gradient sync).

    ``per_rank[r][s]`` is rank r's time of step s. Raises BenchError when ranks disagree on the count.
    """
    if not per_rank:
        raise BenchError("job_step_times: no ranks")
    n = {len(r) for r in per_rank}
    if len(n) != 1:
        raise BenchError(f"job_step_times: ranks recorded different numbers of steps: {sorted(n)}")
    return [max(r[s] for r in per_rank) for s in range(n.pop())]


def expected_host_bytes(snapshot_bytes: int, optimizer_shard_bytes: int, k: int) -> int:
    """Host memory per rank the design budgets (docs/design.md section 4): ``2 x snapshot + 2k x optimizer
    shard`` (ping-pong local snapshot; ping-pong buffers for the k replicas a rank holds for its peers,
    equal shard sizes assumed)."""
    if k < 0 or snapshot_bytes < 0 or optimizer_shard_bytes < 0:
        raise BenchError("expected_host_bytes: sizes and k must be >= 0")
    return 2 * snapshot_bytes + 2 * k * optimizer_shard_bytes


def expected_replay_steps(interval_steps: int) -> float:
    """Mean steps replayed after a restart from a checkpoint every K steps with the fault at a uniformly
    random step: the lost steps are uniform on 0..K-1, mean (K - 1) / 2 (docs/design.md section 1)."""
    if interval_steps < 1:
        raise BenchError(f"interval_steps: must be >= 1, got {interval_steps}")
    return (interval_steps - 1) / 2


def disruption_ratio(baseline_s: float, phoenix_s: float) -> float:
    """Total disruption per fault of the checkpoint-restart baseline over PHOENIX's hot swap.

    Raises BenchError when ``phoenix_s <= 0``."""
    if phoenix_s <= 0:
        raise BenchError(f"disruption_ratio: PHOENIX disruption must be > 0 s, got {phoenix_s}")
    return baseline_s / phoenix_s


def mean_ratio(num: Sequence[float], den: Sequence[float], *, resamples: int = 2000, level: float = 0.95,
               seed: int = 0) -> Ratio:
    """Ratio of means ``mean(num) / mean(den)`` of two independent samples (e.g. a baseline's and the hot
    swap's disruption per fault, seconds, one value per trial) with a percentile-bootstrap CI: each resample
    draws ``len(num)`` values from ``num`` and ``len(den)`` from ``den`` with replacement; the CI is the
    ``(1-level)/2`` and ``(1+level)/2`` quantiles of the resampled ratios (Efron and Tibshirani 1993,
    ch. 13). With three trials a side the interval is wide and coarse, as it should be. Deterministic for a
    given ``seed``.

    Raises BenchError: an empty side, a non-positive mean of ``den`` or a negative value, ``resamples < 1``
    or ``level`` outside (0, 1).
    """
    if (num and min(num) < 0) or (den and min(den) < 0):
        raise BenchError("ratio: durations must be >= 0")
    return _bootstrap_ratio(num, den, statistics.fmean, "mean", resamples, level, seed)
