"""A chained run (``resources.chain: N``, ``phoenix submit --chain N``): the run continues itself in up to N
more Slurm jobs (docs/design.md section 7, "Chained runs").

``python -m phoenix_hpc.cli.chain start|end --run-dir RUN_DIR`` is called by the batch script.

- ``start``, before the coordinator: a job of the chain that is not the first checks that there is
  something to continue (the run has not finished; the newest complete checkpoint, if any, fits the grid)
  and records where it resumes; then, while the chain has jobs left, it queues its successor with
  ``sbatch --dependency=afternotok:THIS_JOB RUN_DIR/job.sbatch``. Slurm starts the successor only when
  this job ends in a state other than COMPLETED (sbatch(1), ``--dependency``: ``afternotok`` "after the
  specified jobs have terminated in some failed state (non-zero exit code, node failure, timed out,
  etc)"): the batch script exits 0 only after ``job_done``, and non-zero for a planned end (time limit,
  SIGTERM), a failure, or when Slurm ends the job (a lost batch host: NODE_FAIL). The successor is queued
  at the start, not at the end, because a job whose batch host dies runs no code at its end.
- ``end``, after the coordinator: when the run finished (exit status 0) the queued successor is cancelled
  (its dependency can never be satisfied; Slurm would keep it PENDING with reason
  DependencyNeverSatisfied); otherwise it says which job continues the run.

Every job of the chain runs the same ``job.sbatch`` and config; its ranks load the newest complete
checkpoint at start-up (``launch/persist.py``). ``job.json`` lists the run's jobs (``jobs``: job_id,
submitted_at, resume_step, chain_index, after); ``chain_index`` counts the jobs queued automatically
since the last ``phoenix submit`` (0 for the one it submitted).

Exit codes of ``start``: 0 go on; 4 nothing to continue (the run finished): the batch script exits 0
without starting anything; 2 the run cannot continue (the message names why).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from phoenix_hpc.control import events as E
from phoenix_hpc.control.run_jobs import JOB_NAME, job_entries, read_job, successor_of

SCRIPT_NAME = "job.sbatch"
EXIT_GO, EXIT_BAD, EXIT_FINISHED = 0, 2, 4






@dataclass(frozen=True)
class StartDecision:
    """What a starting job of the run does (:func:`start_decision`): ``action`` ``go``, ``finished`` or
    ``refuse``; ``chain_index`` of this job; ``queue_next`` whether it queues a successor; ``why``."""

    action: str
    chain_index: int
    queue_next: bool
    why: str = ""


def start_decision(entries: list[dict], job_id: str, chain: int, finished: bool,
                   checkpoint_problems: list[str]) -> StartDecision:
    """Pure decision of ``start``.

    Args:
        entries: the run's jobs (:func:`job_entries`).
        job_id: this job's Slurm id.
        chain: ``resources.chain`` of the run's config.
        finished: the journal has ``job_done``.
        checkpoint_problems: why the newest complete checkpoint cannot be loaded (empty: it can, or there is
            none and the training starts over).
    """
    mine = [e for e in entries if str(e.get("job_id")) == str(job_id)]
    index = int(mine[-1].get("chain_index") or 0) if mine else 0
    if index > 0 and finished:
        return StartDecision("finished", index, False, "the run finished (job_done) before this job started")
    if checkpoint_problems:
        return StartDecision("refuse", index, False, "the newest complete checkpoint cannot be loaded: "
                             + "; ".join(checkpoint_problems))
    queued = [e for e in entries if str(e.get("after")) == str(job_id)]
    return StartDecision("go", index, index < chain and not queued)


def successor_args(job_id: str, run_dir: str) -> list[str]:
    """sbatch options of the successor: the dependency, and ``--output`` when the run directory cannot be
    written on an ``#SBATCH`` line (as ``phoenix submit`` passes it)."""
    from phoenix_hpc.slurm.render import cli_args_for

    return [f"--dependency=afternotok:{job_id}", *cli_args_for(run_dir)]


def _write_job(run_dir: Path, job: dict) -> None:
    from phoenix_hpc.control.journal import write_private_file

    write_private_file(run_dir / JOB_NAME, json.dumps(job))


def _checkpoint_problems(cfg, run_dir: Path) -> tuple[int | None, list[str]]:
    from phoenix_hpc.launch.persist import checkpoint_root
    from phoenix_hpc.recovery.ckpt_files import check_checkpoint, complete_steps

    root = checkpoint_root(cfg, run_dir)
    steps = complete_steps(root)
    if not steps:
        return None, []
    p = cfg.parallelism
    grid = (p.tp, p.pp, p.dp) if p.dp else None
    return steps[-1], check_checkpoint(root, steps[-1], grid, verify=False, engine=cfg.engine)


