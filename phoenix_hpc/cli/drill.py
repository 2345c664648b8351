"""``phoenix drill CONFIG --site SITE [--faults N] [--seed S]``: a fault drill on a real job.

1. validate CONFIG for the site and plan N faults (:func:`phoenix_hpc.faults.drill.plan_drill`: random
   kinds, steps, phases and target ranks from ``--seed``, within the spare budget);
2. the fault-free reference: reuse ``--reference RUN_DIR`` (a finished run of the same config) or submit
   one and wait for it;
3. submit the drill job; once it trains, inject the faults one at a time through the coordinator
   (``phoenix inject-fault``'s code), each after the previous one's recovery ended;
4. wait for the job to end and report per fault: kind, where it landed, detection time, recovery breakdown,
   steps replayed; and whether the final state hash equals the reference's (DESIGN.md section 10).

Runs go under ``--run-dir`` (default ``runs/drill-<name>-<time>``): ``reference/`` and ``job/``; both are
recorded in the runs index, so ``phoenix status`` shows them. ``--dry-run`` prints the plan only.

Exit codes: 0 every fault landed where requested, was recovered, and the final state equals the reference;
1 the drill ran but one of those failed (the report says which); 2 bad input (config, site, too many faults
for the steps or spares).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import time
from pathlib import Path
from typing import Callable

import click

from phoenix_hpc.errors import FaultError, SubmitError
from phoenix_hpc.faults.kinds import KINDS

POLL_S = 1.0


def _submit(config: Path, site: str, run_dir: Path) -> str:
    """Submit through ``phoenix submit`` (same validation, files and script); returns the job id."""
    from phoenix_hpc.cli.submit import submit
    from phoenix_hpc.status.runs import record_run

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        submit.main(args=[str(config), "--site", site, "--run-dir", str(run_dir), "--json"], standalone_mode=False)
    try:
        job_id = str(json.loads(buf.getvalue())["job_id"])
    except (ValueError, KeyError) as exc:
        raise SubmitError(f"phoenix submit printed no job id: {buf.getvalue()[:200]!r} ({exc})") from None
    record_run(run_dir, job_id)
    return job_id


def _collector(run_dir: Path):
    from phoenix_hpc.slurm.client import SlurmClient
    from phoenix_hpc.status.collect import collect_status

    client = SlurmClient()
    return lambda: collect_status(run_dir, client)


def _wait(collect, until: Callable, timeout_s: float, on_poll: Callable, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        st = collect()
        on_poll(st)
        if until(st):
            return st
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not reached within {timeout_s:g}s (job state {st.job.state}, "
                               f"step {st.job.step})")
        time.sleep(POLL_S)


@click.command("drill")
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--site", required=True, metavar="NAME|PATH", help="site profile (e.g. local)")
@click.option("--faults", "n_faults", type=int, default=3, show_default=True, help="number of faults to inject")
@click.option("--seed", type=int, default=0, show_default=True, help="seed of the random plan")
@click.option("--kinds", default=",".join(KINDS), show_default=True, help="comma-separated kinds to draw from")
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="folder for the drill's runs (default runs/drill-<name>-<time>)")
@click.option("--reference", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="run directory of a finished fault-free run of the same config to compare with")
@click.option("--timeout-s", type=click.FloatRange(min=10), default=3600.0, show_default=True,
              help="limit for each wait (job start, each recovery, job end)")
@click.option("--dry-run", is_flag=True, help="print the fault plan; submit nothing")
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
def drill(config, site, n_faults, seed, kinds, run_dir, reference, timeout_s, dry_run, as_json):
    """Submit a job, inject N random faults, and check it recovers to the fault-free result."""
    from phoenix_hpc.config.load import load_job_config
    from phoenix_hpc.config.resolve import resolve
    from phoenix_hpc.faults.drill import plan_drill
    from phoenix_hpc.profiles import load_profile

    cfg = load_job_config(config)
    profile = load_profile(site)
    if not cfg.resilience.enabled or cfg.resilience.mode != "phoenix":
        raise FaultError("resilience: a drill needs resilience.enabled = true and resilience.mode = phoenix "
                         f"(got enabled={cfg.resilience.enabled}, mode={cfg.resilience.mode!r})")
    base = Path(run_dir or Path("runs") / f"drill-{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}").absolute()
    job = resolve(cfg, profile, run_dir=str(base / "job"), default_python=sys.executable)
    plan = plan_drill(n_faults, seed, steps=cfg.training.steps, world=job.world_size,
                      gpus_per_node=job.gpus_per_node, spare_nodes=job.spares,
                      kinds=[k.strip() for k in kinds.split(",") if k.strip()])
    if dry_run:
        rows = [{"index": f.index, "kind": f.kind, "phase": f.phase, "at_step": f.at_step, "rank": f.rank}
                for f in plan]
        if as_json:
            click.echo(json.dumps({"plan": rows}, indent=2))
        else:
            for r in rows:
                click.echo(f"fault {r['index'] + 1}: {r['kind']} at step {r['at_step']}, phase {r['phase']}, "
                           f"logical rank {r['rank']}")
        return
    report = _run(config, site, cfg, base, plan, reference, timeout_s, as_json)
    _print_report(report, as_json)
    if not report["passed"]:
        sys.exit(1)


def _run(config, site, cfg, base: Path, plan, reference, timeout_s, as_json) -> dict:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from phoenix_hpc.faults.drill import DrillOutcome, match_outcome
    from phoenix_hpc.faults.inject import build_request, inject
    from phoenix_hpc.status.runs import check_run_dir

    steps = cfg.training.steps
    console = Console(stderr=True)
    outcomes = [DrillOutcome(f) for f in plan]
    report: dict = {"config": str(config), "site": site, "base": str(base), "faults": [], "passed": False}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, disable=as_json) as progress:
        task = progress.add_task("reference", total=steps)

        def show(desc):
            return lambda st: progress.update(task, description=desc, completed=st.job.step or 0)

        # --- the fault-free reference -----------------------------------------------------------------
        if reference is not None:
            ref_dir = check_run_dir(reference)
        else:
            ref_dir = base / "reference"
            _submit(config, site, ref_dir)
        ref = _wait(_collector(ref_dir), lambda s: s.finished, timeout_s, show("reference run"), "reference run")
        report["reference"] = {"run_dir": str(ref_dir), "state": ref.job.state, "final_hash": ref.job.final_hash}
        if ref.job.state != "done" or not ref.job.final_hash:
            raise FaultError(f"--reference: {ref_dir} did not finish cleanly (state {ref.job.state}); "
                             "a drill needs a fault-free final hash to compare with")

        # --- the drill job ----------------------------------------------------------------------------
        job_dir = base / "job"
        job_id = _submit(config, site, job_dir)
        report["job"] = {"run_dir": str(job_dir), "job_id": job_id}
        collect = _collector(job_dir)
        progress.reset(task, total=steps, description="waiting for the job to train")
        st = _wait(collect, lambda s: s.finished or (s.job.state == "running" and s.job.coordinator is not None
                                                     and s.slots), timeout_s, show("starting"), "job start")
        for out in outcomes:
            f = out.fault
            if st.finished:
                out.error = f"job ended ({st.job.state}) before this fault"
                continue
            label = f"fault {f.index + 1}/{len(outcomes)}: {f.kind} @ {f.phase}"
            step = max(f.at_step, (st.job.step or 0) + 2)
            try:
                req = build_request(st, f.kind, rank=f.rank, at_step=step, phase=f.phase)
                out.at_step = req.at_step
                sent = inject(job_dir, st, req, land_timeout_s=timeout_s)
                out.request_id = sent["request_id"]
            except (FaultError, OSError) as exc:
                out.error = f"not injected: {exc}"
                continue
            except Exception as exc:  # noqa: BLE001 - ControlError etc.: report it, continue the drill
                out.error = f"not injected: {exc}"
                continue

            def settled(s, out=out):
                match_outcome(out, s)
                return s.finished or out.recovery_state in ("done", "fallback", "aborted")

            try:
                st = _wait(collect, settled, timeout_s, show(label), label)
            except TimeoutError as exc:
                out.error = str(exc)
                break
        try:
            st = _wait(collect, lambda s: s.finished, timeout_s, show("finishing"), "job end")
        except TimeoutError as exc:
            report["error"] = str(exc)
        for out in outcomes:
            match_outcome(out, st)
    report["faults"] = [o.to_json() for o in outcomes]
    report["final_state"] = st.job.state
    report["final_hash"] = st.job.final_hash
    report["hash_equal"] = bool(st.job.final_hash) and st.job.final_hash == report["reference"]["final_hash"]
    report["passed"] = (report["hash_equal"] and st.job.state == "done"
                        and all(o.landed_as_requested and o.recovered for o in outcomes))
    return report


def _print_report(report: dict, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"Drill of {report['config']} on {report['site']}", title_justify="left")
    for c in ("#", "kind", "at step", "phase", "rank", "landed", "action", "detect", "reconfigure", "params",
              "optimizer", "replay", "total", "replayed", "result"):
        t.add_column(c)

    def s(v):
        return "-" if v is None else f"{v:.2f}s"

    for f in report["faults"]:
        landed = ", ".join(f"w{x['world_rank']}:{x['step']}/{x['phase']}" for x in f["landed"]) or "-"
        ok = f["landed_as_requested"] and f["recovered"]
        t.add_row(str(f["index"] + 1), f["kind"], str(f["at_step"] or f["planned_step"]), f["phase"], str(f["rank"]),
                  landed, f["action"] or "-", s(f["detect_s"]),
                  *(s(f["phases"].get(p)) for p in ("reconfigure", "params", "optimizer", "replay")),
                  s(f["total_s"]), "-" if f["steps_replayed"] is None else str(f["steps_replayed"]),
                  "[green]ok[/green]" if ok else f"[red]{f['error'] or f['recovery_state'] or 'not landed'}[/red]")
    c = Console()
    c.print(t)
    same = "[green]equal[/green]" if report["hash_equal"] else "[red]DIFFERENT[/red]"
    c.print(f"final state: {report['final_state']}; final hash {report.get('final_hash') or '-'} vs reference "
            f"{report['reference']['final_hash']}: {same}")
    c.print("[green]drill passed[/green]" if report["passed"] else "[red]drill failed[/red]")
