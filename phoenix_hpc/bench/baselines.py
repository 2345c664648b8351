"""The recovery schemes section 2 of the benchmarks compares, and the pure arithmetic of the comparison.

Schemes (:data:`SCHEMES`), all on the same job, fault and machine (:mod:`phoenix_hpc.bench.recovery`):

* ``requeue``: checkpoint-restart that ends the job and submits it again (``mode: checkpoint-restart``,
  ``checkpoint.restart: requeue``);
* ``in-job``: the srun step is ended and a new one started inside the same allocation, every rank restores
  the newest persistent checkpoint (``checkpoint.restart: in-job``, the way an in-job restarter works);
* ``in-process``: processes stay, process groups are rebuilt, every rank loads the newest persistent
  checkpoint (``mode: phoenix``, ``recovery_source: checkpoint``: PHOENIX's own fallback path on purpose);
* ``hot-swap``: PHOENIX (``mode: phoenix``, memory replicas, one spare).

Every scheme's disruption per fault is split into the same six phases (:data:`PHASES`, seconds; their sum
is the total). The checkpoint interval K only matters to the three baselines (the steps lost since the
newest checkpoint); the hot swap replays at most the step in flight.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence

from phoenix_hpc.bench import stats as S
from phoenix_hpc.control.events import TIMED_PHASES
from phoenix_hpc.errors import BenchError

BASELINES = ("requeue", "in-job", "in-process")
SCHEMES = BASELINES + ("hot-swap",)
PHASES = ("detect", "teardown", "relaunch", "init", "load", "replay")
DEFAULT_KS = (10, 50, 100)
#: The step time of docs/design.md section 1 (the paper's 20 s steps), for the *computed* cost.
PAPER_STEP_S = 20.0
#: E[phi] of Eq. 5 (docs/design.md section 1): the completed fraction of the step in flight, lost by the hot
#: swap besides the steps it replays (``phoenix model efficiency --phi``, default 0.5).
HOTSWAP_PHI = 0.5


def parse_baselines(text: str) -> tuple[str, ...]:
    """``"requeue,in-job"`` -> ``("requeue", "in-job")``. Raises BenchError naming the allowed values for an
    unknown or empty name."""
    names = [x.strip() for x in str(text).split(",")]
    bad = [x for x in names if x not in BASELINES]
    if bad or not names:
        raise BenchError(f"--baselines: {text!r} has unknown name(s) {bad}; allowed: a comma-separated subset "
                         f"of {list(BASELINES)}")
    return tuple(dict.fromkeys(names))


def parse_ks(text: str) -> tuple[int, ...]:
    """``"10,50,100"`` -> ``(10, 50, 100)``. Raises BenchError naming the allowed values for a K that is not
    an integer >= 1."""
    out = []
    for x in str(text).split(","):
        try:
            k = int(x.strip())
        except ValueError:
            k = 0
        if k < 1:
            raise BenchError(f"--ks: {x.strip()!r} in {text!r} is not allowed; K must be an integer >= 1 "
                             "(comma-separated, e.g. 10,50,100)")
        out.append(k)
    return tuple(dict.fromkeys(out))


def parse_trials(value: int) -> int:
    """Trials per scheme and K: an integer >= 1 (>= 3 for a 95 % interval worth reading). Raises BenchError."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise BenchError(f"--trials: {value!r} is not allowed; an integer >= 1")
    return value


def journal_phases(total_s: float, journal_phases_s: Mapping[str, float]) -> dict[str, float]:
    """The six phases of an in-job recovery (hot swap or in-process restart) from the journal's
    ``recovery_done`` {total_s, phases{detect, reconfigure, params, optimizer, replay}} (pure):

    * detect = detect (fault -> ``recovery_start``);
    * teardown = total - the five journal phases: survivors abandoning the step and answering the quiesce,
      and the plan (the processes stay);
    * relaunch = 0 (no process is started);
    * init = reconfigure (process groups, MPI communicator, replication of the new generation);
    * load = params + optimizer (memory transfers for the hot swap, the checkpoint load in-process);
    * replay = replay (members past the steps lost since the recoverable step).

    The six add up to ``total_s``."""
    p = {k: float(journal_phases_s.get(k, 0.0)) for k in TIMED_PHASES}
    out = {"detect": p["detect"], "teardown": total_s - sum(p.values()), "relaunch": 0.0, "init": p["reconfigure"],
           "load": p["params"] + p["optimizer"], "replay": p["replay"]}
    return {k: round(v, 3) for k, v in out.items()}