def _wait_for_own_entry(run_dir: Path, job_id: str, wait_s: float) -> dict:
    """``job.json`` once it lists ``job_id``: ``phoenix submit`` writes it after sbatch returned, and a job
    that starts at once may get here first (its entry, and the successor queued now, would then be
    overwritten). After ``wait_s`` (a job sbatch'ed by hand), ``job.json`` as it is."""
    deadline = time.monotonic() + wait_s
    while True:
        job = read_job(run_dir)
        if any(str(e.get("job_id")) == str(job_id) for e in job_entries(job)) or time.monotonic() >= deadline:
            return job
        time.sleep(0.5)


def start(run_dir: Path, job_id: str, client, log=print, wait_s: float = 60.0) -> int:
    """``start`` (see the module doc). Returns the exit code."""
    from phoenix_hpc.config.load import load_job_config
    from phoenix_hpc.control.ending import resume_hint
    from phoenix_hpc.control.journal import read_journal
    from phoenix_hpc.errors import SlurmError

    cfg = load_job_config(run_dir / "config.yaml")
    job = _wait_for_own_entry(run_dir, job_id, wait_s)
    entries = job_entries(job)
    try:
        finished = any(r.get("event") == E.JobDone.NAME for r in read_journal(run_dir))
    except (OSError, ValueError):
        finished = False
    step, problems = _checkpoint_problems(cfg, run_dir)
    d = start_decision(entries, job_id, cfg.resources.chain, finished, problems)
    if d.action == "finished":
        log(f"[phoenix] chain: {d.why}; nothing to do")
        return EXIT_FINISHED
    if d.action == "refuse":
        log(f"[phoenix] chain: job {job_id} cannot continue the run: {d.why}")
        return EXIT_BAD
    if not any(str(e.get("job_id")) == str(job_id) for e in entries):
        entries.append({"job_id": str(job_id), "submitted_at": None, "resume_step": step, "chain_index": 0})
    for e in entries:
        if str(e.get("job_id")) == str(job_id):
            e["resume_step"] = step
            e["started_at"] = time.time()
    if d.chain_index > 0:
        log(f"[phoenix] chain: job {job_id} is job {d.chain_index} of {cfg.resources.chain} queued by the run; "
            + (f"it resumes from the checkpoint of step {step}" if step is not None
               else "no complete checkpoint: the training starts over"))
    if d.queue_next:
        try:
            nxt = client.submit(run_dir / SCRIPT_NAME, extra_args=successor_args(job_id, str(run_dir)))
        except SlurmError as exc:
            log(f"[phoenix] chain: could not queue the next job ({exc}); if this job ends early, continue with "
                f"{resume_hint(str(run_dir))}")
            nxt = None
        if nxt is not None:
            entries.append({"job_id": nxt, "submitted_at": time.time(), "resume_step": None,
                            "chain_index": d.chain_index + 1, "after": str(job_id)})
            log(f"[phoenix] chain: queued job {nxt} (afternotok:{job_id}, {d.chain_index + 1} of "
                f"{cfg.resources.chain}): it continues the run if this job ends before the last step")
            try:
                from phoenix_hpc.status.runs import record_run

                record_run(run_dir, nxt)
            except OSError:
                pass  # the runs index is a convenience; job.json is the record
    job["jobs"] = entries
    job["job_id"] = str(job_id)  # the run's current job (what `phoenix status` asks Slurm about)
    _write_job(run_dir, job)
    return EXIT_GO




def end(run_dir: Path, job_id: str, status: int, client, log=print) -> int:
    """``end`` (see the module doc): cancel the successor of a finished run. Returns 0."""
    from phoenix_hpc.errors import SlurmError

    nxt = successor_of(job_entries(read_job(run_dir)), job_id)
    if nxt is None:
        return 0
    if status == 0:
        try:
            client.cancel(nxt)
            log(f"[phoenix] chain: the run finished; cancelled the queued job {nxt}")
        except SlurmError as exc:
            log(f"[phoenix] chain: the run finished, but cancelling the queued job {nxt} failed: {exc}")
    else:
        log(f"[phoenix] chain: job {nxt} continues the run when this job has ended")
    return 0


def main(argv: list[str] | None = None) -> int:
    from phoenix_hpc.errors import PhoenixError
    from phoenix_hpc.slurm.client import SlurmClient

    ap = argparse.ArgumentParser(prog="python -m phoenix_hpc.cli.chain", description=__doc__.split("\n")[0])
    ap.add_argument("action", choices=("start", "end"))
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--status", type=int, default=1, help="end: the job's exit status (0: the run finished)")
    args = ap.parse_args(argv)
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id:
        print("[phoenix] chain: SLURM_JOB_ID is not set (not inside a Slurm job)", file=sys.stderr)
        return EXIT_BAD
    run_dir = Path(args.run_dir).absolute()
    try:
        if args.action == "start":
            return start(run_dir, job_id, SlurmClient())
        return end(run_dir, job_id, args.status, SlurmClient())
    except PhoenixError as exc:
        print(f"[phoenix] chain: {exc}", file=sys.stderr)
        return EXIT_BAD


if __name__ == "__main__":
    sys.exit(main())
