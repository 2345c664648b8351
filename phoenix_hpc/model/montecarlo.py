"""Monte Carlo simulation of whole training campaigns under faults, checkpoint-restart against PHOENIX.

A campaign is ``steps`` training steps of ``step_s`` seconds (W = steps x step_s seconds of useful compute).
Each trial runs the campaign to the end under a random fault sequence, once per scheme, and records the wall
time; lost time = wall time - W. Many trials give the mean and a 95 % confidence interval (Student t on the
trial means) of the lost time, the efficiency eta = W / wall and the number of faults, and the ratio of mean
lost time checkpoint-restart / PHOENIX with a paired percentile-bootstrap 95 % interval. This answers the
objection that one trajectory with two faults (the paper's Section VII-C, 18.8x) is not a statistic.

Mechanics of one fault (progress is tracked in seconds of useful compute):

- checkpoint-restart: progress rolls back to the last checkpoint (a multiple of K x t_step), so the completed
  steps since it *and* the partial current step are lost; then ``ckpt_overhead_s`` (the per-fault overhead
  term of Eq. 2) + a draw of the restart time pass as downtime. Optionally every checkpoint write costs
  ``ckpt_write_s`` of wall time (the fault-free tax, paid per write rather than per fault; writes are not
  exposed to faults).
- PHOENIX: progress rolls back to the last completed step (only the partial step, phi x t_step, is lost);
  then ``phoenix_overhead_s`` (Eq. 5; 0 by default) + a draw of the hot-swap time pass as downtime. With a
  protection interval m > 1 (``protect_every``, held for the whole campaign: the cap's worst case) it rolls
  back further, to the newest committed snapshot (:func:`interval_rollback`): 3(m-1)/2 more steps on average,
  as :func:`phoenix_hpc.model.analytic.interval_lost_steps` charges.

Lost compute is redone, so wall = W + sum(downtime) + sum(rolled-back compute) + writes (+ slow-down, below).

Spares (``spares``, PHOENIX only; ``None``: as many as needed). Every fault needs a replacement node and the
rules of :func:`phoenix_hpc.model.spares.next_event` decide its cost: while a spare is left it is a hot swap;
the (S+1)-th fault (with S spares) is a **shrink**: a draw of ``shrink`` (default: the hot-swap law) passes as
downtime, the DP replica(s) of the dead node are removed (``dp -> dp - r``) and their healthy nodes become
spares, and from then on progress runs at ``dp' / dp0`` of full speed (the global batch is unchanged, so each
step takes ``dp0 / dp'`` times as long; perfect DP scaling assumed); the extra wall time is ``slow_s``. A
fault that would leave dp below 1 **stops** the job: progress rolls back to the last checkpoint, a draw of
the restart time passes, and the resubmitted job starts again with ``dp0`` and ``spares``. The fault rate
stays ``1 / MTTF_sys`` after a shrink (a shrunk job has fewer active nodes, so this slightly overstates its
faults).

Per-fault downtimes come from :mod:`phoenix_hpc.model.dist`: a distribution the user gives, or measured
hot-swap recoveries resampled from PHOENIX journals (their ``total_s``; it includes the measured run's own
replay phase, which the simulation then adds again as the rolled-back partial step -- a deliberate,
conservative double count of at most one step per fault).

Fault arrivals (``arrivals``): ``poisson`` -- exponential inter-arrival times of mean MTTF_sys; or
``weibull:SHAPE`` -- a bursty renewal process with Weibull inter-arrival times of the same mean (shape < 1
clusters faults; field studies of HPC systems report shapes of about 0.7-0.8 for time between failures,
Schroeder & Gibson, DSN 2006).

Fault clock (``fault_clock``): ``wall`` -- faults arrive in wall-clock time whatever the job is doing, so a
fault can strike during a restart (the restart starts over) or during replay (rolled back again); this is
the realistic setting. ``progress`` -- the inter-arrival clock runs only while the job makes new progress
(not during downtime or replay); this is exactly the alternating-renewal assumption behind Eq. (4), and with
Poisson arrivals the number of faults is then Poisson(W / MTTF_sys) and the mean lost time is
(W / MTTF_sys) x E[C] with E[C] from Eq. (5) for PHOENIX and from Eq. (2) plus t_step x E[phi] (the partial
step that Eq. 2 leaves out) for checkpoint-restart.

Randomness: one seeded ``numpy.random.Generator`` per scheme, spawned from ``SeedSequence(seed)``, so equal
seeds give identical results.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np
from scipy import special, stats

from phoenix_hpc.model import validate as v
from phoenix_hpc.model.dist import CostDist
from phoenix_hpc.model.spares import ShrinkShape

CLOCKS = ("wall", "progress")


@dataclass(frozen=True)
class Arrivals:
    """Inter-arrival law of faults: ``kind`` is ``poisson`` or ``weibull`` (then ``shape`` > 0)."""

    kind: str = "poisson"
    shape: float = 1.0

    @property
    def label(self) -> str:
        return "poisson" if self.kind == "poisson" else f"weibull:{self.shape:g}"

    def sample(self, rng: np.random.Generator, mttf_s: float, size: int) -> np.ndarray:
        """``size`` inter-arrival times in seconds with mean ``mttf_s``; shape (size,), float64."""
        if self.kind == "poisson":
            return rng.exponential(mttf_s, size)
        scale = mttf_s / special.gamma(1.0 + 1.0 / self.shape)
        return scale * rng.weibull(self.shape, size)


def parse_arrivals(spec: str) -> Arrivals:
    """``poisson`` or ``weibull:SHAPE`` (SHAPE > 0; < 1 is bursty). Raises ModelError otherwise."""
    text = str(spec).strip().lower()
    if text == "poisson":
        return Arrivals()
    kind, _, rest = text.partition(":")
    if kind == "weibull":
        try:
            shape = float(rest)
        except ValueError:
            shape = float("nan")
        if math.isfinite(shape) and shape > 0:
            return Arrivals("weibull", shape)
    raise v.fail("arrivals", spec, "expected poisson or weibull:SHAPE with SHAPE > 0 (SHAPE < 1 is bursty)")


@dataclass(frozen=True)
class Campaign:
    """Inputs of a simulation (seconds unless named otherwise); validated by :func:`simulate`."""

    mttf_s: float
    step_s: float
    steps: int
    ckpt_every: int
    restart: CostDist
    hotswap: CostDist
    ckpt_overhead_s: float = 0.0
    phoenix_overhead_s: float = 0.0
    ckpt_write_s: float = 0.0
    phoenix_overhead_ratio: float = 1.0  # PHOENIX's step time protected / unprotected (steps and replays run slower)
    protect_every: int = 1  # PHOENIX's protection interval m (interval_rollback), 1 .. ckpt_every
    arrivals: Arrivals = field(default_factory=Arrivals)
    fault_clock: str = "wall"
    trials: int = 1000
    seed: int = 0
    max_faults: int = 100_000
    spares: int | None = None  # PHOENIX spare nodes; None: unlimited (every fault a hot swap)
    dp: int = 1  # data-parallel size at the start (with spares)
    shape: ShrinkShape = field(default_factory=lambda: ShrinkShape(1, 1, 0))  # what one shrink removes/frees
    shrink: CostDist | None = None  # downtime of a shrink; None: the hot-swap law


@dataclass(frozen=True)
class Estimate:
    """Mean over trials with a 95 % confidence interval [low, high] (Student t)."""

    mean: float
    low: float
    high: float

    @staticmethod
    def of(x: np.ndarray) -> Estimate:
        x = np.asarray(x, dtype=np.float64)
        m = float(x.mean())
        if x.size < 2:
            return Estimate(m, math.nan, math.nan)
        half = float(stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
        return Estimate(m, m - half, m + half)


@dataclass(frozen=True)
class SchemeTrials:
    """Per-trial outcomes of one scheme; every array has shape (trials,), float64 seconds or counts."""

    wall_s: np.ndarray
    faults: np.ndarray
    downtime_s: np.ndarray  # restarts / hot swaps and per-fault overheads, incl. ones cut short by a fault
    replay_s: np.ndarray  # compute rolled back by faults (and redone)
    write_s: np.ndarray  # checkpoint writes
    finished: np.ndarray  # bool: False where max_faults was hit first
    slow_s: np.ndarray | None = None  # extra wall time of running shrunk (dp below dp0)
    shrinks: np.ndarray | None = None  # counts
    stops: np.ndarray | None = None  # counts (faults that found no replica left to shrink to)
    final_dp: np.ndarray | None = None
    tax_s: float = 0.0  # extra wall time of every step's protection (PHOENIX's overhead ratio)

    @property
    def lost_s(self) -> np.ndarray:
        slow = 0.0 if self.slow_s is None else self.slow_s
        return self.downtime_s + self.replay_s + self.write_s + slow + self.tax_s


@dataclass(frozen=True)
class SchemeSummary:
    lost_s: Estimate
    efficiency: Estimate
    faults: Estimate
    cost_per_fault_s: float  # pooled: total lost / total faults over all trials (nan without faults)
    downtime_s: float  # mean per trial
    replay_s: float
    write_s: float
    unfinished_trials: int
    slow_s: float = 0.0  # mean per trial
    shrinks: Estimate | None = None  # with spares only
    stops: float | None = None  # mean per trial, with spares only
    final_dp: float | None = None  # mean per trial, with spares only


@dataclass(frozen=True)
class SimulationResult:
    campaign_s: float  # W = steps x step_s
    trials: int
    seed: int
    arrivals: str
    fault_clock: str
    checkpoint_restart: SchemeSummary
    phoenix: SchemeSummary
    lost_ratio: Estimate  # mean lost ckpt / mean lost PHOENIX, paired bootstrap 95 % interval

    def to_dict(self) -> dict:
        return asdict(self)


def interval_rollback(progress: np.ndarray, step_s: float, m: int, anchor: np.ndarray | float = 0.0) -> np.ndarray:
    """Progress (s) a PHOENIX job resumes from after a fault at ``progress`` (s of useful compute) with protection
    interval ``m`` (pure; shape of ``progress``), the job having last resumed (or started) at ``anchor`` (s, a
    multiple of ``step_s``): each generation protects ``S(anchor)`` at once and then every m-th step after it,
    and a snapshot of ``S(t)`` commits in step ``t + m`` (runtime/interval.py). With ``j`` steps finished since
    the anchor, the newest committed snapshot is ``t = m floor((j - m) / m)`` steps after it (0 before the first
    commit). As in Eq. (5), the per-step case (m = 1) resumes at ``j`` (only the partial step is lost), so the
    rollback is ``j - t - 1`` finished steps more: ``m - 1`` to ``2m - 2``, ``3(m - 1)/2`` on average
    (:func:`phoenix_hpc.model.analytic.interval_lost_steps`); never below the anchor."""
    j_all = np.floor(progress / step_s)
    if m == 1:
        return j_all * step_s
    a = np.floor(np.asarray(anchor, dtype=float) / step_s + 0.5)  # the anchor in steps
    j = np.maximum(0.0, j_all - a)
    t = np.where(j >= m, m * np.floor((j - m) / m), 0.0)
    return (a + j - np.maximum(0.0, j - t - 1)) * step_s


def _run_scheme(c: Campaign, rng: np.random.Generator, rollback_s: float, dist: CostDist, overhead_s: float,
                write_every_s: float | None, elastic: bool = False, interval: int = 1) -> SchemeTrials:
    """Simulate all trials of one scheme, vectorised over trials (one loop iteration per fault).

    ``elastic``: apply the spares rules (module doc) to every fault; ``rollback_s`` is then the step and a
    stop rolls back to the checkpoint (``c.ckpt_every x c.step_s``) at the cost of a restart draw.
    ``interval``: PHOENIX's protection interval m (:func:`interval_rollback`, with ``rollback_s`` the step and
    each trial's last resume as its anchor)."""
    n = c.trials
    work = c.steps * c.step_s
    p = np.zeros(n)  # progress, s of useful compute at full dp
    hwm = np.zeros(n)  # highest progress ever reached
    anchor = np.zeros(n)  # progress the trial last resumed from (interval > 1: where its snapshots start again)
    tau = c.arrivals.sample(rng, c.mttf_s, n)  # remaining time on the fault clock
    wall = np.zeros(n)
    down = np.zeros(n)
    rep = np.zeros(n)
    wr = np.zeros(n)
    slow = np.zeros(n)
    nf = np.zeros(n, dtype=np.int64)
    n_shrink = np.zeros(n, dtype=np.int64)
    n_stop = np.zeros(n, dtype=np.int64)
    dp0 = c.dp if elastic else 1
    sp = np.full(n, c.spares if elastic else 0, dtype=np.int64)
    dpn = np.full(n, dp0, dtype=np.int64)
    active = np.ones(n, dtype=bool)
    finished = np.zeros(n, dtype=bool)
    wall_clock = c.fault_clock == "wall"
    ckpt_s = c.ckpt_every * c.step_s
    shrink_dist = c.shrink or dist

    def event(g: np.ndarray) -> np.ndarray:
        """Apply the spares rules to one fault of each trial in ``g``; return its downtime (s), shape (g.size,)."""
        d = np.full(g.size, overhead_s)
        if not elastic:
            return d + dist.sample(rng, g.size)
        hs = sp[g] > 0
        st = ~hs & (dpn[g] - c.shape.replicas < 1)
        sh = ~hs & ~st
        sp[g[hs]] -= 1
        gs = g[sh]
        dpn[gs] -= c.shape.replicas
        sp[gs] += c.shape.freed_spares
        n_shrink[gs] += 1
        gt = g[st]
        n_stop[gt] += 1
        back = np.floor(p[gt] / ckpt_s) * ckpt_s  # the stopped job resumes from its checkpoint
        rep[gt] += p[gt] - back
        p[gt] = back
        dpn[gt] = dp0
        sp[gt] = c.spares
        for mask, law in ((hs, dist), (sh, shrink_dist), (st, c.restart)):
            if mask.any():
                d[mask] += law.sample(rng, int(mask.sum()))
        return d

    while active.any():
        idx = np.flatnonzero(active)
        pi = p[idx]
        rate = dpn[idx] / dp0  # progress per wall second
        pf = (pi if wall_clock else np.maximum(pi, hwm[idx])) + rate * tau[idx]  # progress at the next fault
        done = pf >= work
        end = np.where(done, work, pf)
        seg = (end - pi) / rate
        wall[idx] += seg
        slow[idx] += seg - (end - pi)
        if write_every_s is not None and c.ckpt_write_s > 0:
            w = (np.floor(end / write_every_s) - np.floor(pi / write_every_s)) * c.ckpt_write_s
            wall[idx] += w
            wr[idx] += w
        fin = idx[done]
        p[fin] = work
        finished[fin] = True
        active[fin] = False
        f = idx[~done]
        if f.size == 0:
            continue
        pff = pf[~done]
        newp = interval_rollback(pff, rollback_s, interval, anchor[f])
        rep[f] += pff - newp
        hwm[f] = np.maximum(hwm[f], pff)
        p[f] = newp
        nf[f] += 1
        d = event(f)
        anchor[f] = p[f]  # after the event: a stop has rolled back further, to the checkpoint
        nxt = c.arrivals.sample(rng, c.mttf_s, f.size)
        if wall_clock:  # faults during the recovery restart it
            hit = np.flatnonzero(nxt < d)
            while hit.size:
                g = f[hit]
                wall[g] += nxt[hit]
                down[g] += nxt[hit]
                nf[g] += 1
                d[hit] = event(g)
                nxt[hit] = c.arrivals.sample(rng, c.mttf_s, hit.size)
                # a trial at max_faults stops here (unfinished): with an MTTF far below the recovery time
                # the faults during recoveries alone would not end (about e^(recovery / MTTF) of them)
                hit = hit[(nxt[hit] < d[hit]) & (nf[f[hit]] < c.max_faults)]
            tau[f] = nxt - d
        else:
            tau[f] = nxt
        wall[f] += d
        down[f] += d
        active[f[nf[f] >= c.max_faults]] = False
    extra = {}
    if elastic:
        extra = {"slow_s": slow, "shrinks": n_shrink.astype(np.float64), "stops": n_stop.astype(np.float64),
                 "final_dp": dpn.astype(np.float64)}
    return SchemeTrials(wall, nf.astype(np.float64), down, rep, wr, finished, **extra)


