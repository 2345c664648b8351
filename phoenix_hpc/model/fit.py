"""Fit recovery (reconfiguration) time against cluster size and extrapolate to sizes not measured.

The paper measures hot-swap recovery from 32 to 512 GPUs (17.1 s to 29.8 s) and motivates itself with
10K-100K-GPU deployments; whether the communicator rebuild that dominates recovery stays small there is
an open question. This module fits four candidate laws, says which one the data support and by how much,
and extrapolates each with a 95 % prediction interval:

==========  =====================  ==========
law         t(n)                   parameters
==========  =====================  ==========
constant    a                      1
linear      a + b n                2
log         a + b ln n             2
power       a n^b                  2
==========  =====================  ==========

n is the number of GPUs, t the time in seconds. All laws are fitted by ordinary least squares on t
(``scipy.optimize.curve_fit``), so their residual sums of squares are comparable. Laws are ranked by the
small-sample Akaike information criterion for Gaussian least squares,
``AICc = N ln(RSS/N) + 2K + 2K(K+1)/(N-K-1)`` (Burnham & Anderson, *Model Selection and Multimodel
Inference*, 2002, Eqs. 2.13-2.14) with K = the law's parameters. The noise variance, shared by all laws, is
not counted in K (the convention of statsmodels' OLS ``aic``); counting it makes the correction explode at
the 5 sizes a typical sweep has (32-512 GPUs): on synthetic data from the four laws with 5 sizes and 2-5 %
noise, K = parameters picked the true law in 76-86 % of cases against 53-82 % with K = parameters + 1.
Where N is too small for the correction (N <= K+1 for some law) plain ``AIC = N ln(RSS/N) + 2K`` is used
for all laws. "By how much" is
reported as delta to the best, Akaike weight ``w_i = exp(-delta_i/2) / sum_j exp(-delta_j/2)`` and the
evidence ratio best / runner-up = ``exp(delta_runner_up / 2)``; R^2 and RMSE are given too.

Prediction intervals at a size n0 use the delta method: ``t_hat(n0) +- t_{0.975, N-p} sqrt(g^T C g + s^2)``
where g is the gradient of the law in its parameters at n0, C the parameter covariance from curve_fit and
s^2 = RSS/(N-p). They cover parameter and noise uncertainty *within* one law; the spread between laws'
extrapolations is the (usually larger) model uncertainty, so every law's extrapolation is reported. Lower
bounds are clipped at 0 s.
"""

from __future__ import annotations

import csv
import io
import math
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from scipy import optimize, stats

from phoenix_hpc.errors import ModelError
from phoenix_hpc.files import read_text
from phoenix_hpc.model import validate as v

LAWS = ("constant", "linear", "log", "power")
N_PARAMS = {"constant": 1, "linear": 2, "log": 2, "power": 2}
FORMULAS = {"constant": "a", "linear": "a + b*n", "log": "a + b*ln(n)", "power": "a * n^b"}
MIN_POINTS = 3  # more than the 2 parameters of the largest law, so every law has a residual degree of freedom
DEFAULT_TARGETS = (10_000, 100_000)


def _f(law: str, n: np.ndarray, *theta: float) -> np.ndarray:
    if law == "constant":
        return np.full_like(n, theta[0], dtype=np.float64)
    if law == "linear":
        return theta[0] + theta[1] * n
    if law == "log":
        return theta[0] + theta[1] * np.log(n)
    return theta[0] * np.power(n, theta[1])


def _grad(law: str, n0: float, theta: np.ndarray) -> np.ndarray:
    if law == "constant":
        return np.array([1.0])
    if law == "linear":
        return np.array([1.0, n0])
    if law == "log":
        return np.array([1.0, math.log(n0)])
    a, b = theta
    return np.array([n0 ** b, a * n0 ** b * math.log(n0)])


