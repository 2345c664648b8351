#!/usr/bin/env python
"""What grows in a hot swap with the model size: the same fault (last active node killed, 4 active slots +
1 spare, pp=1) on models S and L of the benchmark (phoenix_hpc/bench/jobs.py), ``--trials`` jobs per model run
interleaved (S, L, S, L, ...) in one run on a local cluster of its own; prints, per part, the median over the
trials of the journal's phases and of the largest time any member reports (the ranks'
``recoveries[].detail``, launch/execute.py), the ratio L / S of those medians, and the ratio of "total minus
the replayed step" with a 95 % percentile-bootstrap interval (phoenix_hpc/bench/stats.median_ratio).

Usage: .venv/bin/python scripts/measure-recovery-by-size.py [--work DIR] [--sizes S,L] [--trials N]
                                                            [--update-benchmarks DIR]
  --trials N: jobs per model (default 3, at least 1; about 40 s each on 2 cores).
  --update-benchmarks DIR: keep the result under "recovery_by_size" in DIR/BENCHMARKS.json and render it into
  section 3 of DIR/BENCHMARKS.md (the other sections are re-rendered unchanged from the same JSON).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path


def member_detail(run_dir: Path) -> dict[str, float]:
    """Per detail key, the largest value over the members' last recovery (seconds)."""
    out: dict[str, float] = {}
    for p in sorted((run_dir / "ranks").glob("rank*.json")):
        recs = json.loads(p.read_text()).get("recoveries") or []
        if not recs:
            continue
        for k, v in {**recs[-1].get("detail", {}), **{f"timing.{a}": b for a, b in recs[-1].get("timings", {}).items()}}.items():
            out[k] = max(out.get(k, 0.0), float(v))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default=None)
    ap.add_argument("--sizes", default="S,L")
    ap.add_argument("--trials", default="3")
    ap.add_argument("--update-benchmarks", default=None, metavar="DIR")
    a = ap.parse_args()
    from phoenix_hpc.bench.jobs import MODEL_SIZES

    sizes = a.sizes.split(",")
    bad = [x for x in sizes if x not in MODEL_SIZES]
    if bad or len(set(sizes)) != len(sizes):
        print(f"error: --sizes: {a.sizes!r} is not allowed (allowed: distinct names of {sorted(MODEL_SIZES)}, "
              "comma-separated)", file=sys.stderr)
        return 2
    trials = int(a.trials) if a.trials.isdigit() else 0
    if trials < 1:
        print(f"error: --trials: {a.trials!r} is not allowed (allowed: a whole number >= 1)", file=sys.stderr)
        return 2
    from phoenix_hpc.bench import recovery as R
    from phoenix_hpc.bench.report import BY_SIZE_FACTS, BY_SIZE_MIB
    from phoenix_hpc.bench.run import Context
    from phoenix_hpc.data.prepare import prepare_dataset, stdlib_dir
    from phoenix_hpc.slurm import cluster as lc
    from phoenix_hpc.slurm.client import SlurmClient

    work = Path(a.work or tempfile.mkdtemp(prefix="phoenix-by-size-")).absolute()
    cdir = work / "cluster"
    cluster = lc.up(cdir, nodes=6, switches=2, gpus_per_node=4)
    try:
        data = work / "data" / "stdlib"
        if not Path(str(data) + ".idx").exists():
            prepare_dataset(stdlib_dir(), data, max_bytes=4_000_000)
        ctx = Context(cluster=cluster, client=SlurmClient(env=cluster.env), env=cluster.env, work=work,
                      data_path=str(data), log=lambda m: print(m, flush=True))
        rng = random.Random(1)
        runs: dict[str, list[dict]] = {s: [] for s in sizes}
        for i in range(trials):
            for s in sizes:  # interleaved, so that a drift of the shared machine hits every model alike
                t = R.Trial(f"size-{s}-{i}", "phoenix", 4, s, 1, fault_step=8 + rng.randrange(5))
                res = R.run_hotswap(t, ctx)
                ctx.revive()
                runs[s].append({"total_s": res["total_s"], **{f"phase.{k}": v for k, v in res["phases"].items()},
                                "kill.slot_exit": res.get("slot_exit_s"),
                                **{k: res.get(k) for k in BY_SIZE_MIB},
                                "journal.quiesce": (res.get("marks") or {}).get("quiesce_s"),
                                **member_detail(work / "recovery" / t.name), "params": res["params"]})
                print(json.dumps({s: runs[s][-1]}), flush=True)
    finally:
        lc.down(cdir)
    rows = median_rows(runs)
    keys = sorted({k for r in rows.values() for k in r if k not in BY_SIZE_FACTS})
    print(f"\n{'part (s)':32}" + "".join(f"{s + ' (' + format(rows[s]['params'] / 1e6, '.2f') + ' M)':>16}" for s in sizes)
          + (f"{'ratio':>10}" if len(sizes) == 2 else ""))
    for k in keys:
        vals = [rows[s].get(k) for s in sizes]
        ratio = (f"{vals[1] / vals[0]:10.2f}" if len(vals) == 2 and vals[0] and vals[1] is not None else "")
        print(f"{k:32}" + "".join(f"{'-' if v is None else format(v, '.3f'):>16}" for v in vals) + ratio)
    for line in findings(rows):
        print(line)
    (work / "by-size.json").write_text(json.dumps({"rows": rows, "runs": runs}, indent=2))
    print(f"\n(results: {work / 'by-size.json'})")
    if a.update_benchmarks:
        update_benchmarks(Path(a.update_benchmarks), rows, runs)
    return 0


