"""Closed-form cost model of a fault for checkpoint-restart and for PHOENIX hot swap.

All times are in seconds, probabilities are plain floats in [0, 1]. Every function is pure and validates its
inputs (raising :class:`phoenix_hpc.errors.ModelError` naming the parameter, its value and the allowed range).

Source: the PHOENIX paper (arXiv 2607.01646), Section III, Eqs. (1)-(5) (disruption per fault and training
efficiency) and Section V, Eq. (6) (replica-loss bound). Equation numbers below refer to that paper.

The published worked example (MTTF_sys 1080 s, t_step 20 s, K 100, restart 600 s, checkpoint overhead 5 s,
hot swap 30 s, phi 0.5) gives C_ckpt = 5 + 600 + 990 = 1595 s, eta = 0.404 and C_PHOENIX = 0 + 30 + 10 = 40 s,
eta = 0.964. Note the PHOENIX figure uses C_overhead^PHOENIX = 0: the per-step D2H/H2H snapshot overlaps
compute and the paper measures no per-step overhead, so the checkpoint scheme's overhead (5 s) is *not*
charged to PHOENIX. :func:`phoenix_disruption_s` therefore takes its own ``phoenix_overhead_s`` (default 0).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from phoenix_hpc.model import validate as v


def expected_replay_steps(ckpt_every: int) -> float:
    """E[R] = (K - 1) / 2: expected number of completed steps since the last checkpoint at a fault.

    Eq. (1): with a checkpoint every K steps and faults landing uniformly in the K-step window, the number of
    completed-but-unpersisted steps R is uniform on {0, ..., K-1}. (The paper's prose rounds to K/2; the
    equation is (K-1)/2, which is what is computed here.)

    Raises ModelError if ``ckpt_every`` is not an integer >= 1.
    """
    k = v.integer_at_least("ckpt_every", ckpt_every, 1)
    return (k - 1) / 2.0


def ckpt_disruption_s(step_s: float, ckpt_every: int, restart_s: float, ckpt_overhead_s: float) -> float:
    """E[C_ckpt] = C_overhead^ckpt + E[T_restart] + t_step * E[R], seconds lost per fault.

    Eq. (2). ``ckpt_overhead_s`` is the checkpoint I/O tax normalised per fault (as in the paper),
    ``restart_s`` is E[T_restart] (teardown, re-queue, init_process_group, checkpoint read), ``step_s`` is
    t_step and E[R] comes from :func:`expected_replay_steps` (Eq. 1).

    Raises ModelError if ``step_s`` <= 0, ``restart_s`` < 0, ``ckpt_overhead_s`` < 0 or ``ckpt_every`` < 1.
    """
    t = v.positive("step_s", step_s)
    r = v.non_negative("restart_s", restart_s)
    o = v.non_negative("ckpt_overhead_s", ckpt_overhead_s)
    return o + r + t * expected_replay_steps(ckpt_every)


def phoenix_disruption_s(step_s: float, hotswap_s: float, phi: float, phoenix_overhead_s: float = 0.0) -> float:
    """E[C_PHOENIX] = C_overhead^PHOENIX + E[T_hotswap] + t_step * E[phi], seconds lost per fault.

    Eq. (5). ``phi`` in [0, 1) is E[phi], the expected completed fraction of the step a fault interrupts (0.5
    when faults land uniformly inside a step): at most one partial step is replayed because the snapshot is
    committed every step. ``phoenix_overhead_s`` is C_overhead^PHOENIX; it defaults to 0 as in the paper's
    example (the per-step snapshot overlaps compute; no measurable overhead was found from 8 to 512 GPUs).

    Raises ModelError if ``step_s`` <= 0, ``hotswap_s`` < 0, ``phi`` outside [0, 1) or
    ``phoenix_overhead_s`` < 0.
    """
    t = v.positive("step_s", step_s)
    h = v.non_negative("hotswap_s", hotswap_s)
    f = v.fraction_below_one("phi", phi)
    o = v.non_negative("phoenix_overhead_s", phoenix_overhead_s)
    return o + h + t * f


def failure_rate_per_s(mttf_s: float) -> float:
    """lambda = 1 / MTTF_sys, faults per second of the whole job (Section III, before Eq. 3).

    Raises ModelError if ``mttf_s`` <= 0.
    """
    return 1.0 / v.positive("mttf_s", mttf_s)


def disruption_rate(mttf_s: float, disruption_s: float) -> float:
    """E[C_rate] = lambda * E[C], seconds of disruption per second of wall time (Eq. 3).

    Raises ModelError if ``mttf_s`` <= 0 or ``disruption_s`` < 0.
    """
    return failure_rate_per_s(mttf_s) * v.non_negative("disruption_s", disruption_s)


def efficiency(mttf_s: float, disruption_s: float) -> float:
    """eta = MTTF_sys / (MTTF_sys + E[C]): fraction of wall time that advances training (Eq. 4).

    Alternating-renewal approximation: fault-free periods of mean MTTF_sys alternate with disruptions of mean
    E[C]; faults are assumed not to strike during a disruption (see :mod:`phoenix_hpc.model.montecarlo` for a
    simulation that drops this assumption).

    Raises ModelError if ``mttf_s`` <= 0 or ``disruption_s`` < 0.
    """
    m = v.positive("mttf_s", mttf_s)
    c = v.non_negative("disruption_s", disruption_s)
    return m / (m + c)


def per_step_failure_prob(interruption_interval_s: float, nodes: int, step_s: float) -> float:
    """Per-unit, per-step failure probability p from a system interruption interval.

    If the whole system of ``nodes`` units (nodes, or failure domains such as switches) is interrupted on
    average every ``interruption_interval_s`` seconds, and every interruption is the failure of one unit with
    all units alike and independent, each unit fails as a Poisson process of rate
    1 / (interruption_interval_s * nodes). The probability that a given unit fails within one step of
    ``step_s`` seconds is then ``p = 1 - exp(-step_s / (interruption_interval_s * nodes))``
    (~= step_s / (interruption_interval_s * nodes) for small p).

    This is the derivation behind the paper's p ~= 1e-6 (Section V, before Eq. 6): an interruption every
    18 min (1080 s) on 100K GPUs = 25,000 four-GPU nodes with 20 s steps gives p = 7.4e-7, which the paper
    rounds up to 1e-6 as a conservative bound. Treating every interruption as a unit failure over-counts
    (some interruptions are transient), so the result is an upper estimate.

    Raises ModelError if any input is <= 0 or ``nodes`` is not an integer.
    """
    i = v.positive("interruption_interval_s", interruption_interval_s)
    n = v.integer_at_least("nodes", nodes, 1)
    t = v.positive("step_s", step_s)
    return -math.expm1(-t / (i * n))


def loss_bound_per_step(shards: int, p_fail: float, k: int) -> float:
    """P_loss <= D * p^(k+1): probability that some shard loses its owner and all k replicas in one step.

    Eq. (6). A shard is unrecoverable when its owner and its k replica holders fail in the same step; with
    independent failures of probability ``p_fail`` per unit per step that is p^(k+1), and the union bound
    over the D = ``shards`` shards gives D * p^(k+1). With domain-aware placement (owner and k holders in
    k+1 distinct failure domains, docs/design.md section 5) the same formula holds with the per-domain,
    per-step failure probability q in place of p. The bound is capped at 1 (a bound >= 1 says nothing).

    Raises ModelError if ``shards`` < 1, ``p_fail`` outside [0, 1] or ``k`` < 0.
    """
    d = v.integer_at_least("shards", shards, 1)
    p = v.probability("p_fail", p_fail)
    kk = v.integer_at_least("k", k, 0)
    return min(1.0, d * p ** (kk + 1))


def loss_bound_over_run(per_step: float, steps: int) -> float:
    """Union bound over a run: P(any loss in ``steps`` steps) <= steps * P_loss_per_step, capped at 1.

    This is how the paper accumulates Eq. (6) over a run (1.28e-10 x 1e5 steps = 1.28e-5; with q = 1e-4,
    128 x 1e-8 x 1e5 = 0.128). See :func:`loss_prob_over_run_independent` for the value when steps are
    independent trials.

    Raises ModelError if ``per_step`` outside [0, 1] or ``steps`` < 1.
    """
    p = v.probability("per_step", per_step)
    n = v.integer_at_least("steps", steps, 1)
    return min(1.0, n * p)


def loss_prob_over_run_independent(per_step: float, steps: int) -> float:
    """1 - (1 - P)^steps: probability of at least one loss if each step is an independent trial of prob P.

    Always <= :func:`loss_bound_over_run`; the two agree while steps * P << 1 (for P = 1.28e-6 and 1e5 steps:
    0.120 against the union bound's 0.128). Computed as -expm1(steps * log1p(-P)) to keep precision for tiny P.

    Raises ModelError if ``per_step`` outside [0, 1] or ``steps`` < 1.
    """
    p = v.probability("per_step", per_step)
    n = v.integer_at_least("steps", steps, 1)
    if p == 1.0:
        return 1.0
    return -math.expm1(n * math.log1p(-p))


def per_step_overhead_s(mttf_s: float, overhead_ratio: float) -> float:
    """PHOENIX's per-step protection tax charged per fault, seconds: ``(ratio - 1) * MTTF``.

    ``overhead_ratio`` is the measured step time with protection over without (BENCHMARKS.md section 1); in
    the MTTF seconds between two faults the steps ran that much slower, so Eq. (5)'s ``C_overhead^PHOENIX``
    gets ``(ratio - 1) * MTTF`` and, with no faults at all, efficiency tends to ``1 / ratio``. Raises ModelError
    if ``mttf_s`` <= 0 or ``overhead_ratio`` < 1 (a measured ratio below 1 is noise: pass 1)."""
    m = v.positive("mttf_s", mttf_s)
    r = v.ratio_at_least_one("overhead_ratio", overhead_ratio)
    return (r - 1.0) * m


def interval_lost_steps(protect_every: int) -> float:
    """Expected finished steps a fault loses beyond the per-step case with protection interval m
    (runtime/interval.py): a snapshot of ``S(t)`` is committed in step ``t + m``, so a fault in step
    ``t + m + i`` (i = 1..m, uniform) loses ``m + i - 1`` finished steps, on average ``(3m - 1) / 2``; the
    per-step case (m = 1) loses 1, which Eq. (5) leaves out, so the extra is ``3 (m - 1) / 2``. Raises
    ModelError if ``protect_every`` < 1."""
    m = v.integer_at_least("protect_every", protect_every, 1)
    return 1.5 * (m - 1)


def crossover_mttf_s(ckpt_disruption: float, phoenix_recovery_s: float, overhead_ratio: float) -> float:
    """The MTTF above which checkpoint-restart is more efficient than PHOENIX with a per-step overhead
    ratio (pure): solving ``1 / (ratio + a / M) = M / (M + c)`` for M with ``a`` PHOENIX's disruption per
    fault without the overhead and ``c`` checkpoint-restart's gives ``M* = (c - a) / (ratio - 1)``. ``inf``
    when PHOENIX is better at every MTTF (ratio 1 and a < c); 0 when it is better at none (a >= c)."""
    if phoenix_recovery_s >= ckpt_disruption:
        return 0.0
    if overhead_ratio <= 1.0:
        return math.inf
    return (ckpt_disruption - phoenix_recovery_s) / (overhead_ratio - 1.0)


@dataclass(frozen=True)
class SchemeCost:
    """Disruption per fault of one recovery scheme, broken into the terms of Eq. (2) or Eq. (5), seconds."""

    overhead_s: float
    recovery_s: float
    replay_s: float
    disruption_s: float
    efficiency: float
    disruption_rate: float

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class EfficiencyReport:
    """Both schemes side by side for one MTTF (Eqs. 1-5)."""

    mttf_s: float
    failure_rate_per_s: float
    expected_replay_steps: float
    checkpoint_restart: SchemeCost
    phoenix: SchemeCost
    disruption_ratio: float  # C_ckpt / C_PHOENIX (inf when C_PHOENIX is 0)
    overhead_ratio: float = 1.0  # PHOENIX's per-step overhead ratio charged (per_step_overhead_s)
    protect_every: int = 1  # PHOENIX's protection interval m (interval_lost_steps)
    crossover_mttf_s: float = math.inf  # above this MTTF checkpoint-restart wins (crossover_mttf_s)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["checkpoint_restart"] = self.checkpoint_restart.to_dict()
        d["phoenix"] = self.phoenix.to_dict()
        return d


def compare_schemes(
    *,
    mttf_s: float,
    step_s: float,
    ckpt_every: int,
    restart_s: float,
    ckpt_overhead_s: float,
    hotswap_s: float,
    phi: float,
    phoenix_overhead_s: float = 0.0,
    overhead_ratio: float = 1.0,
    protect_every: int = 1,
) -> EfficiencyReport:
    """Evaluate Eqs. (1)-(5) for checkpoint-restart and PHOENIX at one MTTF_sys.

    ``overhead_ratio`` (PHOENIX's measured per-step overhead, :func:`per_step_overhead_s`) and
    ``protect_every`` (its protection interval, :func:`interval_lost_steps`, at most ``ckpt_every``) extend
    Eq. (5); with 1 and 1 it is the paper's.

    Raises ModelError for any invalid input (see the individual formulas).
    """
    er = expected_replay_steps(ckpt_every)
    v.protection_interval("protect_every", protect_every, int(ckpt_every))
    c_ck = ckpt_disruption_s(step_s, ckpt_every, restart_s, ckpt_overhead_s)
    extra_replay = float(step_s) * interval_lost_steps(protect_every)
    c_rec = phoenix_disruption_s(step_s, hotswap_s, phi, phoenix_overhead_s) + extra_replay
    tax = per_step_overhead_s(mttf_s, overhead_ratio)
    c_px = c_rec + tax
    v.finite_result("disruption per fault (C)", {
        "mttf_s": mttf_s, "step_s": step_s, "ckpt_every": ckpt_every, "restart_s": restart_s,
        "ckpt_overhead_s": ckpt_overhead_s, "hotswap_s": hotswap_s, "phi": phi,
        "phoenix_overhead_s": phoenix_overhead_s, "overhead_ratio": overhead_ratio}, c_ck, c_px)
    ck = SchemeCost(
        overhead_s=float(ckpt_overhead_s),
        recovery_s=float(restart_s),
        replay_s=float(step_s) * er,
        disruption_s=c_ck,
        efficiency=efficiency(mttf_s, c_ck),
        disruption_rate=disruption_rate(mttf_s, c_ck),
    )
    px = SchemeCost(
        overhead_s=float(phoenix_overhead_s) + tax,
        recovery_s=float(hotswap_s),
        replay_s=float(step_s) * float(phi) + extra_replay,
        disruption_s=c_px,
        efficiency=efficiency(mttf_s, c_px),
        disruption_rate=disruption_rate(mttf_s, c_px),
    )
    return EfficiencyReport(
        mttf_s=float(mttf_s),
        failure_rate_per_s=failure_rate_per_s(mttf_s),
        expected_replay_steps=er,
        checkpoint_restart=ck,
        phoenix=px,
        disruption_ratio=(c_ck / c_px) if c_px > 0 else math.inf,
        overhead_ratio=float(overhead_ratio),
        protect_every=int(protect_every),
        crossover_mttf_s=crossover_mttf_s(c_ck, c_rec, float(overhead_ratio)),
    )


@dataclass(frozen=True)
class LossRisk:
    """Eq. (6) for one k: per-step bound, union bound over the run and the independent-steps value."""

    k: int
    per_step: float
    over_run_union_bound: float
    over_run_independent_steps: float

    def to_dict(self) -> dict:
        return asdict(self)


def loss_risk(shards: int, p_fail: float, k: int, steps: int) -> LossRisk:
    """Evaluate Eq. (6) and its accumulation over ``steps`` steps for replication factor ``k``.

    Raises ModelError for shards < 1, p_fail outside [0, 1], k < 0 or steps < 1.
    """
    per_step = loss_bound_per_step(shards, p_fail, k)
    return LossRisk(
        k=int(k),
        per_step=per_step,
        over_run_union_bound=loss_bound_over_run(per_step, steps),
        over_run_independent_steps=loss_prob_over_run_independent(per_step, steps),
    )
