"""Per-fault cost distributions for the Monte Carlo simulator, parsed from short text specs.

Specs (all values in seconds):

- ``30`` or ``const:30`` -- always 30 s.
- ``normal:MEAN,SD`` -- normal, truncated at 0 by redrawing negative samples (so the mean is slightly above
  MEAN when SD is large relative to MEAN).
- ``lognormal:MEAN,SD`` -- log-normal with the given mean and standard deviation *of the time itself*
  (converted to the underlying mu, sigma: sigma^2 = ln(1 + SD^2/MEAN^2), mu = ln MEAN - sigma^2/2).
- ``uniform:LOW,HIGH`` -- uniform on [LOW, HIGH].
- ``exp:MEAN`` -- exponential with the given mean.
- ``empirical`` samples (from a PHOENIX journal, :mod:`phoenix_hpc.model.journal`) are drawn by resampling
  the measured values with replacement.

Bad specs raise :class:`phoenix_hpc.errors.ModelError` naming the option, the spec and the accepted forms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from phoenix_hpc.model import validate as v

FORMS = "a number, const:S, normal:MEAN,SD, lognormal:MEAN,SD, uniform:LOW,HIGH or exp:MEAN (seconds, >= 0)"


@dataclass(frozen=True)
class CostDist:
    """A distribution of a per-fault cost in seconds. ``kind`` is one of const, normal, lognormal, uniform,
    exp, empirical; ``params`` holds its parameters (for empirical: the measured samples)."""

    kind: str
    params: tuple[float, ...]
    label: str

    @property
    def mean_s(self) -> float:
        """Mean of the distribution in seconds (for normal: of the untruncated normal)."""
        if self.kind in ("const", "exp"):
            return self.params[0]
        if self.kind in ("normal", "lognormal"):
            return self.params[0]
        if self.kind == "uniform":
            return 0.5 * (self.params[0] + self.params[1])
        return float(np.mean(self.params))

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """Draw ``size`` costs, shape (size,), float64 seconds, all >= 0."""
        p = self.params
        if self.kind == "const":
            return np.full(size, p[0], dtype=np.float64)
        if self.kind == "exp":
            return rng.exponential(p[0], size) if p[0] > 0 else np.zeros(size)
        if self.kind == "uniform":
            return rng.uniform(p[0], p[1], size)
        if self.kind == "lognormal":
            mean, sd = p
            if mean == 0:
                return np.zeros(size)
            s2 = math.log1p((sd / mean) ** 2)
            return rng.lognormal(math.log(mean) - s2 / 2, math.sqrt(s2), size)
        if self.kind == "normal":
            mean, sd = p
            out = rng.normal(mean, sd, size)
            bad = out < 0
            while bad.any():  # truncate at 0 by redrawing; terminates because the spec requires mean > 0 or sd == 0
                out[bad] = rng.normal(mean, sd, int(bad.sum()))
                bad = out < 0
            return out
        return rng.choice(np.asarray(p, dtype=np.float64), size=size, replace=True)


def parse_dist(option: str, spec: str) -> CostDist:
    """Parse ``spec`` (see the module doc) given for CLI option/parameter ``option``.

    Raises ModelError naming ``option``, the spec and the accepted forms when the spec is unknown, has the
    wrong number of values, or has negative/non-finite values (or SD > 0 with MEAN 0 for normal).
    """
    text = str(spec).strip()
    kind, _, rest = text.partition(":")
    kind = kind.strip().lower()
    if not rest:
        rest, kind = text, "const"
    try:
        vals = tuple(float(x) for x in rest.split(","))
    except ValueError:
        raise v.fail(option, spec, f"expected {FORMS}") from None
    arity = {"const": 1, "exp": 1, "normal": 2, "lognormal": 2, "uniform": 2}
    if kind not in arity:
        raise v.fail(option, spec, f"unknown distribution {kind!r}; expected {FORMS}")
    if len(vals) != arity[kind]:
        raise v.fail(option, spec, f"{kind} takes {arity[kind]} value(s); expected {FORMS}")
    if any(not math.isfinite(x) or x < 0 for x in vals):
        raise v.fail(option, spec, f"values must be finite and >= 0; expected {FORMS}")
    if kind == "uniform" and vals[0] > vals[1]:
        raise v.fail(option, spec, "uniform:LOW,HIGH needs LOW <= HIGH")
    if kind == "normal" and vals[0] == 0 and vals[1] > 0:
        raise v.fail(option, spec, "normal:MEAN,SD needs MEAN > 0 when SD > 0 (it is truncated at 0)")
    return CostDist(kind, vals, f"{kind}:{','.join(f'{x:g}' for x in vals)}")


def empirical(samples_s: list[float] | np.ndarray, label: str) -> CostDist:
    """A distribution that resamples measured costs (seconds). Raises ModelError if there are none."""
    arr = np.asarray(samples_s, dtype=np.float64)
    if arr.size == 0:
        raise v.fail("journal", label, "the journal holds no recovery_done record")
    return CostDist("empirical", tuple(float(x) for x in arr), f"empirical:{label} (n={arr.size})")
