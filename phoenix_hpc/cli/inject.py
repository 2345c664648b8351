"""``phoenix inject-fault [JOB] --kind KIND (--rank R | --node NODE | --coord pp,dp,tp) [--at-step S] [--phase P]``

Injects one fault into a running PHOENIX job through its coordinator, so it lands at exactly the requested
step and phase (:mod:`phoenix_hpc.faults`). JOB is a Slurm job id or a run directory; without it, the most
recent job (as for ``phoenix status``). The target slots themselves arm the fault, only if they have not
started the step yet; then the command waits until it landed (``--no-wait``: returns once it is armed;
``phoenix status`` shows the outcome).

Exit codes: 0 the fault landed at the requested step and phase (``--no-wait``: it is armed; kill-node on the
local cluster: the node was also killed); 1 it was armed but missed: the target was lost or the job ended
before the step (journal ``inject_missed``; ``phoenix status`` shows it); 2 bad input or a refusal (unknown
job, target outside the job, a phase the kind does not support, a finished job, a step the target already
started): the message says why and nothing was injected.
"""

from __future__ import annotations

import json

import click

from phoenix_hpc.cli.params import Seconds
from phoenix_hpc.faults.kinds import KINDS, PHASES


@click.command("inject-fault")
@click.argument("job", metavar="[JOBID | RUN_DIR]", required=False)
@click.option("--kind", required=True, type=click.Choice(list(KINDS)),
              help="; ".join(f"{k.name}: {k.effect}" for k in KINDS.values()))
@click.option("--rank", type=int, default=None, help="target: a logical rank")
@click.option("--node", default=None, help="target: every slot of a node")
@click.option("--coord", default=None, metavar="PP,DP,TP", help="target: a grid coordinate")
@click.option("--at-step", type=int, default=None,
              help="the step to fail in (default: 3 steps after the target's live step when the coordinator gets the request)")
@click.option("--phase", type=click.Choice(list(PHASES)), default=None,
              help="where in the step (default forward); each kind supports some phases only")
@click.option("--timeout-s", type=Seconds(min=1), default=30.0, show_default=True,
              help="how long to wait for the coordinator's answer")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="wait until the fault landed or was missed (--no-wait: return once the targets armed it)")
@click.option("--json", "as_json", is_flag=True, help="print a JSON object")
def inject_fault(job, kind, rank, node, coord, at_step, phase, timeout_s, wait, as_json):
    """Inject a fault into a running job at a given step and phase."""
    from phoenix_hpc.errors import FaultMissed
    from phoenix_hpc.drills.inject import build_request, inject, job_over_probe
    from phoenix_hpc.slurm.client import SlurmClient
    from phoenix_hpc.status.collect import collect_status
    from phoenix_hpc.status.runs import find_run

    client = SlurmClient()
    run_dir = find_run(job, slurm=client, live=True)
    st = collect_status(run_dir, client)
    req = build_request(st, kind, rank=rank, node=node, coord=coord, at_step=at_step, phase=phase)
    try:
        out = inject(run_dir, st, req, timeout_s=timeout_s, wait=wait,
                     job_over=job_over_probe(run_dir, client if st.job.job_id else None))
    except FaultMissed as exc:
        if as_json:
            click.echo(json.dumps(exc.outcome, indent=2))
        raise
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    when = f"step {out['at_step']}, phase {out['phase']}" if out["at_step"] is not None else "now"
    if out["state"] == "landed":
        where = ", ".join(f"w{x['world_rank']} step {x['step']} {x['phase']}" for x in out["landed"])
        click.echo(f"{kind} landed in {json.dumps(out['target'])} at {when} ({where}); request {out['request_id']}")
    else:
        click.echo(f"{kind} armed by {json.dumps(out['target'])} (world ranks {out['targets']}) for {when}; "
                   f"request {out['request_id']}")
    if out["node_kill"]:
        nk = out["node_kill"]
        click.echo(f"node {nk['node']}: slots gone, slurmd and step daemons killed (pids {nk['killed_pids']}), "
                   "marked DOWN")
    click.echo(f"follow it with: phoenix status {st.job.job_id or run_dir}")