def _initial(law: str, n: np.ndarray, y: np.ndarray) -> list[float]:
    if law == "constant":
        return [float(y.mean())]
    if law == "linear":
        b, a = np.polyfit(n, y, 1)
        return [float(a), float(b)]
    if law == "log":
        b, a = np.polyfit(np.log(n), y, 1)
        return [float(a), float(b)]
    b, la = np.polyfit(np.log(n), np.log(y), 1)
    return [float(math.exp(la)), float(b)]


@dataclass(frozen=True)
class Prediction:
    gpus: int
    seconds: float
    low: float
    high: float


@dataclass(frozen=True)
class LawFit:
    law: str
    formula: str
    params: dict[str, float]
    rss: float
    rmse_s: float
    r2: float
    ic: float  # AICc or AIC (see FitResult.criterion)
    delta: float
    weight: float
    predictions: list[Prediction]


@dataclass(frozen=True)
class FitResult:
    points: int
    sizes: list[int]
    criterion: str  # "AICc" or "AIC"
    best: str
    runner_up: str
    delta_runner_up: float
    evidence_ratio: float  # exp(delta_runner_up / 2): how many times more likely the best law is
    laws: list[LawFit]  # sorted best first

    def to_dict(self) -> dict:
        return asdict(self)

    def law(self, name: str) -> LawFit:
        return next(lf for lf in self.laws if lf.law == name)