def median_rows(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Per model, the median over its trials of every part (a part missing from a trial counts as absent),
    plus ``trials``, ``core_s`` (each trial's total minus its replayed step) and ``recovery_s`` (each trial's
    total minus its replayed step and its detection: from the first record of the fault to the end)."""
    import statistics

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
    return (f"- {what}, median of {len(xs)} and {len(xl)} trials: {s} {median(xs):.2f} s (trials "
            f"{', '.join(f'{x:.2f}' for x in xs)}), {l} {median(xl):.2f} s (trials {', '.join(f'{x:.2f}' for x in xl)}): "
            f"{r.value:.2f}x [95 % CI {r.lo:.2f}, {r.hi:.2f}]")


def findings(rows: dict) -> list[str]:
    """The numbers section 3 reports: total minus the replayed step, the same without the detection, and
    what of the difference is the victim's own exit, the lost rank's transfer and the work overlapped with it."""
    from phoenix_hpc.bench.report import BY_SIZE_MIB

    if len(rows) != 2:
        return []
    (s, a), (l, b) = rows.items()
    cs, cl = a.get("core_s") or [a["total_s"] - a["phase.replay"]], b.get("core_s") or [b["total_s"] - b["phase.replay"]]
    out = [_ratio_line("total minus the replayed step", s, cs, l, cl)
           + f"; reconfigure {a['phase.reconfigure']:.2f} -> {b['phase.reconfigure']:.2f} s."]
    if a.get("recovery_s") and b.get("recovery_s"):
        out.append(_ratio_line("the same without the detection (first record of the fault -> past the replayed "
                               "step)", s, a["recovery_s"], l, b["recovery_s"]) + ".")
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
    growth = {k: b.get(k, 0.0) - a.get(k, 0.0) for k in ("phase.detect", "journal.quiesce", "leave", "quiesce",
                                                          "phase.params", "phase.optimizer",
                                                          "wire.params", "wire.optimizer", "engine", "rollback",
                                                          "protector_arrive", "protector_allocate")}
    out.append("- of the difference: " + ", ".join(f"{k} {v:+.2f} s" for k, v in growth.items())
               + " (journal.quiesce: recovery_start -> recovery_plan, the coordinator's wait for every "
               "survivor's quiesced, plus up to one coordinator tick; leave: a survivor's time from the interrupt "
               "(just after the watchdog's abort) to out of its step (launch/interrupt.py); quiesce: from out "
               "of the step to its quiesced (groups released, protector closed, copies verified again); "
               "params and optimizer: the spare's wait for the lost rank's bytes once its engine is built, "
               "then their verification and load into the engine; wire.*: each kind's whole time on the wire, "
               "which overlaps the spare's engine construction (engine) and the survivors' rollback; "
               "protector_arrive: the wait at the new protector's first collective for the slowest member; "
               "protector_allocate: the new generation's host buffers).")
    return out


def median(xs: list[float]) -> float:
    import statistics

    return statistics.median(xs)


def update_benchmarks(folder: Path, rows: dict, runs: dict) -> None:
    import datetime as dt

    from phoenix_hpc.bench import jobs
    from phoenix_hpc.bench.report import _atomic_text, render_markdown, with_gpu_reports

    repo = Path(__file__).resolve().parents[1]
    js = folder / "BENCHMARKS.json"
    data = json.loads(js.read_text()) if js.exists() else {}
    data["recovery_by_size"] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "commit": jobs.git_commit(repo),
        "command": "scripts/measure-recovery-by-size.py", "rows": rows, "runs": runs,
        "findings": findings(rows)}
    with_gpu_reports(data, repo)
    _atomic_text(js, json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")
    _atomic_text(folder / "BENCHMARKS.md", render_markdown(data))


if __name__ == "__main__":
    sys.exit(main())
