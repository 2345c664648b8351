"""The in-job restart request of ``resilience.checkpoint.restart: in-job`` (mode checkpoint-restart).

The coordinator writes ``RUN_DIR/in_job_restart.json`` when it decides on a fault; the batch script sees it
once the coordinator has exited, ends the srun step at once (``scancel --signal=KILL JOBID.STEP``) and starts
a new srun step inside the same allocation on the allocation's nodes minus ``dead_nodes``
(:func:`next_step_nodes`, run as ``python -m phoenix_hpc.control.in_job next-nodes``), with a new
coordinator; the new step's ranks restore the newest persistent checkpoint at start-up
(:func:`phoenix_hpc.launch.persist.restore_latest`), as a resubmitted job would, without a new job.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from phoenix_hpc.files import write_private_file

REQUEST_FILE = "in_job_restart.json"
RESTARTS_LOG = "in_job_restarts.jsonl"  # one line per restart: {ts, slurm_job_id, nodes, spares, dead_nodes, checkpoint_step}


def write_restart_request(run_dir: str | os.PathLike, dead_nodes: list[str], checkpoint_step: int | None,
                          reason: str) -> Path:
    """Write the request atomically. Returns its path."""
    p = Path(run_dir) / REQUEST_FILE
    write_private_file(p, json.dumps({"dead_nodes": sorted(dead_nodes), "checkpoint_step": checkpoint_step,
                                     "reason": reason}) + "\n")
    return p


def next_step_nodes(alloc_nodes: list[str], dead_nodes: list[str], active: int) -> tuple[list[str], int]:
    """The nodes of the next srun step (pure): the allocation's nodes in order, without the dead ones.
    Returns ``(nodes, spares)``: all of them (the first ``active`` run the active ranks, the rest stay
    spares for a later restart).

    Raises:
        ValueError: fewer than ``active`` nodes are left.
    """
    dead = set(dead_nodes)
    left = [n for n in alloc_nodes if n not in dead]
    if len(left) < active:
        raise ValueError(f"{len(left)} node(s) left in the allocation without {sorted(dead)}, "
                         f"the job needs {active} active node(s)")
    return left, len(left) - active


def read_restarts(run_dir: str | os.PathLike) -> list[dict]:
    """The lines of ``RUN_DIR/in_job_restarts.jsonl``, oldest first (``[]`` when no restart happened)."""
    log = Path(run_dir) / RESTARTS_LOG
    return [json.loads(x) for x in log.read_text().splitlines() if x.strip()] if log.exists() else []


def left_out(earlier: list[dict], dead_nodes: list[str]) -> list[str]:
    """The nodes the next srun step must not use (pure): this restart's ``dead_nodes`` and those of every
    earlier restart of the job (``earlier``: the lines of ``in_job_restarts.jsonl``). A node that left the
    job stays out: Slurm keeps the allocation (``--no-kill``) but a step asking for a DOWN node is refused
    ("Requested node configuration is not available")."""
    return sorted({str(n) for r in earlier for n in r.get("dead_nodes") or []} | {str(n) for n in dead_nodes})


def main(argv: list[str] | None = None) -> int:
    """``python -m phoenix_hpc.control.in_job next-nodes --run-dir D --nodes HOSTLIST --active N``: print
    ``NODELIST SPARES`` of the next step (hostlist of the nodes left, spares among them) and consume the
    request (appending a line to ``RUN_DIR/in_job_restarts.jsonl``); exit 1 with a message when too few nodes are left, 4 when there is no request (no restart)."""
    from phoenix_hpc.hostlist import compress, expand

    ap = argparse.ArgumentParser(prog="python -m phoenix_hpc.control.in_job")
    ap.add_argument("command", choices=["next-nodes"])
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--nodes", required=True, help="the allocation's nodes (SLURM_JOB_NODELIST)")
    ap.add_argument("--active", type=int, required=True)
    a = ap.parse_args(argv)
    p = Path(a.run_dir) / REQUEST_FILE
    if not p.exists():
        return 4
    req = json.loads(p.read_text())
    try:
        nodes, spares = next_step_nodes(expand(a.nodes), left_out(read_restarts(a.run_dir), req.get("dead_nodes", [])),
                                        a.active)
    except ValueError as exc:
        print(f"[phoenix] no in-job restart: {exc}", file=sys.stderr)
        return 1
    p.unlink()
    rec = {"ts": time.time(), "slurm_job_id": os.environ.get("SLURM_JOB_ID"), "nodes": nodes, "spares": spares,
           "dead_nodes": req.get("dead_nodes", []), "checkpoint_step": req.get("checkpoint_step")}
    with open(Path(a.run_dir) / RESTARTS_LOG, "a") as f:  # when the old step had ended (benchmarks read it)
        f.write(json.dumps(rec) + "\n")
    print(f"{compress(nodes)} {spares}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
