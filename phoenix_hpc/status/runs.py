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

"The most recent job" (:func:`find_run` without a target, the default of ``phoenix status``,
``inject-fault`` and ``drain``) is the newest entry of 1 and 2 that is a job of the cluster this command talks
to (:mod:`phoenix_hpc.slurm.identity`: the ``slurm.conf`` path and its ``ClusterName``, which the index
records with each job) and that this cluster's Slurm confirms (:func:`judge_default`): its record of that job
id names ``RUN_DIR/job.sbatch``. The index is shared by every checkout and cluster of an account, and job ids
restart with each new cluster, so the newest line may be another cluster's job, and a job id of this cluster
may belong to another run. A job of this cluster that Slurm no longer remembers (``MinJobAge``,
slurm.conf(5)) is the default of ``phoenix status`` only (``live=False``); a command that acts on a running
job needs Slurm's confirmation. When no entry qualifies, :class:`StatusError` says so (exit code 2).
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
               home: Path | None = None, identity: dict[str, str | None] | None = None) -> Path:
    """Append ``{"job_id", "run_dir", "submitted_at", "slurm_conf", "cluster"}`` to the runs index (one
    ``O_APPEND`` write of a whole line; the index folder is made 0700); ``identity``: the cluster the job was
    submitted to (default: the one this process's Slurm commands talk to,
    :func:`phoenix_hpc.slurm.identity.cluster_identity`). Returns the index path."""
    from phoenix_hpc.slurm.identity import cluster_identity

    home = home or phoenix_home()
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    ident = identity or cluster_identity()
    line = json.dumps({"job_id": str(job_id), "run_dir": str(Path(run_dir).absolute()),
                       "submitted_at": time.time() if submitted_at is None else float(submitted_at),
                       "slurm_conf": ident.get("slurm_conf"), "cluster": ident.get("cluster")}) + "\n"
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
    "submitted_at", "slurm_conf", "cluster"}`` (the last two None where not recorded), newest first; entries
    whose run directory is gone are dropped."""
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
                                                "submitted_at": float(e.get("submitted_at") or 0.0),
                                                "slurm_conf": e.get("slurm_conf"), "cluster": e.get("cluster")}
            except (ValueError, KeyError, TypeError):
                continue
    runs = cwd / "runs"
    if runs.is_dir():
        for jf in runs.glob(f"*/{JOB_NAME}"):
            j = _read_json(jf)
            if j and j.get("job_id") is not None:
                rd = str(jf.parent.absolute())
                out.setdefault(rd, {"job_id": str(j["job_id"]), "run_dir": rd,
                                    "submitted_at": float(j.get("submitted_at") or 0.0),
                                    "slurm_conf": None, "cluster": None})
    live = [e for e in out.values() if is_run_dir(Path(e["run_dir"]))]
    return sorted(live, key=lambda e: e["submitted_at"], reverse=True)


#: What :func:`judge_default` says of an entry.
CONFIRMED, REMEMBERED, OTHER_CLUSTER, OTHER_RUN, UNCONFIRMED = (
    "confirmed", "not in Slurm", "another cluster", "another run", "unconfirmed")


def same_cluster(entry: dict[str, Any], identity: dict[str, str | None]) -> bool | None:
    """Whether an entry was recorded for the cluster ``identity`` (same slurm.conf path and ClusterName); None
    when the entry records no cluster (an index line of an older release, or ``./runs/*/job.json``). Pure."""
    if not entry.get("slurm_conf"):
        return None
    return entry.get("slurm_conf") == identity.get("slurm_conf") and entry.get("cluster") == identity.get("cluster")


def judge_default(entry: dict[str, Any], identity: dict[str, str | None], slurm_job: dict[str, str] | None) -> str:
    """Whether ``entry`` may be "the most recent job" on the cluster ``identity``. Pure.

    Args:
        slurm_job: that cluster's ``scontrol show job`` record of ``entry["job_id"]`` (None: Slurm has none,
            or could not be asked).

    Returns:
        :data:`CONFIRMED` Slurm's job of that id runs ``RUN_DIR/job.sbatch`` of the entry (its ``Command``);
        :data:`OTHER_RUN` Slurm's job of that id is another batch script (the id was reused);
        :data:`OTHER_CLUSTER` the entry was recorded for another cluster;
        :data:`REMEMBERED` recorded for this cluster, and Slurm has no record of the id (forgotten after
        ``MinJobAge``, or not reachable); :data:`UNCONFIRMED` neither recorded for a cluster nor known to Slurm.
    """
    same = same_cluster(entry, identity)
    if same is False:
        return OTHER_CLUSTER
    if slurm_job:
        cmd = slurm_job.get("Command") or ""
        return CONFIRMED if cmd and Path(cmd).parent == Path(entry["run_dir"]) else OTHER_RUN
    return REMEMBERED if same else UNCONFIRMED


#: Slurm is asked about at most this many recorded runs, newest first (one ``scontrol show job`` each); older
#: ones count as Slurm's answer "no record".
MAX_SLURM_QUERIES = 20


def default_run(*, slurm=None, live: bool = False, home: Path | None = None, cwd: Path | None = None,
                identity: dict[str, str | None] | None = None) -> Path:
    """The run directory of "the most recent job" (module doc): the newest recorded run that
    :func:`judge_default` calls :data:`CONFIRMED`, or (``live`` False) :data:`REMEMBERED`.

    Args:
        slurm: a :class:`phoenix_hpc.slurm.client.SlurmClient` of the cluster the command talks to (None:
            Slurm is not asked, so nothing is confirmed).
        live: the command acts on a running job (``inject-fault``, ``drain``): Slurm must confirm it.
        identity: that cluster (default: :func:`phoenix_hpc.slurm.identity.cluster_identity` of this process).

    Raises:
        StatusError: no recorded run qualifies; the message says how many were passed over and why.
    """
    from phoenix_hpc.errors import SlurmError
    from phoenix_hpc.slurm.identity import cluster_identity

    ident = identity or cluster_identity()
    runs = known_runs(home, cwd)
    skipped: dict[str, int] = {}
    asked = 0
    for e in runs:
        rec = None
        if slurm is not None and same_cluster(e, ident) is not False and asked < MAX_SLURM_QUERIES:
            asked += 1
            try:
                rec = slurm.show_job(e["job_id"])
            except SlurmError:
                rec = None
        verdict = judge_default(e, ident, rec)
        if verdict == CONFIRMED or (verdict == REMEMBERED and not live):
            return Path(e["run_dir"])
        skipped[verdict] = skipped.get(verdict, 0) + 1
    where = f"{(home or phoenix_home()) / INDEX_NAME} or ./runs"
    cluster = f"{ident.get('cluster') or 'unnamed'} (SLURM_CONF={ident.get('slurm_conf')})"
    if not runs:
        raise StatusError(f"no PHOENIX job found (none in {where}); pass a job id or a run directory")
    why = {OTHER_CLUSTER: "recorded for another cluster", OTHER_RUN: "their job id is another job on this cluster now",
           UNCONFIRMED: "not known to this cluster's Slurm and recorded for no cluster",
           REMEMBERED: "no longer known to this cluster's Slurm (a running job is needed)"}
    listed = "; ".join(f"{n} {why[v]}" for v, n in skipped.items())
    raise StatusError(f"no PHOENIX job of the Slurm cluster {cluster} found in {where} ({len(runs)} recorded: "
                      f"{listed}); pass a job id or a run directory")


def find_run(target: str | None, *, slurm=None, home: Path | None = None, cwd: Path | None = None,
             live: bool = False) -> Path:
    """The run directory for ``target``: a run directory path, a Slurm job id (digits, optionally
    ``ID_STEP``-free), or None for the most recent job of this cluster (:func:`default_run`, ``live``: Slurm
    must confirm it). A job id that several recorded runs share (Slurm's ids restart with a new cluster)
    names the one of this cluster, or the one Slurm runs under that id now, else it is refused.

    Args:
        slurm: a :class:`phoenix_hpc.slurm.client.SlurmClient` to ask about job ids unknown locally
            (None: do not ask Slurm).

    Raises:
        StatusError: no job of this cluster recorded (None), unknown or ambiguous job id (the message lists
            the candidate run directories), or a path that is not a PHOENIX run directory.
    """
    if target is None:
        return default_run(slurm=slurm, live=live, home=home, cwd=cwd)
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
    if len(cands) > 1:  # another cluster's run of the same id is not meant
        from phoenix_hpc.slurm.identity import cluster_identity

        ident = cluster_identity()
        cands = [e for e in cands if same_cluster(e, ident) is not False] or cands
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
