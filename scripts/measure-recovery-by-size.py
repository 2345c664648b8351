#!/usr/bin/env python
"""What grows in a hot swap with the model size: the same fault (last active node killed, 4 active slots +
1 spare, pp=1) on models S and L of the benchmark (phoenix_hpc/bench/jobs.py), one job each, in one run on a
local cluster of its own; prints the journal's phases and, per recovery part, the largest time any member
reports (the ranks' ``recoveries[].detail``, launch/execute.py), with the ratio L / S.

Usage: .venv/bin/python scripts/measure-recovery-by-size.py [--work DIR] [--sizes S,L]
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
    a = ap.parse_args()
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
        for s in a.sizes.split(","):
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
