#!/usr/bin/env python
"""What grows in a hot swap with the model size: the same fault (last active node killed, 4 active slots +
1 spare, pp=1) on models S and L of the benchmark (phoenix_hpc/bench/jobs.py), one job each, in one run on a
local cluster of its own; prints the journal's phases and, per recovery part, the largest time any member
reports (the ranks' ``recoveries[].detail``, launch/execute.py), with the ratio L / S.

Usage: .venv/bin/python scripts/measure-recovery-by-size.py [--work DIR] [--sizes S,L] [--update-benchmarks DIR]
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
    ap.add_argument("--update-benchmarks", default=None, metavar="DIR")
    a = ap.parse_args()
    from phoenix_hpc.bench.jobs import MODEL_SIZES

    sizes = a.sizes.split(",")
    bad = [x for x in sizes if x not in MODEL_SIZES]
    if bad or len(set(sizes)) != len(sizes):
        print(f"error: --sizes: {a.sizes!r} is not allowed (allowed: distinct names of {sorted(MODEL_SIZES)}, "
              "comma-separated)", file=sys.stderr)
        return 2
    from phoenix_hpc.bench import recovery as R
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
        rows = {}
        for s in sizes:
            t = R.Trial(f"size-{s}", "phoenix", 4, s, 1, fault_step=8 + rng.randrange(5))
            res = R.run_hotswap(t, ctx)
            ctx.revive()
            rows[s] = {"total_s": res["total_s"], **{f"phase.{k}": v for k, v in res["phases"].items()},
                       **member_detail(work / "recovery" / t.name), "params": res["params"]}
            print(json.dumps({s: rows[s]}), flush=True)
    finally:
        lc.down(cdir)
    sizes = list(rows)
    keys = sorted({k for r in rows.values() for k in r if k != "params"})
    print(f"\n{'part (s)':32}" + "".join(f"{s + ' (' + format(rows[s]['params'] / 1e6, '.2f') + ' M)':>16}" for s in sizes)
          + (f"{'ratio':>10}" if len(sizes) == 2 else ""))
    for k in keys:
        vals = [rows[s].get(k) for s in sizes]
        ratio = (f"{vals[1] / vals[0]:10.2f}" if len(vals) == 2 and vals[0] and vals[1] is not None else "")
        print(f"{k:32}" + "".join(f"{'-' if v is None else format(v, '.3f'):>16}" for v in vals) + ratio)
    (work / "by-size.json").write_text(json.dumps(rows, indent=2))
    print(f"\n(results: {work / 'by-size.json'})")
    if a.update_benchmarks:
        update_benchmarks(Path(a.update_benchmarks), rows)
    return 0


def findings(rows: dict) -> list[str]:
    """The numbers the issue asks for: total minus the replayed step, and what of the difference is the lost
    rank's transfer, the survivors' rollback copy and the detection."""
    if len(rows) != 2:
        return []
    (s, a), (l, b) = rows.items()
    core = {k: v["total_s"] - v["phase.replay"] for k, v in rows.items()}
    out = [f"- total minus the replayed step: {s} {core[s]:.2f} s, {l} {core[l]:.2f} s ({core[l] / core[s]:.2f}x); "
           f"reconfigure {a['phase.reconfigure']:.2f} -> {b['phase.reconfigure']:.2f} s."]
    growth = {k: b.get(k, 0.0) - a.get(k, 0.0) for k in ("phase.detect", "phase.params", "phase.optimizer",
                                                          "rollback", "protector_allocate", "engine")}
    out.append("- of the difference: " + ", ".join(f"{k} {v:+.2f} s" for k, v in growth.items())
               + " (params and optimizer are the lost rank's bytes on the wire plus the survivors' rollback copy; "
               "engine is the joining spare's model construction; protector_allocate the new generation's host "
               "buffers).")
    return out


def update_benchmarks(folder: Path, rows: dict) -> None:
    import datetime as dt

    from phoenix_hpc.bench import jobs
    from phoenix_hpc.bench.report import _atomic_text, render_markdown

    repo = Path(__file__).resolve().parents[1]
    js = folder / "BENCHMARKS.json"
    data = json.loads(js.read_text()) if js.exists() else {}
    data["recovery_by_size"] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "commit": jobs.git_commit(repo),
        "command": "scripts/measure-recovery-by-size.py", "rows": rows, "findings": findings(rows)}
    _atomic_text(js, json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")
    _atomic_text(folder / "BENCHMARKS.md", render_markdown(data))


if __name__ == "__main__":
    sys.exit(main())
