"""What grows in a hot swap with the model size (BENCHMARKS.md section 3, "what grows with the model").

The same fault (the last active node killed, 4 active slots + 1 spare, pp=1) on two models of
:data:`phoenix_hpc.bench.jobs.MODEL_SIZES`, ``trials`` jobs per model run interleaved (S, L, S, L, ...) so that
a drift of the shared machine hits both alike. Per part: the median over the trials of the journal's phases
and of the largest time any member reports (the ranks' ``recoveries[].detail``, :mod:`phoenix_hpc.launch.execute`);
the ratio "total minus the replayed step" of the larger model to the smaller with a 95 % percentile-bootstrap
interval (:func:`phoenix_hpc.bench.stats.median_ratio`).

Run by ``scripts/bench.sh`` (section ``by_size``, on the benchmark's cluster) and by
``scripts/measure-recovery-by-size.py`` (on a cluster of its own).
"""

from __future__ import annotations

import datetime as _dt
import json
import random
import statistics
from pathlib import Path
from typing import Callable

DEFAULT_SIZES = ("S", "L")
DEFAULT_TRIALS = 4
#: The parts whose growth the findings list, smaller model -> larger.
GROWTH_PARTS = ("phase.detect", "journal.quiesce", "leave", "quiesce", "phase.params", "phase.optimizer",
                "wire.params", "wire.optimizer", "engine", "rollback", "protector_arrive", "protector_allocate")


def member_detail(run_dir: Path) -> dict[str, float]:
    """Per detail key of the members' last recovery (``ranks/rank*.json``), the largest value over the
    members, seconds; the phase timings under ``timing.<phase>``."""
    out: dict[str, float] = {}
    for p in sorted((run_dir / "ranks").glob("rank*.json")):
        recs = json.loads(p.read_text()).get("recoveries") or []
        if not recs:
            continue
        last = recs[-1]
        for k, v in {**last.get("detail", {}), **{f"timing.{a}": b for a, b in last.get("timings", {}).items()}}.items():
            out[k] = max(out.get(k, 0.0), float(v))
    return out


def measure(ctx, sizes: tuple[str, ...] = DEFAULT_SIZES, trials: int = DEFAULT_TRIALS, seed: int = 1,
            on_trial: Callable[[str, dict], None] | None = None) -> dict[str, list[dict]]:
    """Run ``trials`` hot-swap jobs per model of ``sizes``, interleaved, on ``ctx``
    (:class:`phoenix_hpc.bench.run.Context`); returns, per model, one dict per trial: ``total_s``, the
    journal's phases (``phase.<name>``), the killed slot's exit and memory, the coordinator's quiesce
    (``journal.quiesce``), :func:`member_detail` and ``params``. ``on_trial(size, trial)`` is called after each.

    Raises:
        BenchError: a trial's recovery did not complete (:func:`phoenix_hpc.bench.recovery.run_hotswap`)."""
    from phoenix_hpc.bench import recovery as R
    from phoenix_hpc.bench.report import BY_SIZE_MIB

    rng = random.Random(seed)
    runs: dict[str, list[dict]] = {s: [] for s in sizes}
    for i in range(trials):
        for s in sizes:
            t = R.Trial(f"size-{s}-{i}", "phoenix", 4, s, 1, fault_step=8 + rng.randrange(5))
            try:
                res = R.run_hotswap(t, ctx)
            finally:
                ctx.revive()
            runs[s].append({"total_s": res["total_s"], **{f"phase.{k}": v for k, v in res["phases"].items()},
                            "kill.slot_exit": res.get("slot_exit_s"),
                            **{k: res.get(k) for k in BY_SIZE_MIB},
                            "journal.quiesce": (res.get("marks") or {}).get("quiesce_s"),
                            **member_detail(ctx.work / "recovery" / t.name), "params": res["params"]})
            if on_trial is not None:
                on_trial(s, runs[s][-1])
    return runs


