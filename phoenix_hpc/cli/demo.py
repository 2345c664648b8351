"""``phoenix demo``: the main job end to end on a local Slurm cluster, with a node lost mid-run.

Starts its own local cluster (6 nodes, 2 leaf switches), builds the dataset the config reads from the
standard library if it is missing, runs the job once without faults and once with ``phoenix inject-fault
--kind kill-node`` in the middle, shows ``phoenix status``, and prints the report: final loss of both runs,
both final state hashes and whether they are identical, the recovery's time per phase, the steps replayed,
and where the timeline picture is. The cluster is stopped at the end, also on errors, Ctrl-C and SIGTERM.
See :mod:`phoenix_hpc.demo.run` for the exact sequence.

Exit codes: 0 the final state after the hot swap is identical to the fault-free one; 1 the demo ran but that
check (or a job) failed; 2 bad input or environment (not root, Slurm missing, bad option); 130 interrupted.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import click

from phoenix_hpc.cli.params import Seconds

DEFAULT_WORK_DIR = Path(".phoenix") / "demo"
DEFAULT_CONFIG = Path("examples") / "gpt-small.yaml"


def _terminate(signum, _frame):
    raise SystemExit(128 + signum)  # unwinds through the demo's finally: the cluster is stopped


@click.command("demo")
@click.option("--config", type=click.Path(dir_okay=False, path_type=Path), default=DEFAULT_CONFIG,
              show_default=True, help="job config to run (site local); each run writes only under its own run "
              "directory (checkpoint, Megatron-LM save and TensorBoard folders outside it are moved there)")
@click.option("--steps", type=click.IntRange(min=8), default=None,
              help="train this many steps instead of the config's training.steps (a shorter demo)")
@click.option("--at-step", type=int, default=None, help="the step the node dies in [default: half of the steps]")
@click.option("--node", default=None, help="the node to kill [default: the node of logical rank 1]")
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_WORK_DIR,
              show_default=True, help="folder for the demo's runs (runs/<time>/) and its cluster")
@click.option("--cluster-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="run directory of the demo's local cluster [default: WORK_DIR/cluster]")
@click.option("--max-bytes", type=click.IntRange(min=100_000), default=4_000_000, show_default=True,
              help="cap on the bytes of standard-library text in the dataset (when it must be built)")
@click.option("--timeout-s", type=Seconds(min=30), default=900.0, show_default=True,
              help="limit of each wait (a job to start, to recover, to end)")
def demo(config, steps, at_step, node, work_dir, cluster_dir, max_bytes, timeout_s):
    """Run the main job on a local Slurm cluster, kill a node mid-run, and compare with a fault-free run."""
    from phoenix_hpc.demo.run import EXIT_INTERRUPTED, Demo, DemoOptions, check_node_name, default_cluster_dir
    from phoenix_hpc.errors import DemoError

    if not config.is_file():
        raise DemoError(f"--config: {str(config)!r} does not exist; run from the repository root or pass --config")
    check_node_name(node)  # before the cluster, the data and the reference run
    opts = DemoOptions(config=config.absolute(), work_dir=work_dir.absolute(),
                       cluster_dir=(cluster_dir or default_cluster_dir(work_dir)).absolute(), steps=steps,
                       at_step=at_step, node=node, max_bytes=max_bytes, timeout_s=timeout_s)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _terminate)
    try:
        code = Demo(opts).run()
    except KeyboardInterrupt:
        click.echo("\ninterrupted; the demo's cluster was stopped", err=True)
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(code)
