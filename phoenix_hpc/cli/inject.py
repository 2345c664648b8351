"""``phoenix inject-fault [JOB] --kind KIND (--rank R | --node NODE | --coord pp,dp,tp) [--at-step S] [--phase P]``

Injects one fault into a running PHOENIX job through its coordinator, so it lands at exactly the requested
step and phase (:mod:`phoenix_hpc.faults`). JOB is a Slurm job id or a run directory; without it, the most
recent job (as for ``phoenix status``).

Exit codes: 0 the coordinator accepted the request (and, for kill-node on the local cluster, the node was
killed); 2 bad input or a refusal (unknown job, target outside the job, a phase the kind does not support,
a finished job, the coordinator refused): the message says why and nothing was injected.
"""

from __future__ import annotations

import json

import click

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
@click.option("--timeout-s", type=click.FloatRange(min=1), default=30.0, show_default=True,
              help="how long to wait for the coordinator's answer")
@click.option("--json", "as_json", is_flag=True, help="print a JSON object")
def inject_fault(job, kind, rank, node, coord, at_step, phase, timeout_s, as_json):
    """Inject a fault into a running job at a given step and phase."""
    from phoenix_hpc.faults.inject import build_request, inject
    from phoenix_hpc.slurm.client import SlurmClient
    from phoenix_hpc.status.collect import collect_status
    from phoenix_hpc.status.runs import find_run

    client = SlurmClient()
    run_dir = find_run(job, slurm=client)
    st = collect_status(run_dir, client)
    req = build_request(st, kind, rank=rank, node=node, coord=coord, at_step=at_step, phase=phase)
    out = inject(run_dir, st, req, timeout_s=timeout_s)
    total = st.job.steps_total
    if out["at_step"] is not None and total and out["at_step"] > total:
        click.echo(f"warning: the job ends at step {total}, before step {out['at_step']}: this fault will not "
                   "land", err=True)
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    when = f"step {out['at_step']}, phase {out['phase']}" if out["at_step"] is not None else "now"
    click.echo(f"injected {kind} into {json.dumps(out['target'])} (world ranks {out['targets']}) at {when}; "
               f"request {out['request_id']}")
    if out["node_kill"]:
        nk = out["node_kill"]
        click.echo(f"node {nk['node']}: slots gone, slurmd and step daemons killed (pids {nk['killed_pids']}), "
                   "marked DOWN")
    click.echo(f"follow it with: phoenix status {st.job.job_id or run_dir}")
