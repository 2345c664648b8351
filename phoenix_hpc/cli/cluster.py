"""``phoenix cluster``: start, inspect and stop the local test cluster (a real Slurm on this machine).

Exit codes: 0 success; 2 bad input or environment (Slurm not installed, not root, a cluster already running
in the run directory, no cluster to stop ...), with a message and no traceback.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import click
from phoenix_hpc.cli.output import make_console
from rich.table import Table

from phoenix_hpc.slurm import cluster as lc

_RUN_DIR_HELP = (f"folder holding all of the cluster's state [default: ${lc.RUN_DIR_ENV} or "
                 f"./{lc.DEFAULT_RUN_DIR}]")


def _run_dir_option(func):
    return click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                        help=_RUN_DIR_HELP)(func)


@click.group()
def cluster() -> None:
    """A real Slurm cluster on this machine: munged, slurmctld and one slurmd per node (`slurmd -N`), all
    on 127.0.0.1, topology/tree switches, fake GPUs, PMIx. Needs root and scripts/setup.sh."""


def _print_status(info: dict) -> None:
    console = make_console()
    console.print(f"cluster in [bold]{info['run_dir']}[/]: {info['state']}, slurmctld port {info['ctld_port']}")
    nodes = Table("node", "state", "switch", "slurmd port", "slurmd", "reason")
    for n in info["nodes"]:
        nodes.add_row(n["name"], n["state"], n["switch"], str(n["port"]), "up" if n["slurmd_alive"] else "gone",
                      n["reason"])
    console.print(nodes)
    if info["switches"]:
        switches = Table("switch", "level", "nodes", "switches")
        for s in info["switches"]:
            switches.add_row(s.get("SwitchName", ""), s.get("Level", ""), s.get("Nodes", ""), s.get("Switches", ""))
        console.print(switches)
    if info.get("error"):
        console.print(f"[red]{info['error']}[/]")
    if info["state"] != "stopped":
        click.echo("point Slurm commands at it with:  "
                   + " ".join(f"export {k}={shlex.quote(v)}" for k, v in info["env"].items()))


@cluster.command()
@click.option("--nodes", type=int, default=6, show_default=True, help="number of nodes (nid00001 ...)")
@click.option("--switches", type=int, default=2, show_default=True,
              help="leaf switches of topology/tree (plus one spine)")
@click.option("--gpus-per-node", type=int, default=4, show_default=True, help="fake GPUs per node (gres gpu)")
@click.option("--cpus-per-node", type=int, default=8, show_default=True,
              help="CPUs each node claims (may exceed the machine's)")
@click.option("--slurmd-timeout", "slurmd_timeout_s", type=int, default=5, show_default=True,
              help="SlurmdTimeout in seconds: a silent node is marked DOWN after it")
@_run_dir_option
def up(nodes: int, switches: int, gpus_per_node: int, cpus_per_node: int, slurmd_timeout_s: int,
       run_dir: Path | None) -> None:
    """Start the cluster and wait until every node is idle."""
    started = lc.up(run_dir, nodes=nodes, switches=switches, gpus_per_node=gpus_per_node,
                    cpus_per_node=cpus_per_node, slurmd_timeout_s=slurmd_timeout_s)
    _print_status(lc.status(started))


@cluster.command()
@click.option("--json", "as_json", is_flag=True, help="print one JSON object (for scripts)")
@_run_dir_option
def status(as_json: bool, run_dir: Path | None) -> None:
    """Show daemons, nodes with their Slurm states, and switches (scontrol show topology)."""
    info = lc.status(lc.load_cluster(run_dir))
    if as_json:
        click.echo(json.dumps(info, indent=2))
    else:
        _print_status(info)


@cluster.command()
@_run_dir_option
def env(run_dir: Path | None) -> None:
    """Print `export SLURM_CONF=...` for this cluster (use: eval "$(phoenix cluster env)")."""
    for key, value in lc.cluster_env(lc.load_cluster(run_dir)).items():
        click.echo(f"export {key}={shlex.quote(value)}")


@cluster.command()
@click.argument("nodes", nargs=-1, required=True)
@_run_dir_option
def revive(nodes: tuple[str, ...], run_dir: Path | None) -> None:
    """Start the slurmd of NODES again (after `phoenix inject-fault --kind kill-node` took them down) and wait
    until Slurm returns them to service (idle)."""
    c = lc.load_cluster(run_dir)
    for node in nodes:
        lc.revive_node(c, node)
        click.echo(f"{node}: slurmd started again; idle")


@cluster.command()
@_run_dir_option
def down(run_dir: Path | None) -> None:
    """Cancel the cluster's jobs and stop exactly the daemons `up` started (by recorded PID)."""
    report = lc.down(run_dir)
    click.echo(f"stopped {len(report['stopped'])} daemons of the cluster in {report['run_dir']}"
               + (f" ({len(report['already_gone'])} already gone: {', '.join(report['already_gone'])})"
                  if report["already_gone"] else ""))
