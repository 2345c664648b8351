"""``phoenix drain [JOB] (--node NODE | --rank R | --coord pp,dp,tp) [--shrink] [--at-step N]``

Moves the active slots of a node (or of one logical rank) of a running PHOENIX job onto spare slots at a
step boundary, without a fault: every active slot pauses at the commit fence of the same iteration, where
its live step equals its committed step, and the hot swap that follows replays 0 steps (docs/design.md
section 6, "Planned drain"). With ``--shrink`` the DP replica of the target is removed instead (dp - 1,
its other healthy slots become spares; section 6, "Shrink"), also when spares exist. ``--at-step N``
pauses at the fence of iteration N exactly (recoverable step N - 1); without it the coordinator picks
one two iterations ahead. JOB is a Slurm job id or a run directory; without it, the most recent job.

Exit codes: 0 the drain was done (``--no-wait``: every active slot armed it); 1 it was armed but missed (a
fault, a lost slot or the end of the job came first; journal ``drain_missed``); 2 bad input or a refusal
(unknown job, node, rank or coordinate, a node that holds only spares, a finished job, a job not training,
no spare left on another node without ``--shrink``, a shrink that would leave dp < 1 or an engine that
cannot shrink, an ``--at-step`` iteration a slot already started), and nothing was changed.
"""

from __future__ import annotations

import json

import click

from phoenix_hpc.cli.params import Seconds


@click.command("drain")
@click.argument("job", metavar="[JOBID | RUN_DIR]", required=False)
@click.option("--rank", type=int, default=None, help="drain the slot of a logical rank")
@click.option("--node", default=None, help="drain every slot of a node")
@click.option("--coord", default=None, metavar="PP,DP,TP", help="drain the slot of a grid coordinate")
@click.option("--shrink", is_flag=True,
              help="remove the target's DP replica (dp - 1; engine torch) instead of moving it onto spares")
@click.option("--at-step", type=click.IntRange(min=1), default=None,
              help="pause at the commit fence of exactly this iteration (refused if a slot already started it)")
@click.option("--timeout-s", type=Seconds(min=1), default=30.0, show_default=True,
              help="how long to wait for the coordinator's answer (every active slot arms the pause)")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="wait until the drain was done or missed (--no-wait: return once it is armed)")
@click.option("--json", "as_json", is_flag=True, help="print a JSON object")
def drain(job, rank, node, coord, shrink, at_step, timeout_s, wait, as_json):
    """Move a node's (or rank's) slots onto spares at the next step boundary, replaying no step."""
    from phoenix_hpc.drills.drain import build_drain, send_drain, wait_drain
    from phoenix_hpc.drills.inject import job_over_probe
    from phoenix_hpc.slurm.client import SlurmClient
    from phoenix_hpc.status.collect import collect_status
    from phoenix_hpc.status.runs import find_run

    client = SlurmClient()
    run_dir = find_run(job, slurm=client, live=True)
    st = collect_status(run_dir, client)
    req = build_drain(st, rank=rank, node=node, coord=coord, shrink=shrink, at_step=at_step)
    reply = send_drain(run_dir, req, timeout_s=timeout_s)
    out = {"request_id": req.request_id, "target": req.target, "targets": reply.get("targets", list(req.slots)),
           "at_step": reply.get("at_step"), "state": "armed"}
    if wait:
        rec = wait_drain(run_dir, req.request_id, job_over=job_over_probe(run_dir, client if st.job.job_id else None))
        out.update(state="done", generation=rec.get("generation"), steps_replayed=rec.get("steps_replayed"),
                   moved=rec.get("moved"), **({"dp": rec.get("dp"), "freed": rec.get("freed")} if shrink else {}))
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    where = json.dumps(req.target)
    if out["state"] == "armed":
        click.echo(f"drain of {where} (world ranks {out['targets']}) armed: every active slot pauses at the "
                   f"commit fence of iteration {out['at_step']}; request {req.request_id}")
    elif shrink:
        click.echo(f"drain of {where} done at iteration {out['at_step']} by a shrink to dp {out.get('dp')} "
                   f"(slots back to standby: {out.get('freed')}); generation {out['generation']}, steps replayed "
                   f"{out['steps_replayed']}; request {req.request_id}")
    else:
        moved = ", ".join(f"world rank {a} -> {b} (logical rank {r})" for a, b, r in out["moved"] or [])
        click.echo(f"drain of {where} done at iteration {out['at_step']}: {moved}; generation "
                   f"{out['generation']}, steps replayed {out['steps_replayed']}; request {req.request_id}")
    click.echo(f"follow it with: phoenix status {st.job.job_id or run_dir}")
