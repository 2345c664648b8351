#!/usr/bin/env python
"""What grows in a hot swap with the model size: the same fault (last active node killed, 4 active slots +
1 spare, pp=1) on models S and L of the benchmark (phoenix_hpc/bench/jobs.py), ``--trials`` jobs per model run
interleaved (S, L, S, L, ...) in one run on a local cluster of its own; prints, per part, the median over the
trials of the journal's phases and of the largest time any member reports (the ranks'
``recoveries[].detail``, launch/execute.py), the ratio L / S of those medians, and the ratio of "total minus
the replayed step" with a 95 % percentile-bootstrap interval (phoenix_hpc/bench/stats.median_ratio). The
measurement is phoenix_hpc/bench/by_size.py; `scripts/bench.sh` runs the same as its section `by_size`.

Usage: .venv/bin/python scripts/measure-recovery-by-size.py [--work DIR] [--sizes S,L] [--trials N]
                                                            [--update-benchmarks DIR]
  --trials N: jobs per model (default 4, as in the benchmark's section, at least 1; about 40 s each on 2 cores).
  --update-benchmarks DIR: keep the result under "recovery_by_size" in DIR/BENCHMARKS.json and render it into
  section 3 of DIR/BENCHMARKS.md (the other sections are re-rendered unchanged from the same JSON).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default=None)
    ap.add_argument("--sizes", default="S,L")
    ap.add_argument("--trials", default="4")
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
    from phoenix_hpc.bench import by_size
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
        runs = by_size.measure(ctx, tuple(sizes), trials, seed=1,
                               on_trial=lambda s, r: print(json.dumps({s: r}), flush=True))
    finally:
        lc.down(cdir)
    from phoenix_hpc.bench import jobs
    from phoenix_hpc.bench.report import by_size_lines

    repo = Path(__file__).resolve().parents[1]
    sec = by_size.section(runs, jobs.git_commit(repo), "scripts/measure-recovery-by-size.py")
    print("\n" + "\n".join(by_size_lines(sec)))  # the table and findings BENCHMARKS.md shows
    (work / "by-size.json").write_text(json.dumps(sec, indent=2))
    print(f"\n(results: {work / 'by-size.json'})")
    if a.update_benchmarks:
        update_benchmarks(Path(a.update_benchmarks), sec, repo)
    return 0


def update_benchmarks(folder: Path, sec: dict, repo: Path) -> None:
    """Keep ``sec`` as ``recovery_by_size`` in ``folder``/BENCHMARKS.json and re-render BENCHMARKS.md from it."""
    from phoenix_hpc.bench.report import _atomic_text, render_markdown, with_gpu_reports

    js = folder / "BENCHMARKS.json"
    data = json.loads(js.read_text()) if js.exists() else {}
    data["recovery_by_size"] = sec
    with_gpu_reports(data, repo)
    _atomic_text(js, json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")
    _atomic_text(folder / "BENCHMARKS.md", render_markdown(data))


if __name__ == "__main__":
    sys.exit(main())