def check_points(gpus: list[float] | np.ndarray, seconds: list[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Validate measurements; returns (n, t) as float64 arrays of shape (N,).

    Raises ModelError if lengths differ, N < 3, fewer than 2 distinct sizes, any size is not a positive
    integer, or any time is <= 0 or not finite.
    """
    n = np.asarray(gpus, dtype=np.float64)
    t = np.asarray(seconds, dtype=np.float64)
    if n.shape != t.shape or n.ndim != 1:
        raise ModelError("gpus and seconds must be two equally long lists of numbers")
    if n.size < MIN_POINTS:
        raise ModelError(f"points: {n.size} measurement(s) is not allowed; the fit needs at least {MIN_POINTS} "
                         "(more than the 2 parameters of the linear, log and power laws)")
    for x in n:
        if not (math.isfinite(x) and x >= 1 and float(x).is_integer()):
            raise ModelError(f"gpus: {float(x)!r} is not allowed; GPU counts must be integers >= 1")
    for x in t:
        if not (math.isfinite(x) and x > 0):
            raise ModelError(f"seconds: {float(x)!r} is not allowed; recovery times must be finite and > 0 s")
    if np.unique(n).size < 2:
        raise ModelError(f"gpus: only size {int(n[0])} is not allowed; measurements at 2 or more distinct sizes "
                         "are needed to fit a trend")
    return n, t


def fit_scaling(gpus, seconds, targets: tuple[int, ...] | list[int] = DEFAULT_TARGETS) -> FitResult:
    """Fit every law in :data:`LAWS` to (gpus, seconds), rank them and extrapolate to ``targets`` GPUs.

    ``gpus``: shape (N,), integers >= 1; ``seconds``: shape (N,), > 0. Repeated measurements at one size
    are separate points. Raises ModelError on invalid input (see :func:`check_points`) or targets < 1.
    """
    n, t = check_points(gpus, seconds)
    tg = [v.integer_at_least("target_gpus", int(x) if float(x).is_integer() else x, 1) for x in targets]
    N = n.size
    use_aicc = all(N - N_PARAMS[law] - 1 > 0 for law in LAWS)
    tss = float(((t - t.mean()) ** 2).sum())
    raw = []
    for law in LAWS:
        p = N_PARAMS[law]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                theta, cov = optimize.curve_fit(lambda x, *th: _f(law, x, *th), n, t, p0=_initial(law, n, t),
                                                maxfev=20000)
        except (RuntimeError, ValueError, np.linalg.LinAlgError):
            continue  # the law could not be fitted (e.g. power law on data it cannot follow)
        resid = t - _f(law, n, *theta)
        rss = float((resid ** 2).sum())
        rss_ic = max(rss, 1e-12 * float((t ** 2).sum()))  # a perfect fit would give ln(0)
        K = p
        ic = N * math.log(rss_ic / N) + 2 * K
        if use_aicc:
            ic += 2 * K * (K + 1) / (N - K - 1)
        dof = N - p
        s2 = rss / dof
        tq = float(stats.t.ppf(0.975, dof))
        cov = np.where(np.isfinite(cov), cov, 0.0)
        preds = []
        for n0 in tg:
            g = _grad(law, float(n0), theta)
            yhat = float(_f(law, np.array([float(n0)]), *theta)[0])
            half = tq * math.sqrt(max(float(g @ cov @ g), 0.0) + s2)
            preds.append(Prediction(int(n0), yhat, max(0.0, yhat - half), yhat + half))
        names = ("a", "b")[:p]
        raw.append((law, dict(zip(names, (float(x) for x in theta))), rss, ic, preds))
    if not raw:
        raise ModelError("no scaling law could be fitted to the measurements")
    best_ic = min(r[3] for r in raw)
    ws = np.array([math.exp(-(r[3] - best_ic) / 2) for r in raw])
    ws = ws / ws.sum()
    fits = [
        LawFit(law, FORMULAS[law], params, rss, math.sqrt(rss / N), (1 - rss / tss) if tss > 0 else math.nan,
               ic, ic - best_ic, float(w), preds)
        for (law, params, rss, ic, preds), w in zip(raw, ws)
    ]
    fits.sort(key=lambda lf: lf.ic)
    d2 = fits[1].delta if len(fits) > 1 else math.inf
    return FitResult(
        points=N,
        sizes=sorted(int(x) for x in np.unique(n)),
        criterion="AICc" if use_aicc else "AIC",
        best=fits[0].law,
        runner_up=fits[1].law if len(fits) > 1 else "",
        delta_runner_up=d2,
        evidence_ratio=math.exp(d2 / 2) if d2 < 1400 else math.inf,
        laws=fits,
    )


def read_csv(path: str | Path) -> tuple[list[float], list[float]]:
    """Read measurements from a CSV with a header holding the columns ``gpus`` and ``seconds``.

    Extra named columns are ignored. Raises ModelError naming the file (and line) when it is missing, empty,
    lacks a column, holds a value that is not a number or a row with more values than the header names.
    """
    p = Path(path)
    if not p.exists():
        raise v.fail("csv", str(path), "expected an existing CSV file with columns gpus,seconds")
    text = read_text(p, "--csv", error=ModelError)
    with io.StringIO(text, newline="") as fh:
        reader = csv.DictReader(fh)
        cols = [c.strip() for c in (reader.fieldnames or [])]
        missing = [c for c in ("gpus", "seconds") if c not in cols]
        if missing:
            raise ModelError(f"--csv: {str(path)!r} is not allowed; missing column(s) {', '.join(missing)} "
                             f"(found: {', '.join(cols) or 'no header'}); expected a header with gpus,seconds")
        reader.fieldnames = cols
        gpus: list[float] = []
        secs: list[float] = []
        for row in reader:
            if all((x is None or not str(x).strip()) for x in row.values() if not isinstance(x, list)):
                continue
            if None in row:  # csv.DictReader's restkey: values past the header's columns
                raise ModelError(f"--csv: {str(path)!r} line {reader.line_num}: {len(cols) + len(row[None])} values "
                                 f"is not allowed; the header names {len(cols)} column(s) ({', '.join(cols)})")
            try:
                gpus.append(float(row["gpus"]))
                secs.append(float(row["seconds"]))
            except (TypeError, ValueError):
                raise ModelError(f"--csv: {str(path)!r} line {reader.line_num}: gpus={row.get('gpus')!r}, "
                                 f"seconds={row.get('seconds')!r} is not allowed; expected two numbers") from None
    if not gpus:
        raise ModelError(f"--csv: {str(path)!r} is not allowed; it holds no data rows (expected gpus,seconds)")
    return gpus, secs