def _summarise(t: SchemeTrials, work: float) -> SchemeSummary:
    total_faults = float(t.faults.sum())
    return SchemeSummary(
        lost_s=Estimate.of(t.lost_s),
        efficiency=Estimate.of(work / t.wall_s),
        faults=Estimate.of(t.faults),
        cost_per_fault_s=float(t.lost_s.sum() / total_faults) if total_faults else math.nan,
        downtime_s=float(t.downtime_s.mean()),
        replay_s=float(t.replay_s.mean()),
        write_s=float(t.write_s.mean()),
        unfinished_trials=int((~t.finished).sum()),
        slow_s=0.0 if t.slow_s is None else float(t.slow_s.mean()),
        shrinks=None if t.shrinks is None else Estimate.of(t.shrinks),
        stops=None if t.stops is None else float(t.stops.mean()),
        final_dp=None if t.final_dp is None else float(t.final_dp.mean()),
    )


def _ratio(a: np.ndarray, b: np.ndarray, rng: np.random.Generator, resamples: int = 2000) -> Estimate:
    """mean(a) / mean(b) with a paired percentile-bootstrap 95 % interval (nan when mean(b) is 0)."""
    mb = b.mean()
    if mb == 0:
        return Estimate(math.nan, math.nan, math.nan)
    idx = rng.integers(0, a.size, size=(resamples, a.size))
    num, den = a[idx].mean(axis=1), b[idx].mean(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = num / den
    lo, hi = np.nanpercentile(r, [2.5, 97.5])
    return Estimate(float(a.mean() / mb), float(lo), float(hi))


def validate(c: Campaign) -> None:
    """Raise ModelError for the first invalid field of ``c`` (naming option, value and allowed range)."""
    v.positive("mttf_s", c.mttf_s)
    v.positive("step_s", c.step_s)
    v.integer_at_least("steps", c.steps, 1)
    v.integer_at_least("ckpt_every", c.ckpt_every, 1)
    v.non_negative("ckpt_overhead_s", c.ckpt_overhead_s)
    v.non_negative("phoenix_overhead_s", c.phoenix_overhead_s)
    v.ratio_at_least_one("overhead_ratio", c.phoenix_overhead_ratio)
    v.protection_interval("protect_every", c.protect_every, c.ckpt_every)
    v.non_negative("ckpt_write_s", c.ckpt_write_s)
    if c.fault_clock not in CLOCKS:
        raise v.fail("fault_clock", c.fault_clock, f"expected one of {', '.join(CLOCKS)}")
    v.integer_at_least("trials", c.trials, 2)
    v.integer_at_least("seed", c.seed, 0)
    v.integer_at_least("max_faults", c.max_faults, 1)
    if c.spares is not None:
        v.integer_at_least("spares", c.spares, 0)
        v.integer_at_least("dp", c.dp, 1)
        if not 1 <= c.shape.replicas <= c.dp:
            raise v.fail("shrink_replicas", c.shape.replicas, f"must be in 1..dp ({c.dp})")
        v.integer_at_least("freed_spares", c.shape.freed_spares, 0)


def run_trials(c: Campaign) -> tuple[SchemeTrials, SchemeTrials]:
    """Per-trial outcomes (checkpoint-restart, PHOENIX). Raises ModelError for invalid inputs."""
    validate(c)
    ss = np.random.SeedSequence(c.seed)
    g_ck, g_px = (np.random.default_rng(s) for s in ss.spawn(2))
    ck = _run_scheme(c, g_ck, c.ckpt_every * c.step_s, c.restart, c.ckpt_overhead_s, c.ckpt_every * c.step_s)
    r = float(c.phoenix_overhead_ratio)  # >= 1 (validate)
    cp = replace(c, step_s=c.step_s * r) if r != 1.0 else c  # every PHOENIX step (replays too) takes r x longer
    px = _run_scheme(cp, g_px, cp.step_s, c.hotswap, c.phoenix_overhead_s, None, elastic=c.spares is not None,
                     interval=c.protect_every)
    if r != 1.0:
        px = replace(px, tax_s=c.steps * c.step_s * (r - 1.0))
    return ck, px


def simulate(c: Campaign) -> SimulationResult:
    """Run ``c.trials`` campaigns for both schemes and summarise them (see the module doc).

    Raises ModelError for invalid inputs. Trials that hit ``max_faults`` stop early and are counted in
    ``unfinished_trials`` (their lost time is then a lower bound).
    """
    ck, px = run_trials(c)
    return summarise(c, ck, px)


def summarise(c: Campaign, ck: SchemeTrials, px: SchemeTrials) -> SimulationResult:
    """Summarise the per-trial outcomes of :func:`run_trials` for campaign ``c``."""
    work = c.steps * c.step_s
    boot = np.random.default_rng(np.random.SeedSequence(c.seed).spawn(3)[2])
    return SimulationResult(
        campaign_s=work,
        trials=c.trials,
        seed=c.seed,
        arrivals=c.arrivals.label,
        fault_clock=c.fault_clock,
        checkpoint_restart=_summarise(ck, work),
        phoenix=_summarise(px, work),
        lost_ratio=_ratio(ck.lost_s, px.lost_s, boot),
    )
