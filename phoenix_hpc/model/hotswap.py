"""A hot swap at N GPUs, part by part: the formulas and the published figures they rest on (pure).

``phoenix model hotswap`` adds up, for one node loss of a job scaled to N GPUs, the parts of a hot swap
(docs/design.md section 6 for the protocol, section 13 for the shrink-based rebuild):

==================  =======================================================================================
part                formula (seconds)
==================  =======================================================================================
detection           process exit: measured here (:func:`control_plane_at` of the control-plane benchmark's
                    ``detect_exit_s``, else the local ``detect_s``); node silent: :func:`detect_heartbeat`
control round       :func:`control_plane_at` of the benchmark's ``detect_to_quiesce_s + quiesce_s +
                    plan_delivered_s``: the coordinator from the detection to the plan in every queue (its
                    quiesce round, every survivor's answer, holds ``plan_s``)
quiesce             :func:`quiesce`: leaving the abandoned step, uniform in [0, t_step / micro-batches]
rebuild             :func:`rebuild_today` (a new default group, every group initialised from scratch) or
                    :func:`rebuild_shrink` (spares in the world communicator; shrink, then split)
state transfer      :func:`transfer`: the lost rank's weights and optimizer shard over the spare node's NICs
replay              :func:`replay`: one step
total               :func:`total`: the sum of the values, of the lows and of the highs
==================  =======================================================================================

Every number is an :class:`Estimate` that says where it comes from (``origin``): measured here (this
project's benchmarks, ``BENCHMARKS.json``) or extrapolated from those measurements, measured in public (a
paper, issue or post, cited in ``source``) or scaled from such measurements by a stated law, a quoted figure
whose source could not be found (unsourced), computed (a formula from the job's config and the site
profile), or missing (the record it needs is absent: no number is made up). The published figures are
module constants, each with its source; a figure whose source could not be found is marked ``unsourced``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from phoenix_hpc.errors import ModelError

MEASURED_HERE = "measured here"
EXTRAPOLATED_HERE = "extrapolated from measurements here"
PUBLISHED = "measured in public"
SCALED_PUBLIC = "scaled from measurements in public"
UNSOURCED = "quoted figure, unsourced"
COMPUTED = "computed"
MISSING = "missing"

#: PHOENIX's own hot swap: 17 s at 64 GPUs, 29.8 s at 512, "dominated by rebuilding communicators"
#: (PHOENIX paper, arXiv 2607.01646). (GPUs, seconds).
PHOENIX_PAPER_POINTS = ((64, 17.0), (512, 29.8))
PHOENIX_PAPER_SOURCE = "PHOENIX paper, arXiv 2607.01646 (hot swap 17 s at 64 GPUs, 29.8 s at 512)"

#: Stock NCCL communicator initialisation at ~96K GPUs: ~265 s; Meta's NCCLX (scalable bootstrap, lazy
#: connection set-up) ~24 s at the same scale (Si et al., "Collective Communication for 100k+ GPUs",
#: arXiv 2510.20171). (GPUs, seconds).
NCCL_STOCK_POINT = (96_000, 265.0)
NCCL_LAZY_POINT = (96_000, 24.0)
NCCL_INIT_SOURCE = ("Si et al., NCCLX, arXiv 2510.20171 (stock NCCL init ~265 s at 96K GPUs; ~24 s with a "
                    "scalable bootstrap and lazy connections)")
#: A large-scale init of ~2.5 min on NCCL's default path, reported by a PyTorch maintainer
#: (github.com/NVIDIA/nccl issue 1156); shown beside the laws, not used in them.
NCCL_ISSUE_1156 = "NVIDIA/nccl issue 1156: ~2.5 min NCCL init 'above certain K GPUs'"

#: ``ncclCommShrink`` / ``torch.distributed.shrink_group`` taking 1.4 s at 32 GPUs to 2.0 s at 1,024. The
#: figures could not be traced to a published measurement: unsourced. The API: NCCL 2.27 (NVIDIA, "Enabling
#: Fast Inference and Resilient Training with NCCL 2.27"); torch: pytorch/pytorch PR 164518, RFC issue 164529
#: (which compares shrink with abort + init in a chart). (GPUs, seconds).
SHRINK_POINTS = ((32, 1.4), (1024, 2.0))
SHRINK_SOURCE = ("unsourced (1.4 s at 32 GPUs -> 2.0 s at 1,024: no published measurement found); API: "
                 "ncclCommShrink, NCCL 2.27; torch.distributed.shrink_group, pytorch/pytorch PR 164518, RFC 164529")

#: Hot swaps and restarts of other systems, to set the projection beside (:data:`ANCHORS`).
ANCHORS = (
    {"system": "PHOENIX (paper)", "what": "hot swap, whole", "gpus": "64 -> 512", "seconds": "17 -> 29.8",
     "source": PHOENIX_PAPER_SOURCE},
    {"system": "TrainMover", "what": "downtime of a migration or failure recovery with standby machines",
     "gpus": "1,024", "seconds": "~20",
     "source": "Lao et al., TrainMover, arXiv 2412.12636 (v3 abstract: around 20 s of downtime at 1,024 GPUs)"},
    {"system": "ElasWave", "what": "communicator recovery (in-place group edit)", "gpus": "96 NPUs",
     "seconds": "< 1",
     "source": "Kang et al., ElasWave, arXiv 2510.00606 (abstract: communicator recovery within one second)"},
    {"system": "NVRx in-job restart", "what": "restart of the workers in the same allocation", "gpus": "-",
     "seconds": "~60",
     "source": "unsourced (NVIDIA Resiliency Extension documents in-job restart, nvidia.github.io/"
               "nvidia-resiliency-ext; no published time found)"},
    {"system": "stock NCCL init", "what": "communicator initialisation", "gpus": "~96K", "seconds": "~265",
     "source": NCCL_INIT_SOURCE},
)


@dataclass(frozen=True)
class Estimate:
    """One part's time in seconds: ``seconds`` (the central value) within ``[low, high]``; all three None
    when ``origin`` is :data:`MISSING`. ``source`` names the measurement, publication or formula."""

    seconds: float | None
    low: float | None
    high: float | None
    origin: str
    source: str

    def to_dict(self) -> dict:
        return asdict(self)


def missing(reason: str) -> Estimate:
    """An estimate with no number: ``reason`` says which record is absent and how to make it."""
    return Estimate(None, None, None, MISSING, reason)


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ModelError(f"{name}: {value!r} is not allowed; expected a finite number > 0")
    return float(value)


def power_law(p1: tuple[float, float], p2: tuple[float, float]) -> tuple[float, float]:
    """``(a, b)`` of ``t = a n^b`` through the points ``(n1, t1)``, ``(n2, t2)`` (n > 0, t > 0, n1 != n2)."""
    (n1, t1), (n2, t2) = p1, p2
    b = math.log(t2 / t1) / math.log(n2 / n1)
    return t1 / n1 ** b, b


def log_law(p1: tuple[float, float], p2: tuple[float, float]) -> tuple[float, float]:
    """``(a, b)`` of ``t = a + b ln n`` through the points ``(n1, t1)``, ``(n2, t2)`` (n > 0, n1 != n2)."""
    (n1, t1), (n2, t2) = p1, p2
    b = (t2 - t1) / math.log(n2 / n1)
    return t1 - b * math.log(n1), b


def detect_heartbeat(heartbeat_timeout_s: float, heartbeat_interval_s: float,
                     backlog: Estimate | None = None) -> Estimate:
    """Detection of a node that goes silent (power loss, a hung kernel): the coordinator declares a slot dead
    ``resilience.heartbeat_timeout_s`` after its last heartbeat (docs/design.md section 6), and the node died
    up to one ``heartbeat_interval_s`` after that heartbeat, uniformly: ``[timeout - interval, timeout]``,
    central value ``timeout - interval / 2`` (computed from the job's config), plus ``backlog``: how much later
    than its timeout the coordinator declared a silent slot dead in the control-plane benchmark at this size
    (:func:`control_plane_at` of ``detect_silence_s - heartbeat_timeout_s``, measured here), added value to
    value, low to low and high to high; without it (None or missing) the sum is the config's part alone, and
    the source says the backlog is not counted.

    Raises:
        ModelError: a value that is not > 0, or an interval not below the timeout."""
    t = _positive("resilience.heartbeat_timeout_s", heartbeat_timeout_s)
    i = _positive("resilience.heartbeat_interval_s", heartbeat_interval_s)
    if i >= t:
        raise ModelError(f"resilience.heartbeat_interval_s: {i:g} is not allowed; it must be below "
                         f"heartbeat_timeout_s ({t:g})")
    own = f"heartbeat_timeout_s {t:g} s minus up to one heartbeat_interval_s {i:g} s (the job's config)"
    if backlog is None or backlog.seconds is None:
        why = f"; the coordinator's backlog beyond the timeout is not counted ({backlog.source})" if backlog else ""
        return Estimate(t - i / 2, t - i, t, COMPUTED, own + why)
    return Estimate(t - i / 2 + backlog.seconds, t - i + backlog.low, t + backlog.high,
                    f"{COMPUTED} + {backlog.origin}", f"{own}, plus the coordinator's backlog beyond the timeout: "
                    f"{backlog.source}")


def control_plane_at(points: Sequence[tuple[int, float]], gpus: int, what: str, record: str) -> Estimate:
    """A control-plane figure at ``gpus`` ranks from the benchmark's runs ``points`` (``(ranks, seconds)``,
    measured here with simulated ranks): the best law of :func:`phoenix_hpc.model.fit.fit_scaling` (constant,
    linear, log, power by AIC(c)) at ``gpus``, its 95 % prediction interval as the range. Origin: measured
    here when ``gpus`` lies within the measured rank counts, else extrapolated from them. ``record`` names where
    the points come from (said in ``source``).

    Fewer than 3 usable points (the fit needs 3): :func:`missing`, saying so."""
    from phoenix_hpc.model.fit import fit_scaling

    pts = [(int(n), float(s)) for n, s in points if s is not None and s > 0]
    if len(pts) < 3 or len({n for n, _ in pts}) < 2:
        return missing(f"{what}: {record} holds {len(pts)} usable run(s); 3 at 2 or more rank counts are needed")
    res = fit_scaling([n for n, _ in pts], [s for _, s in pts], (gpus,))
    best = res.law(res.best)
    p = best.predictions[0]
    lo, hi = min(n for n, _ in pts), max(n for n, _ in pts)
    origin = MEASURED_HERE if lo <= gpus <= hi else EXTRAPOLATED_HERE
    params = ", ".join(f"{k}={v:.4g}" for k, v in best.params.items())
    return Estimate(p.seconds, p.low, p.high, origin,
                    f"{what}: {record}, {len(pts)} runs at {lo:,}-{hi:,} simulated ranks; best law {best.law} "
                    f"({best.formula}; {params}), 95 % prediction interval")


def detection_exit(points: Sequence[tuple[int, float]] | None, gpus: int, record: str, local_detect_s,
                   local_record: str) -> Estimate:
    """Detection after a process exit at ``gpus`` ranks: the control-plane benchmark's ``detect_exit_s`` at
    that size (:func:`control_plane_at` over ``points`` from ``record``) where the record has the runs; else
    the local ``detect_s`` of ``local_record`` (the kill -> the first journal record, measured on a few slots
    of the local cluster), said so, since how it grows with the rank count is then not measured; else
    :func:`missing`."""
    if points is not None:
        return control_plane_at(points, gpus, "detection after a process exit", record)
    d = local_detect_s
    if isinstance(d, (int, float)) and not isinstance(d, bool) and math.isfinite(d) and d > 0:
        return Estimate(float(d), float(d), float(d), MEASURED_HERE,
                        f"detect_s of {local_record} (the kill -> the first journal record, a few slots on the local "
                        f"cluster); its growth with the rank count: {record}")
    return missing(f"detection after a process exit: no detect_s in {local_record} and {record}")


def quiesce(step_s: float, microbatches: int = 1) -> Estimate:
    """The survivors' quiesce: each survivor abandons the step in flight (docs/design.md section 6, step 2): its
    quiesce watchdog aborts the generation's communicators and interrupts the compute at the next module call
    (section 12, "Leaving the compute"), but a backward pass already running finishes first. The survivor
    slowest to leave is thus at most one micro-batch's work from its next module call or collective: up to
    ``step_s / microbatches`` (a micro-batch's forward and backward, an upper bound on its backward; the
    pipeline bubble ignored), uniform in ``[0, step_s / microbatches]``, central value half of it. Computed
    from the job's step time and its micro-batches per step and DP replica (global batch / (dp x micro
    batch)). The work of the abandoned step is redone by :func:`replay`, not counted here.

    Raises:
        ModelError: ``step_s`` not > 0, or ``microbatches`` not an integer >= 1."""
    s = _positive("--step-s", step_s)
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise ModelError(f"microbatches: {microbatches!r} is not allowed; expected an integer >= 1")
    m = s / microbatches
    return Estimate(m / 2, 0.0, m, COMPUTED,
                    f"the survivors leave the abandoned step at their next module call or collective: up to one "
                    f"micro-batch, t_step / m = {s:g} s / {microbatches} (docs/design.md section 12, leaving the "
                    "compute), uniform")


def replay(step_s: float) -> Estimate:
    """The replay: the interrupted step runs again once the spare has the lost rank's state (``step_s``
    seconds; docs/design.md section 6). Computed from the job's step time.

    Raises:
        ModelError: ``step_s`` not > 0."""
    s = _positive("--step-s", step_s)
    return Estimate(s, s, s, COMPUTED, f"one step, t_step = {s:g} s")


def init_laws(gpus: int) -> tuple[float, float]:
    """Stock NCCL communicator initialisation at ``gpus`` ranks, seconds, as ``(linear, power)``: two laws
    through the published ~265 s at 96K GPUs (:data:`NCCL_STOCK_POINT`):

    - linear, ``265 n / 96000``: a bootstrap all-gather of O(n) (NCCLX, arXiv 2510.20171, names the bootstrap
      and connection set-up as what grows); the lower law below 96K;
    - power, ``a n^b`` through PHOENIX's 29.8 s at 512 GPUs (arXiv 2607.01646, whose hot swap the paper says
      communicator rebuilding dominates, so its whole time is taken as the rebuild: an upper law) and the
      96K point: ``b = ln(265 / 29.8) / ln(96000 / 512)``, about 0.42.

    Raises:
        ModelError: ``gpus`` < 1."""
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ModelError(f"--gpus: {gpus!r} is not allowed; expected an integer >= 1")
    n96, t96 = NCCL_STOCK_POINT
    linear = t96 * gpus / n96
    a, b = power_law(PHOENIX_PAPER_POINTS[1], NCCL_STOCK_POINT)
    return linear, a * gpus ** b


def rebuild_today(gpus: int, lazy: bool = False) -> Estimate:
    """Today's rebuild: a new default group of ``gpus`` ranks and every model-parallel group initialised from
    scratch (docs/design.md section 6: a new generation). Range: the two laws of :func:`init_laws`; central
    value: the power law (the one through a hot swap measured end to end). Its sub-groups are not added apart:
    the paper's measurement the power law passes through includes them. ``lazy``: NCCL with a scalable
    bootstrap and lazy connection set-up (``ncclCommInitRankScalable``, several bootstrap roots, and
    connections made at first use), scaled by the published 24 s / 265 s at 96K GPUs (NCCLX, arXiv
    2510.20171, Meta's library: the ratio is its, not NCCL's).

    Raises:
        ModelError: ``gpus`` < 1."""
    linear, power = init_laws(gpus)
    f = NCCL_LAZY_POINT[1] / NCCL_STOCK_POINT[1] if lazy else 1.0
    lo, hi = sorted((linear * f, power * f))
    what = ("scalable bootstrap + lazy connections: stock x 24/265 (NCCLX at 96K)" if lazy else
            "new default group + every group from scratch")
    return Estimate(power * f, lo, hi, SCALED_PUBLIC,
                    f"{what}; laws through {NCCL_INIT_SOURCE.split(' (')[0]} (265 s at 96K) and "
                    f"{PHOENIX_PAPER_SOURCE.split(' (')[0]} (29.8 s at 512): linear {linear * f:.3g} s, power "
                    f"{power * f:.3g} s")


def shrink_s(gpus: int) -> tuple[float, float]:
    """``ncclCommShrink`` over ``gpus`` ranks, seconds, as ``(log law, power law)`` through the 1.4 s at 32
    GPUs and 2.0 s at 1,024 of :data:`SHRINK_POINTS` (unsourced figures).

    Raises:
        ModelError: ``gpus`` < 1."""
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ModelError(f"--gpus: {gpus!r} is not allowed; expected an integer >= 1")
    a, b = log_law(*SHRINK_POINTS)
    pa, pb = power_law(*SHRINK_POINTS)
    return max(0.0, a + b * math.log(gpus)), pa * gpus ** pb


def rebuild_shrink(world: int, group_kinds: int) -> Estimate:
    """The shrink-based rebuild (docs/design.md section 13): the spares are members of the world communicator
    (``world`` ranks: active + spare slots) from the start; a hot swap shrinks the dead node's ranks out of it
    (``ncclCommShrink`` with ``NCCL_SHRINK_ABORT``) and splits ``group_kinds`` new groups from the shrunk world
    (``ncclCommSplit``, one call per kind: tp, pp, dp in this project's engines), the spare in the dead rank's
    place. Cost: ``(1 + group_kinds) x`` :func:`shrink_s` ``(world)``, an assumption that a split costs what a
    shrink costs (both derive a child from a live parent without a new bootstrap; unsourced). Range: the log
    and power laws of :func:`shrink_s`.

    Raises:
        ModelError: ``world`` < 1 or ``group_kinds`` < 0."""
    if isinstance(group_kinds, bool) or not isinstance(group_kinds, int) or group_kinds < 0:
        raise ModelError(f"group_kinds: {group_kinds!r} is not allowed; expected an integer >= 0")
    lg, pw = shrink_s(world)
    k = 1 + group_kinds
    lo, hi = sorted((k * lg, k * pw))
    return Estimate(k * pw, lo, hi, UNSOURCED,
                    f"shrink + {group_kinds} splits over {world:,} ranks, each as one shrink (assumption); "
                    f"shrink {SHRINK_POINTS[0][1]} s at {SHRINK_POINTS[0][0]} -> {SHRINK_POINTS[1][1]} s at "
                    f"{SHRINK_POINTS[1][0]:,} GPUs: unsourced; log law {k * lg:.3g} s, power law {k * pw:.3g} s")


def transfer(state_bytes: float, ranks_per_node: int, nics: int, nic_gbps: float, detail: str = "") -> Estimate:
    """The state transfer: the spare node receives, for each of its ``ranks_per_node`` ranks, the lost rank's
    ``state_bytes`` (its weights and optimizer shard: :func:`phoenix_hpc.config.memory.estimate_gpu_memory`'s
    ``weights + optimizer``), over its ``nics`` NICs of ``nic_gbps`` Gb/s each (the site profile):
    ``ranks_per_node x state_bytes x 8 / (nics x nic_gbps x 1e9)``. At line rate: a lower bound (the H2H path
    moves host buffers over MPI; what it reaches on the site's link is not measured here), so the range is
    the value alone. ``detail`` is added to the source.

    Raises:
        ModelError: a count < 1 or a size / rate not > 0."""
    b = _positive("state_bytes", state_bytes)
    g = _positive("node.nic_gbps", nic_gbps)
    for name, v in (("ranks_per_node", ranks_per_node), ("node.nics", nics)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ModelError(f"{name}: {v!r} is not allowed; expected an integer >= 1")
    s = ranks_per_node * b * 8 / (nics * g * 1e9)
    return Estimate(s, s, s, COMPUTED,
                    f"{ranks_per_node} x {b / 1e9:.3g} GB{detail} over {nics} x {g:g} Gb/s, at line rate (a lower "
                    "bound)")


@dataclass(frozen=True)
class Total:
    """The sum of the parts that have a number: ``seconds``, ``low``, ``high``; ``left_out`` names the parts
    without one (:data:`MISSING`), which the sum does not hold."""

    seconds: float
    low: float
    high: float
    left_out: tuple[str, ...]

    def to_dict(self) -> dict:
        return asdict(self)


def total(parts: dict[str, Estimate]) -> Total:
    """Sum of the values, of the lows and of the highs of ``parts`` (name -> estimate); parts without a
    number are left out and named in :attr:`Total.left_out`."""
    have = {k: e for k, e in parts.items() if e.seconds is not None}
    return Total(sum(e.seconds for e in have.values()), sum(e.low for e in have.values()),
                 sum(e.high for e in have.values()), tuple(k for k in parts if k not in have))
