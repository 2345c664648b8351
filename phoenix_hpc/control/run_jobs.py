"""The Slurm jobs of one run as ``RUN_DIR/job.json`` lists them (``jobs``: job_id, submitted_at,
resume_step, chain_index, after; written by ``phoenix submit`` and by a chained run's jobs,
:mod:`phoenix_hpc.cli.chain`). Readers only."""

from __future__ import annotations

import json
from pathlib import Path

JOB_NAME = "job.json"


def read_job(run_dir: Path) -> dict:
    """``RUN_DIR/job.json`` as a dict (empty when missing or unreadable)."""
    try:
        d = json.loads((Path(run_dir) / JOB_NAME).read_text())
    except (OSError, ValueError):
        return {}
    return d if isinstance(d, dict) else {}


def job_entries(job: dict) -> list[dict]:
    """The run's jobs, oldest first (``job.json`` ``jobs``; a ``job.json`` of one job without the list
    gives that job; a hand-edited ``jobs`` that is not a list counts as absent). Pure."""
    listed = job.get("jobs", [])
    jobs = [dict(j) for j in (listed if isinstance(listed, list) else []) if isinstance(j, dict) and "job_id" in j]
    if not jobs and job.get("job_id") is not None:
        jobs = [{"job_id": str(job["job_id"]), "submitted_at": job.get("submitted_at"), "resume_step": None}]
    return jobs


def successor_of(entries: list[dict], job_id: str) -> str | None:
    """The job queued by ``job_id`` to continue the run, if any. Pure."""
    nxt = [e for e in entries if str(e.get("after")) == str(job_id)]
    return str(nxt[-1]["job_id"]) if nxt else None
