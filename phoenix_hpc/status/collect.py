"""Gather a job's status: read the run directory and ask Slurm, then :func:`derive_status` (pure).

Read-only: nothing here writes to the run directory, talks to the coordinator or changes the job.

Files read from RUN_DIR: ``journal.jsonl`` (:func:`phoenix_hpc.control.journal.read_journal_skipping`; a torn
last line is dropped, any other bad line skipped and named in a ``journal`` warning), ``config.yaml`` (plain YAML, not re-validated: a status must render even for a config an
older version wrote), ``job.json``, ``coordinator.json``, ``faults/fired-*.json``.

Slurm (through :class:`phoenix_hpc.slurm.client.SlurmClient`, the one module that runs Slurm commands):
``scontrol show job`` (state, live NodeList, BatchHost), ``squeue --json`` (used when scontrol has no
record), ``scontrol show node`` for the job's nodes, ``scontrol show topology`` (failure domains). A Slurm
failure never fails the status: it becomes a warning and the status comes from the journal.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import yaml

from phoenix_hpc.control import events as E
from phoenix_hpc.errors import SlurmError, StatusError
from phoenix_hpc.files import read_text
from phoenix_hpc.slurm.client import error_line, slurm_unreachable
from phoenix_hpc.status.derive import _get, derive_status
from phoenix_hpc.status.model import RunFiles, SlurmInfo, Status


def _json_file(path: Path) -> dict[str, Any] | None:
    text = read_text(path, "run directory", error=StatusError, missing_ok=True)
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise StatusError(f"run directory file {str(path)!r} is not valid JSON: {exc}") from None
    return data if isinstance(data, dict) else None


def read_run_files(run_dir: Path) -> RunFiles:
    """The run directory's files other than the journal.

    Raises:
        StatusError: ``config.yaml`` or a JSON file exists but cannot be parsed.
    """
    from phoenix_hpc.faults.trigger import read_fired

    text = read_text(run_dir / "config.yaml", "run directory", error=StatusError, missing_ok=True)
    try:
        cfg = None if text is None else yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise StatusError(f"run directory file {str(run_dir / 'config.yaml')!r} is not valid YAML: {exc}") from None
    from phoenix_hpc.recovery.ckpt_files import complete_steps

    cfg = cfg if isinstance(cfg, dict) else None
    # config.yaml is not re-validated (an older version's must render): a hand-edited section or path of the
    # wrong type reads as not given
    ck_path = _get(cfg, "resilience", "checkpoint", "path")
    root = Path(run_dir) / (ck_path if isinstance(ck_path, str) and ck_path else "checkpoints")  # absolute: replaces run_dir
    job = _json_file(run_dir / "job.json")
    jobs = (job or {}).get("jobs")
    several = isinstance(jobs, list) and len(jobs) > 1
    return RunFiles(run_dir=str(run_dir), config=cfg,
                    job=job, coordinator=_json_file(run_dir / "coordinator.json"),
                    fired=read_fired(run_dir), checkpoints=complete_steps(root),
                    rank_steps=read_rank_steps(run_dir) if several else [], rank_newest=read_rank_newest(run_dir))


def read_rank_newest(run_dir: Path, tail_bytes: int = 4096) -> list[tuple[float, int]]:
    """``(ts, step)`` of the last complete line of every ``RUN_DIR/ranks/rank*.steps.jsonl`` (only the file's
    last ``tail_bytes`` are read: a log grows by a line per step). Unreadable files and lines are skipped."""
    out: list[tuple[float, int]] = []
    for p in sorted((Path(run_dir) / "ranks").glob("rank*.steps.jsonl")):
        try:
            with open(p, "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - tail_bytes))
                lines = f.read().decode("utf-8", "replace").splitlines()
        except OSError:
            continue
        for line in reversed(lines):
            try:
                r = json.loads(line)
                out.append((float(r["ts"]), int(r["step"])))
                break
            except (ValueError, KeyError, TypeError):
                continue
    return out


def read_rank_steps(run_dir: Path) -> list[tuple[float, int]]:
    """``(ts, step)`` of every line of ``RUN_DIR/ranks/rank*.steps.jsonl`` (unreadable lines are skipped: a
    rank killed while writing leaves a torn last line)."""
    out: list[tuple[float, int]] = []
    for p in sorted((Path(run_dir) / "ranks").glob("rank*.steps.jsonl")):
        try:
            lines = p.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                r = json.loads(line)
                out.append((float(r["ts"]), int(r["step"])))
            except (ValueError, KeyError, TypeError):
                continue
    return out


def read_records(run_dir: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The journal's records (empty before the coordinator started) and the lines skipped, named: a line
    that is not a journal record is shown as a ``journal`` warning, not a refusal (the rule a restarted
    coordinator reads by, :func:`phoenix_hpc.control.journal.read_journal_skipping`).

    Raises:
        StatusError: the journal cannot be read or is not UTF-8.
    """
    from phoenix_hpc.control.journal import read_journal_skipping

    return read_journal_skipping(run_dir)