def computed_cost(phases: Mapping[str, float], interval_steps: int, step_s: float = PAPER_STEP_S,
                  replay_steps: float | None = None) -> float:
    """*Computed, not measured*: the disruption per fault at ``step_s`` seconds a step: the measured phases
    without replay, plus ``replay_steps`` x ``step_s`` (default: the expected (K - 1) / 2 steps lost,
    :func:`phoenix_hpc.bench.stats.expected_replay_steps`; the hot swap passes its own, at most 1)."""
    steps = S.expected_replay_steps(interval_steps) if replay_steps is None else replay_steps
    return sum(v for k, v in phases.items() if k != "replay") + steps * step_s


def summarize(trials: Mapping[str, Mapping[str, Sequence[Mapping]]], hotswap: Sequence[Mapping], *,
              step_s: float = PAPER_STEP_S, seed: int = 0) -> dict:
    """Per baseline and K (pure): the trials' totals, the median phases, the ratio of mean disruption
    against the hot swap with its 95 % bootstrap interval (:func:`phoenix_hpc.bench.stats.mean_ratio`), and
    the mean restart time without replay (``restart_s``, each trial's phases but replay, averaged), and
    the computed cost at ``step_s`` s steps for both sides and its ratio (baselines: Eq. 2 with E[R] =
    (K - 1) / 2; hot swap: Eq. 5, its measured replayed steps plus E[phi] = :data:`HOTSWAP_PHI` of a step).

    ``trials``: {baseline: {K (str): [trial dicts with ``total_s`` and ``phases``]}}, failed trials (no
    ``total_s``) left out; ``hotswap``: hot-swap trials (``total_s``, ``phases`` of :data:`PHASES`,
    ``steps_replayed``). Raises nothing; a side without trials gives ``None`` figures."""
    hs = [h for h in hotswap if "total_s" in h]
    hs_tot = [float(h["total_s"]) for h in hs]
    hs_no_replay = [sum(v for k, v in h["phases"].items() if k != "replay") for h in hs]
    hs_steps = statistics.fmean(float(h.get("steps_replayed") or 0) for h in hs) if hs else None
    out: dict = {"hot-swap": {"n": len(hs), "total_s": _sample(hs_tot),
                              "phases_median": _median_phases(hs),
                              "restart_s": statistics.fmean(hs_no_replay) if hs else None,
                              "computed_at_step_s": (statistics.fmean(hs_no_replay) + (hs_steps + HOTSWAP_PHI) * step_s)
                              if hs else None,
                              "steps_replayed_mean": hs_steps}}
    for name, by_k in trials.items():
        out[name] = {}
        for k, ts in by_k.items():
            ok = [t for t in ts if "total_s" in t]
            row: dict = {"n": len(ok), "total_s": _sample([float(t["total_s"]) for t in ok]),
                         "phases_median": _median_phases(ok),
                         # mean over the trials of the disruption without its replay (what the cost model takes)
                         "restart_s": statistics.fmean(sum(v for p, v in t["phases"].items() if p != "replay")
                                                       for t in ok) if ok else None,
                         "steps_replayed": [t.get("steps_replayed") for t in ok]}
            if ok and hs:
                row["ratio"] = S.mean_ratio([float(t["total_s"]) for t in ok], hs_tot, seed=seed).as_dict()
                cost = statistics.fmean(computed_cost(t["phases"], int(k), step_s) for t in ok)
                row["computed_at_step_s"] = cost
                row["computed_ratio"] = cost / out["hot-swap"]["computed_at_step_s"]
            out[name][str(k)] = row
    out["step_s"] = step_s
    return out


def _sample(xs: Iterable[float]) -> dict | None:
    xs = list(xs)
    if not xs:
        return None
    return {"values": xs, "mean": statistics.fmean(xs), "median": statistics.median(xs), "min": min(xs),
            "max": max(xs)}


def _median_phases(trials: Sequence[Mapping]) -> dict | None:
    if not trials:
        return None
    return {p: statistics.median(float(t["phases"].get(p, 0.0)) for t in trials) for p in PHASES}
