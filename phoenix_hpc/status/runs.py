"""Finding a job's run directory: from a run directory path, a Slurm job id, or "the most recent job".

A PHOENIX run directory holds ``config.yaml`` (the resolved config, written by ``phoenix submit``) and at
least one of ``job.json`` (``{"job_id", "site", "submitted_at"}``), ``job.sbatch`` or ``journal.jsonl``.

Where jobs are looked up, in order:

1. the runs index ``$PHOENIX_HOME/runs.jsonl`` (default ``~/.phoenix/runs.jsonl``): one JSON object per
   line ``{"job_id", "run_dir", "submitted_at"}``, appended by :func:`record_run` (``phoenix submit`` and
   ``phoenix drill`` call it after a successful ``sbatch``);
2. ``./runs/*/job.json`` (``phoenix submit``'s default run directories, relative to the current directory);
3. for a job id only: Slurm's record of the job (``scontrol show job``: ``Command`` is ``RUN_DIR/job.sbatch``),
   while Slurm still remembers the job (``MinJobAge``, slurm.conf(5)).

"The most recent job" is the entry of 1 and 2 with the newest ``submitted_at``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from phoenix_hpc.errors import StatusError
from phoenix_hpc.files import read_text

INDEX_NAME = "runs.jsonl"
HOME_ENV = "PHOENIX_HOME"
CONFIG_NAME = "config.yaml"
JOB_NAME = "job.json"
MARKERS = ("job.json", "job.sbatch", "journal.jsonl")


def phoenix_home(env: dict[str, str] | None = None) -> Path:
    """``$PHOENIX_HOME`` or ``~/.phoenix``."""
    env = os.environ if env is None else env
    return Path(env.get(HOME_ENV) or Path.home() / ".phoenix")


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` looks like a PHOENIX run directory (see the module doc)."""
    return path.is_dir() and (path / CONFIG_NAME).is_file() and any((path / m).exists() for m in MARKERS)


def check_run_dir(path: str | os.PathLike) -> Path:
    """``path`` as an absolute Path if it is a PHOENIX run directory.

    Raises:
        StatusError: it does not exist, is not a directory, or lacks ``config.yaml`` and a job marker.
    """
    p = Path(path).absolute()
    if not p.exists():
        raise StatusError(f"RUN_DIR: {str(path)!r} does not exist; pass a job id or a run directory")
    if not is_run_dir(p):
        raise StatusError(f"RUN_DIR: {str(path)!r} is not a PHOENIX run directory (expected {CONFIG_NAME} and "
                          f"one of {', '.join(MARKERS)}, as written by `phoenix submit`)")
    return p


def record_run(run_dir: str | os.PathLike, job_id: str, submitted_at: float | None = None,
               home: Path | None = None) -> Path:
    """Append ``{"job_id", "run_dir", "submitted_at"}`` to the runs index (one ``O_APPEND`` write of a whole
    line; the index folder is made 0700). Returns the index path."""
    home = home or phoenix_home()
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    line = json.dumps({"job_id": str(job_id), "run_dir": str(Path(run_dir).absolute()),
                       "submitted_at": time.time() if submitted_at is None else float(submitted_at)}) + "\n"
    path = home / INDEX_NAME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    return path


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def known_runs(home: Path | None = None, cwd: Path | None = None) -> list[dict[str, Any]]:
    """Every run recorded in the index and in ``CWD/runs/*/job.json``, as ``{"job_id", "run_dir",
    "submitted_at"}``, newest first; entries whose run directory is gone are dropped."""
    home = home or phoenix_home()
    cwd = cwd or Path.cwd()
    out: dict[str, dict[str, Any]] = {}
    idx = home / INDEX_NAME
    text = read_text(idx, "runs index", error=StatusError, allow_empty=True, missing_ok=True)
    if text:
        for line in text.splitlines():
            try:
                e = json.loads(line)
                out[str(Path(e["run_dir"]))] = {"job_id": str(e["job_id"]), "run_dir": str(e["run_dir"]),
                                                "submitted_at": float(e.get("submitted_at") or 0.0)}
            except (ValueError, KeyError, TypeError):
                continue
    runs = cwd / "runs"
    if runs.is_dir():
        for jf in runs.glob(f"*/{JOB_NAME}"):
            j = _read_json(jf)
            if j and j.get("job_id") is not None:
                rd = str(jf.parent.absolute())
                out.setdefault(rd, {"job_id": str(j["job_id"]), "run_dir": rd,
                                    "submitted_at": float(j.get("submitted_at") or 0.0)})
    live = [e for e in out.values() if is_run_dir(Path(e["run_dir"]))]
    return sorted(live, key=lambda e: e["submitted_at"], reverse=True)


def find_run(target: str | None, *, slurm=None, home: Path | None = None, cwd: Path | None = None) -> Path:
    """The run directory for ``target``: a run directory path, a Slurm job id (digits, optionally
    ``ID_STEP``-free), or None for the most recent job. A job id that several recorded runs share (Slurm's
    ids restart with a new cluster) names the one Slurm runs under that id now, else it is refused.

    Args:
        slurm: a :class:`phoenix_hpc.slurm.client.SlurmClient` to ask about job ids unknown locally
            (None: do not ask Slurm).

    Raises:
        StatusError: no job recorded (None), unknown or ambiguous job id (the message lists the candidate run
            directories), or a path that is not a PHOENIX run directory.
    """
    if target is None:
        runs = known_runs(home, cwd)
        if not runs:
            raise StatusError(f"no PHOENIX job found (none in {(home or phoenix_home()) / INDEX_NAME} or ./runs); "
                              "pass a job id or a run directory")
        return Path(runs[0]["run_dir"])
    if not target.isdigit():
        return check_run_dir(target)
    from phoenix_hpc.errors import SlurmError

    rec = None
    if slurm is not None:
        try:
            rec = slurm.show_job(target)
        except SlurmError:
            rec = None
    cands = [e for e in known_runs(home, cwd) if e["job_id"] == target]
    if len(cands) == 1:
        return Path(cands[0]["run_dir"])
    if len(cands) > 1:
        # Slurm knows the job it runs now: its batch script names the run directory
        cmd = (rec or {}).get("Command") or ""
        live = [e for e in cands if cmd and Path(cmd).parent == Path(e["run_dir"])]
        if len(live) == 1:
            return Path(live[0]["run_dir"])
        listed = "; ".join(f"{e['run_dir']} (submitted {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(e['submitted_at']))})"
                           for e in cands)
        raise StatusError(f"JOBID: {target} names {len(cands)} runs (Slurm job ids restart when a cluster is "
                          f"restarted): {listed}; pass the run directory instead")
    if slurm is not None:
        if rec:
            cmd = rec.get("Command") or ""
            cand = Path(cmd).parent if cmd else None
            if cand is not None and is_run_dir(cand):
                j = _read_json(cand / JOB_NAME) or {}
                if str(j.get("job_id", target)) == target:
                    return cand.absolute()
            raise StatusError(f"JOBID: Slurm job {target} is not a PHOENIX job (its batch script {cmd!r} is not in "
                              "a PHOENIX run directory)")
    raise StatusError(f"JOBID: {target} is not a known job id (not in {(home or phoenix_home()) / INDEX_NAME}, "
                      "not under ./runs, and Slurm does not know it); pass the run directory instead")
