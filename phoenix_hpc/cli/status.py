"""``phoenix status [JOBID | RUN_DIR]``: a PHOENIX job's Slurm state, slots, replicas, spares, recoveries.

Without an argument: the most recent job of the Slurm cluster this command talks to (newest entry of
``~/.phoenix/runs.jsonl`` and ``./runs/*/job.json`` recorded for that cluster or confirmed by its Slurm, see
:mod:`phoenix_hpc.status.runs`; none: exit code 2). Reading the status never changes the job (only ``--cancel`` does,
after confirmation). Works while the job runs and after it ended (from the journal).

Exit codes: 0 shown; 2 bad input (unknown job id, not a PHOENIX run directory, unwritable ``--plot``);
1 ``--cancel`` declined.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from phoenix_hpc.cli.params import Seconds
from phoenix_hpc.errors import StatusError


def _load(target: str | None):
    from phoenix_hpc.slurm.client import SlurmClient
    from phoenix_hpc.status.collect import collect_status
    from phoenix_hpc.status.runs import find_run

    client = SlurmClient()
    run_dir = find_run(target, slurm=client)
    return run_dir, client, (lambda: collect_status(run_dir, client))


def _plot(st, path: Path) -> None:
    from phoenix_hpc.status.timeline import save_timeline

    if path.suffix.lower() != ".png":
        raise StatusError(f"--plot: {str(path)!r} is not allowed; the file name must end in .png")
    try:
        save_timeline(st, path)
    except OSError as exc:
        raise StatusError(f"--plot: cannot write {str(path)!r}: {exc.strerror or exc}") from None


@click.command("status")
@click.argument("target", required=False, metavar="[JOBID | RUN_DIR]")
@click.option("--json", "as_json", is_flag=True, help="print the status as JSON (with --watch: one object per line)")
@click.option("--watch", is_flag=True, help="refresh until the job ends (Ctrl-C to leave); into a pipe: one line "
                                          "per change, then the full view")
@click.option("--interval-s", type=Seconds(min=0.2), default=2.0, show_default=True,
              help="refresh interval of --watch")
@click.option("--plot", "plot", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="also draw the recovery timeline to this PNG file")
@click.option("--cancel", is_flag=True, help="cancel the job with scancel (asks first unless --yes)")
@click.option("--yes", is_flag=True, help="do not ask before --cancel")
def status(target, as_json, watch, interval_s, plot, cancel, yes):
    """Show a PHOENIX job: Slurm state and live nodes, slots, replicas, spares, recoveries, warnings."""
    from phoenix_hpc.cli.output import make_console

    from phoenix_hpc.status.render import status_renderable

    run_dir, client, collect = _load(target)
    st = collect()
    console = make_console()
    if cancel:
        _cancel(st, client, yes, console)
        return
    if not watch:
        if plot is not None:
            _plot(st, plot)
        if as_json:
            click.echo(json.dumps(st.to_json(), indent=2))
        else:
            console.print(status_renderable(st))
            if plot is not None:
                console.print(f"timeline written to {plot}")
        return
    try:
        if as_json:
            while True:
                click.echo(json.dumps(st.to_json()))
                if st.finished:
                    break
                time.sleep(interval_s)
                st = collect()
        elif not console.is_terminal:  # a pipe or a log: a line per change, the full view at the end
            from phoenix_hpc.status.render import status_line

            last = None
            while True:
                line = status_line(st)
                if line.split("  ", 1)[1] != last:  # the same but for the time: nothing new to say
                    click.echo(line)
                    last = line.split("  ", 1)[1]
                if st.finished:
                    break
                time.sleep(interval_s)
                st = collect()
            console.print(status_renderable(st))
        else:
            from rich.live import Live

            with Live(status_renderable(st), console=console, refresh_per_second=4) as live:
                while not st.finished:
                    time.sleep(interval_s)
                    st = collect()
                    live.update(status_renderable(st))
    except KeyboardInterrupt:
        pass
    if plot is not None:
        _plot(st, plot)


def _cancel(st, client, yes: bool, console) -> None:
    job_id = st.job.job_id
    if job_id is None:
        raise StatusError(f"--cancel: no Slurm job id is recorded for {st.job.run_dir}; nothing to cancel")
    from phoenix_hpc.slurm.client import ACTIVE_JOB_STATES

    if st.job.slurm_state is None or st.job.slurm_state not in ACTIVE_JOB_STATES:
        raise StatusError(f"--cancel: job {job_id} is not running (Slurm: {st.job.slurm_state or 'no record'}); "
                          "nothing to cancel")
    for w in st.warnings:
        console.print(f"[red]! {w.message}[/red]")
    if not yes and not click.confirm(f"Cancel Slurm job {job_id} ({st.job.name or ''}, {st.job.slurm_state})?"):
        raise SystemExit(1)
    client.cancel(job_id)
    console.print(f"cancelled job {job_id} (scancel)")
