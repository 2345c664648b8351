"""``phoenix bench [--quick] [--sections LIST] [--out DIR] [--seed N]``: the benchmarks on a local cluster of
their own (what ``scripts/bench.sh`` runs after the set-up).

Starts an 8-node local Slurm cluster under ``.phoenix/bench/<timestamp>/cluster``, runs the sections
(:mod:`phoenix_hpc.bench.run`), writes ``BENCHMARKS.md``, ``BENCHMARKS.json`` and ``benchmarks/*.png`` into
``--out`` and stops the cluster by the PIDs it recorded, also on failure, Ctrl-C or SIGTERM.

Exit codes: 0 report written (sections that could not run say so in it); 2 bad option or no local cluster
possible (Slurm not installed, not root); 1 anything else.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import click

from phoenix_hpc.errors import BenchError


@click.command("bench")
@click.option("--quick", is_flag=True, help="under 3 minutes: overhead, memory and one hot swap")
@click.option("--sections", default="overhead,recovery,scaling,by_size", show_default=True,
              help="comma-separated subset of overhead (with memory), recovery, scaling, by_size (what grows "
                   "with the model; not in --quick mode)")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("."), show_default=True,
              help="folder for BENCHMARKS.md, BENCHMARKS.json and benchmarks/*.png")
@click.option("--seed", type=int, default=2026, show_default=True, help="seed of the random fault steps")
@click.option("--baselines", default="requeue,in-job,in-process", show_default=True,
              help="recovery section: restart baselines compared with the hot swap (comma-separated subset)")
@click.option("--ks", default="10,50,100", show_default=True,
              help="recovery section: checkpoint intervals K of the baselines (integers >= 1)")
@click.option("--trials", type=int, default=3, show_default=True,
              help="recovery section: trials per scheme and K (1 with --quick)")
def bench(quick, sections, out, seed, baselines, ks, trials):
    """Run the benchmarks on a local Slurm cluster of their own and write the report."""
    from phoenix_hpc.bench import run
    from phoenix_hpc.slurm import cluster as C

    wanted = [s for s in sections.split(",") if s]
    bad = [s for s in wanted if s not in run.SECTIONS]
    if bad or not wanted:
        raise BenchError(f"--sections: {sections!r} is not allowed; use a comma-separated subset of {list(run.SECTIONS)}")
    from phoenix_hpc.bench import baselines as B

    B.parse_baselines(baselines), B.parse_ks(ks), B.parse_trials(trials)  # bad input: exit 2 before a cluster
    base = Path(".phoenix") / "bench" / time.strftime("%Y%m%d-%H%M%S")
    base = base.absolute()
    cluster_dir = base / "cluster"

    def on_term(signum, frame):  # noqa: ARG001 - signal handler signature
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, on_term)
    click.echo(f"[bench] starting a local cluster in {cluster_dir}")
    C.up(cluster_dir, nodes=8)
    try:
        argv = ["--cluster-dir", str(cluster_dir), "--work-dir", str(base / "work"), "--out-dir", str(out),
                "--sections", ",".join(wanted), "--seed", str(seed), "--baselines", baselines, "--ks", ks] + (
                    ["--quick"] if quick else ["--trials", str(trials)])
        rc = run.main(argv)
    finally:
        C.down(cluster_dir)
        signal.signal(signal.SIGTERM, old)
    if rc:
        raise SystemExit(rc)
