"""Spares, node failures and shrinks: how many spare nodes a job needs, and what running out of them costs.

All functions are pure and validate their inputs (raising :class:`phoenix_hpc.errors.ModelError` naming the
parameter, its value and the allowed range).

**Node failures.** Each of the ``N`` active nodes fails as an independent Poisson process of rate
``1 / MTTF_node``; their superposition is a Poisson process of rate ``N / MTTF_node``, so the number ``X`` of
node failures in ``T`` hours is Poisson with mean ``mu = N T / MTTF_node`` and
``P(X <= S) = sum_{j=0..S} e^-mu mu^j / j!`` (S. M. Ross, *Introduction to Probability Models*, chapter 5,
"The Exponential Distribution and the Poisson Process": the count of a Poisson process in an interval of
length t is Poisson(lambda t), and a superposition of independent Poisson processes is a Poisson process
whose rate is the sum of the rates). The CDF is evaluated with ``scipy.stats.poisson``. Failures of the
spare nodes themselves are not counted (a spare that fails in standby costs no step), and a failed node is
not repaired within the job.

**Spares needed.** The smallest ``S >= 0`` with ``P(X <= S) >= target``: with ``S`` spares, no fault of the
job has to shrink it with probability at least ``target``.

**Policy when a fault needs a replacement** (:func:`next_event`; docs/design.md section 1, "Spares and
shrinks": a job that shrinks instead of stopping must follow the same rules for the cost model to hold):

1. a spare node is left: **hot swap**; spares - 1, dp unchanged;
2. no spare left: **shrink**; the DP replica(s) that held the dead node's slots are removed
   (``dp -> dp - r``, ``r`` = :attr:`ShrinkShape.replicas`), and their nodes that held nothing else become
   spares (``spares + f``, ``f`` = :attr:`ShrinkShape.freed_spares`); the global batch is unchanged, so every
   step takes ``dp / (dp - r)`` times as long: throughput ``(dp - r) / dp`` of what it was (perfect DP
   scaling assumed);
3. the shrink would leave dp below 1: **stop** (the job ends; it is resumed from its checkpoint).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from phoenix_hpc.model import validate as v

HOT_SWAP, SHRINK, STOP = "hot_swap", "shrink", "stop"
#: more expected node failures than this in one run is refused (a unit mistake; the sums below are over it)
MAX_EXPECTED_FAILURES = 1e5


def expected_node_failures(nodes: int, mttf_node_h: float, hours: float) -> float:
    """``mu = nodes x hours / mttf_node_h``: expected node failures of ``nodes`` active nodes over ``hours``
    hours (the Poisson mean; see the module doc).

    Raises ModelError if ``nodes`` < 1, ``mttf_node_h`` <= 0 or ``hours`` <= 0.
    """
    n = v.integer_at_least("nodes", nodes, 1)
    m = v.positive("mttf_node_h", mttf_node_h)
    t = v.positive("hours", hours)
    mu = n * t / m
    if mu > MAX_EXPECTED_FAILURES:
        raise v.fail("mttf_node_h", mttf_node_h, f"nodes x hours / mttf_node_h = {mu:.3g} expected node failures "
                     f"is more than this model handles ({MAX_EXPECTED_FAILURES:g}); check the units (hours)")
    return mu


def prob_at_most(mu: float, spares: int) -> float:
    """``P(X <= spares)`` for ``X ~ Poisson(mu)``: the probability that ``spares`` spares cover every node
    failure (no shrink). ``scipy.stats.poisson.cdf``; 1.0 for ``mu == 0``.

    Raises ModelError if ``mu`` < 0 or ``spares`` < 0.
    """
    from scipy import stats

    m = v.non_negative("mu", mu)
    s = v.integer_at_least("spares", spares, 0)
    return 1.0 if m == 0 else float(stats.poisson.cdf(s, m))


def spares_needed(mu: float, target: float = 0.99) -> int:
    """Smallest ``S >= 0`` with ``P(X <= S) >= target`` for ``X ~ Poisson(mu)`` (the module doc).

    ``scipy.stats.poisson.ppf`` gives the candidate; the CDF is checked around it so that a rounding error
    of the quantile cannot return one spare too few or too many.

    Raises ModelError if ``mu`` < 0 or ``target`` is not strictly between 0 and 1.
    """
    from scipy import stats

    m = v.non_negative("mu", mu)
    t = v.open_unit("target", target)
    if m == 0:
        return 0
    s = max(0, int(stats.poisson.ppf(t, m)))
    while prob_at_most(m, s) < t:
        s += 1
    while s > 0 and prob_at_most(m, s - 1) >= t:
        s -= 1
    return s


def shrink_throughput(dp: int, replicas: int = 1) -> float:
    """``(dp - replicas) / dp``: throughput after one shrink relative to before it (global batch fixed,
    perfect DP scaling). 0.0 when the shrink would leave no replica (the job stops instead).

    Raises ModelError if ``dp`` < 1 or ``replicas`` < 1.
    """
    d = v.integer_at_least("dp", dp, 1)
    r = v.integer_at_least("replicas", replicas, 1)
    return max(0, d - r) / d


@dataclass(frozen=True)
class ShrinkShape:
    """What one shrink removes and frees, from the grid and the node layout.

    ``replicas``: DP replicas that hold slots of one failed node (removed by the shrink);
    ``nodes_per_shrink``: nodes those replicas occupy; ``freed_spares``: of these, the healthy nodes that
    held nothing else, which become spares.
    """

    replicas: int
    nodes_per_shrink: int
    freed_spares: int

    def to_dict(self) -> dict:
        return asdict(self)


def shrink_shape(tp: int, pp: int, dp: int, gpus_per_node: int) -> ShrinkShape:
    """The :class:`ShrinkShape` of a grid whose ranks fill nodes in order, ``gpus_per_node`` each (the
    generation-0 layout: rank ``(pp_i x dp + dp_i) x tp + tp_i``, :mod:`phoenix_hpc.topology`), for a failure
    of the first node.

    Example: tp=4, pp=2, 4 GPUs per node: a replica is 2 nodes, one shrink removes 1 replica and frees 1
    spare. tp=1, pp=4, 1 GPU per node: 1 replica, 4 nodes, 3 freed spares.

    Raises ModelError if a size is < 1 or ``tp x pp x dp`` is not a multiple of ``gpus_per_node``.
    """
    from phoenix_hpc.topology import coord_of

    t, p, d = (v.integer_at_least(n, x, 1) for n, x in (("tp", tp), ("pp", pp), ("dp", dp)))
    g = v.integer_at_least("gpus_per_node", gpus_per_node, 1)
    world = t * p * d
    if world % g:
        raise v.fail("gpus_per_node", g, f"must divide tp x pp x dp = {world}")
    from phoenix_hpc.topology import GridCoord, rank_of

    hit = {coord_of(r, t, p, d).dp for r in range(g)}  # node 0 holds ranks 0..g-1
    used = {rank_of(GridCoord(pi, di, ti), t, p, d) // g for di in hit for pi in range(p) for ti in range(t)}
    freed = [n for n in used if n != 0 and all(coord_of(r, t, p, d).dp in hit for r in range(n * g, n * g + g))]
    return ShrinkShape(replicas=len(hit), nodes_per_shrink=len(used), freed_spares=len(freed))


def next_event(spares: int, dp: int, shape: ShrinkShape) -> tuple[str, int, int]:
    """What the next fault that needs a replacement node costs: ``(event, spares_after, dp_after)`` with
    ``event`` one of ``hot_swap``, ``shrink``, ``stop`` (rules in the module doc). On ``stop`` the counts are
    returned unchanged. Pure."""
    if spares > 0:
        return HOT_SWAP, spares - 1, dp
    if dp - shape.replicas < 1:
        return STOP, spares, dp
    return SHRINK, spares + shape.freed_spares, dp - shape.replicas


def events_for(faults: int, spares: int, dp: int, shape: ShrinkShape) -> list[tuple[str, int, int]]:
    """The events of ``faults`` successive node failures starting from ``spares`` spares and ``dp``
    (:func:`next_event` applied in turn; it stops at the first ``stop``). Pure."""
    out, s, d = [], spares, dp
    for _ in range(faults):
        ev, s, d = next_event(s, d, shape)
        out.append((ev, s, d))
        if ev == STOP:
            break
    return out


@dataclass(frozen=True)
class SparesPlan:
    """Result of :func:`plan_spares` (times in hours, probabilities in [0, 1])."""

    nodes: int
    mttf_node_h: float
    hours: float
    target: float
    expected_failures: float
    spares_needed: int
    by_spares: tuple[tuple[int, float], ...]  # (S, P(no shrink with S spares)), S = needed - 6 .. needed + 2 (>= 0)
    dp: int | None = None
    shape: ShrinkShape | None = None
    throughput_after_shrink: float | None = None  # (dp - r) / dp
    lost_per_shrink: float | None = None  # r / dp
    spares: int | None = None  # the job's spares, when given
    p_no_shrink: float | None = None  # with the job's spares
    expected_shrinks: float | None = None  # with the job's spares (and the shrink shape)
    p_stop: float | None = None  # probability that the faults exhaust every replica
    mean_throughput: float | None = None  # over the run, relative to no shrink (with the job's spares)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["by_spares"] = [{"spares": s, "p_no_shrink": p} for s, p in self.by_spares]
        return d


def shrink_statistics(mu: float, spares: int, dp: int, shape: ShrinkShape, tail: float = 1e-12) -> tuple[float, float]:
    """``(E[shrinks], P(stop))`` over ``X ~ Poisson(mu)`` node failures, following :func:`next_event` from
    ``spares`` spares and ``dp`` replicas: ``sum_x P(X = x) x shrinks(x)``, summed until the Poisson tail
    left is below ``tail``. Pure."""
    from scipy import stats

    import numpy as np

    m = v.non_negative("mu", mu)
    if m == 0:
        return 0.0, 0.0
    evs = events_for(_horizon(m, tail), spares, dp, shape)
    shrinks_by = np.concatenate([[0], np.cumsum([ev == SHRINK for ev, _, _ in evs])]).astype(np.float64)
    # P(X = x) for x < len(evs), then P(X >= len(evs)) for the last count (after a stop nothing changes)
    x = np.arange(len(evs))
    w = np.append(stats.poisson.pmf(x, m), stats.poisson.sf(len(evs) - 1, m))
    exp_shrinks = float(w @ shrinks_by)
    p_stop = float(stats.poisson.sf(len(evs) - 1, m)) if evs and evs[-1][0] == STOP else 0.0
    return exp_shrinks, p_stop


def _horizon(mu: float, tail: float) -> int:
    """Failure counts beyond this have Poisson probability below ``tail``."""
    from scipy import stats

    return int(stats.poisson.isf(tail, mu)) + 1


def mean_throughput(mu: float, spares: int, dp: int, shape: ShrinkShape, tail: float = 1e-12) -> float:
    """Expected throughput over a run of fixed length (the time limit), relative to a run without shrinks:
    ``E[(1/T) int_0^T dp(t) / dp dt]`` with ``dp(t)`` after the node failures up to ``t`` (:func:`events_for`;
    0 once the job stopped).

    With ``N(t) ~ Poisson(mu t / T)``, ``(1/T) int_0^T P(N(t) = x) dt = P(X >= x + 1) / mu`` for
    ``X ~ Poisson(mu)`` (the (x+1)-th failure time is Erlang(x+1); Ross, chapter 5), so the result is
    ``sum_x dp_after(x) / dp x P(X >= x + 1) / mu``, summed until the Poisson tail left is below ``tail``.
    Recovery downtime is not counted here (see :mod:`phoenix_hpc.model.montecarlo`). 1.0 for ``mu == 0``.
    Pure.
    """
    from scipy import stats

    import numpy as np

    m = v.non_negative("mu", mu)
    d0 = v.integer_at_least("dp", dp, 1)
    if m == 0:
        return 1.0
    evs = events_for(_horizon(m, tail), spares, d0, shape)
    frac = np.array([d0] + [0 if ev == STOP else d for ev, _, d in evs], dtype=np.float64) / d0
    sf = stats.poisson.sf(np.arange(len(evs)), m)
    # counts from len(evs) on keep the last value: sum_{x >= L} P(X > x) = mu - sum_{x < L} P(X > x)
    return float(frac[:-1] @ sf + frac[-1] * max(0.0, m - float(sf.sum()))) / m


def plan_spares(nodes: int, mttf_node_h: float, hours: float, target: float = 0.99, *, dp: int | None = None,
                shape: ShrinkShape | None = None, spares: int | None = None) -> SparesPlan:
    """Spares needed for ``nodes`` active nodes of ``mttf_node_h`` over ``hours`` at probability ``target``;
    with ``dp`` the throughput kept after a shrink; with ``spares`` too, the job's own odds.

    Raises ModelError for any invalid input (field, value and what is allowed).
    """
    mu = expected_node_failures(nodes, mttf_node_h, hours)
    need = spares_needed(mu, target)
    rows = tuple((s, prob_at_most(mu, s)) for s in range(max(0, need - 6), need + 3))
    if dp is None:
        return SparesPlan(nodes, float(mttf_node_h), float(hours), float(target), mu, need, rows)
    d = v.integer_at_least("dp", dp, 1)
    sh = shape or ShrinkShape(replicas=1, nodes_per_shrink=1, freed_spares=0)
    kept = shrink_throughput(d, sh.replicas)
    extra: dict = {}
    if spares is not None:
        s = v.integer_at_least("spares", spares, 0)
        e_shr, p_stop = shrink_statistics(mu, s, d, sh)
        extra = {"spares": s, "p_no_shrink": prob_at_most(mu, s), "expected_shrinks": e_shr, "p_stop": p_stop,
                 "mean_throughput": mean_throughput(mu, s, d, sh)}
    return SparesPlan(nodes, float(mttf_node_h), float(hours), float(target), mu, need, rows, dp=d, shape=sh,
                      throughput_after_shrink=kept, lost_per_shrink=1.0 - kept, **extra)