def median_rows(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Per model, the median over its trials of every part (a part missing from a trial counts as absent),
    plus ``trials``, ``core_s`` (each trial's total minus its replayed step) and ``recovery_s`` (each trial's
    total minus its replayed step and its detection: from the first record of the fault to the end). Pure."""
    from phoenix_hpc.bench.report import BY_SIZE_FACTS, BY_SIZE_MIB

    rows = {}
    for s, rs in runs.items():
        # every part's seconds and the killed slot's memory (MiB), as medians
        keys = sorted({k for r in rs for k in r if k not in BY_SIZE_FACTS or k in BY_SIZE_MIB})
        vals = {k: [r[k] for r in rs if r.get(k) is not None] for k in keys}
        rows[s] = {k: statistics.median(v) for k, v in vals.items() if v}
        rows[s]["params"] = rs[0]["params"]
        rows[s]["trials"] = len(rs)
        rows[s]["core_s"] = [round(r["total_s"] - r["phase.replay"], 3) for r in rs]
        rows[s]["recovery_s"] = [round(r["total_s"] - r["phase.replay"] - r["phase.detect"], 3) for r in rs]
    return rows


def _ratio_line(what: str, s: str, xs: list[float], l: str, xl: list[float]) -> str:
    from phoenix_hpc.bench.stats import median_ratio

    r = median_ratio(xl, xs)
    return (f"- {what}, median of {len(xs)} and {len(xl)} trials: {s} {statistics.median(xs):.2f} s (trials "
            f"{', '.join(f'{x:.2f}' for x in xs)}), {l} {statistics.median(xl):.2f} s (trials "
            f"{', '.join(f'{x:.2f}' for x in xl)}): {r.value:.2f}x [95 % CI {r.lo:.2f}, {r.hi:.2f}]")


def findings(rows: dict) -> list[str]:
    """The lines section 3 reports under the table (pure, ``rows`` from :func:`median_rows`): total minus the
    replayed step, the same without the detection, what of the difference is the victim's own exit, the lost
    rank's transfer and the work overlapped with it. Empty unless exactly two models were measured."""
    from phoenix_hpc.bench.report import BY_SIZE_MIB

    if len(rows) != 2:
        return []
    (s, a), (l, b) = rows.items()
    out = [_ratio_line("total minus the replayed step", s, a["core_s"], l, b["core_s"])
           + f"; reconfigure {a['phase.reconfigure']:.2f} -> {b['phase.reconfigure']:.2f} s.",
           _ratio_line("the same without the detection (first record of the fault -> past the replayed step)",
                       s, a["recovery_s"], l, b["recovery_s"]) + "."]
    if "kill.slot_exit" in a and "kill.slot_exit" in b:
        mem = ""
        if all(k in r for r in (a, b) for k in BY_SIZE_MIB):
            mem = (f" (the killed slot resident {a['slot_rss_mib']:.0f} -> {b['slot_rss_mib']:.0f} MiB, of it in "
                   f"transparent huge pages {a['slot_huge_mib']:.0f} -> {b['slot_huge_mib']:.0f} MiB)")
        out.append(f"- detect (the kill -> the first journal record) {a['phase.detect']:.2f} -> {b['phase.detect']:.2f} s "
                   f"follows the killed slot's own exit (SIGKILL -> its last thread gone, which is when the kernel "
                   f"closes its sockets, after freeing its memory): {a['kill.slot_exit']:.2f} -> "
                   f"{b['kill.slot_exit']:.2f} s{mem}. Freeing grows with the memory in 4 KiB pages, far less with "
                   "that in 2 MiB pages (launcher.torch_huge_pages); a node that loses power is found by heartbeat "
                   "timeout instead.")
    growth = {k: b.get(k, 0.0) - a.get(k, 0.0) for k in GROWTH_PARTS}
    out.append("- of the difference: " + ", ".join(f"{k} {v:+.2f} s" for k, v in growth.items())
               + " (journal.quiesce: recovery_start -> recovery_plan, the coordinator's wait for every "
               "survivor's quiesced, and no less than one coordinator tick; leave: a survivor's time from the interrupt "
               "(just after the watchdog's abort) to out of its step (launch/interrupt.py); quiesce: from out "
               "of the step to its quiesced (groups released, protector closed, copies verified again); "
               "params and optimizer: the spare's wait for the lost rank's bytes once its engine is built, "
               "then their verification and load into the engine; wire.*: each kind's whole time on the wire, "
               "which overlaps the spare's engine construction (engine) and the survivors' rollback; "
               "protector_arrive: the wait at the new protector's first collective for the slowest member; "
               "protector_allocate: the new generation's host buffers).")
    return out


def section(runs: dict[str, list[dict]], commit: str, command: str) -> dict:
    """The ``recovery_by_size`` entry of BENCHMARKS.json for ``runs`` (:func:`measure`): date, commit,
    the command that measured it, the per-model medians, every trial and :func:`findings`."""
    rows = median_rows(runs)
    return {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "commit": commit,
            "command": command, "rows": rows, "runs": runs, "findings": findings(rows)}