def gather_slurm(client, job_id: str | None, extra_nodes: list[str] = (),
                 site_levels: list[str] = ()) -> SlurmInfo:
    """Slurm's view of ``job_id`` and of its nodes (``extra_nodes``: nodes the journal names, e.g. lost
    ones no longer in the live node list; ``site_levels``: the site's failure-domain levels, which name the
    switch tiers). Never raises for Slurm failures: they go to ``error``."""
    info = SlurmInfo()
    if job_id is None:
        info.error = "no Slurm job id recorded for this run (not submitted?); shown from the journal only"
        return info
    try:
        info.job = client.show_job(job_id)
    except SlurmError as exc:
        try:
            jobs = client.queue(job_id)
            info.queue = jobs[0] if jobs else None
        except SlurmError:
            pass
        if info.queue is None:
            if slurm_unreachable(str(exc)):
                info.error = "Slurm not reachable; shown from the journal"
                info.unreachable = True
                return info
            info.no_record = True
            info.error = (f"Slurm has no record of job {job_id} (finished jobs are forgotten after MinJobAge: "
                          f"{error_line(exc)}); shown from the journal")
    from phoenix_hpc.hostlist import compress, expand

    names: list[str] = list(extra_nodes)
    if info.job:
        for key in ("NodeList", "BatchHost"):
            v = info.job.get(key)
            if v and v != "(null)":
                names += expand(v)
    names = sorted(set(names))
    if names:
        try:
            info.nodes = {r["NodeName"]: r for r in client.show_nodes(compress(names)) if "NodeName" in r}
        except SlurmError as exc:
            info.error = (info.error + "; " if info.error else "") + f"scontrol show node failed: {error_line(exc)}"
    try:
        from phoenix_hpc.topology import parse_scontrol_topology, switch_levels_of

        recs = client.show_topology()
        text = "\n".join(" ".join(f"{k}={v}" for k, v in r.items()) for r in recs)
        info.domains = parse_scontrol_topology(text, switch_levels_of(site_levels)) if text else {}
    except Exception:  # noqa: BLE001 - topology is optional decoration; a status must still render
        info.domains = {}
    return info


def gather_run_jobs(client, job: dict[str, Any], current: str | None) -> dict[str, dict[str, str]]:
    """``scontrol show job`` of the run's other jobs (``job.json`` ``jobs``: earlier jobs, and the one a
    chained run queued); jobs Slurm forgot (MinJobAge) are left out. Never raises for Slurm failures."""
    from phoenix_hpc.control.run_jobs import job_entries

    out: dict[str, dict[str, str]] = {}
    for e in job_entries(job):
        jid = str(e["job_id"])
        if jid == current:
            continue
        try:
            out[jid] = client.show_job(jid)
        except SlurmError:
            continue
    return out


def collect_status(run_dir: Path, client=None, now: float | None = None) -> Status:
    """The status of the job in ``run_dir``. ``client``: a SlurmClient (None: make a default one).

    Raises:
        StatusError: unreadable run files (see :func:`read_run_files`, :func:`read_records`).
    """
    if client is None:
        from phoenix_hpc.slurm.client import SlurmClient

        client = SlurmClient()
    from phoenix_hpc.control.journal import line_namer, read_journal_numbered

    run = read_run_files(run_dir)
    read = read_journal_numbered(run_dir)
    records, skipped = read.records, read.skipped
    job_id = str(run.job["job_id"]) if run.job and run.job.get("job_id") is not None else None
    nodes = sorted({str(r["node"]) for r in records if r.get("event") == E.Registered.NAME and r.get("node")})
    slurm = gather_slurm(client, job_id, nodes, list((run.job or {}).get("failure_domain_levels") or ()))
    slurm.run_jobs = gather_run_jobs(client, run.job or {}, job_id)
    hosts = sorted({r.get("BatchHost") for r in slurm.run_jobs.values() if r.get("BatchHost")} - set(slurm.nodes))
    if hosts and slurm.error is None:
        from phoenix_hpc.hostlist import compress

        try:
            slurm.nodes.update({r["NodeName"]: r for r in client.show_nodes(compress(hosts)) if "NodeName" in r})
        except SlurmError:
            pass
    return derive_status(records, slurm, time.time() if now is None else now, run, journal_skipped=skipped,
                         where=line_namer(read))
