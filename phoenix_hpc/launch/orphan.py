"""Ending a job whose batch host is lost (docs/design.md section 7, "Batch-host loss").

Measured on Slurm 22.05 (``scripts/measure-batch-host-loss.py``): when the node that runs the batch script
dies, a job started with ``--no-kill`` is not ended. Slurm removes the node from the job once it marks it
DOWN and keeps the job RUNNING on the other nodes until its time limit: nobody is left to end it (the batch
script and the coordinator ran on that node), its allocation is held, and a chained run's next job
(``--dependency=afternotok``) waits for the time limit.

So when a slot gives up on the coordinator (``resilience.coordinator_timeout_s``: typically the standby
slots, which wait for instructions, and ranks blocked in a step; a rank whose step failed on the lost peer
exits before), the first task of each node other than the batch host's (``SLURM_LOCALID=0``,
``SLURM_NODEID`` not 0) asks Slurm whether the batch host is lost (:func:`batch_host_lost`), every
:data:`POLL_S` seconds for up to :data:`WATCH_S` (Slurm marks a dead node NOT_RESPONDING within about
``SlurmdTimeout``), and if so cancels the job; the first to see it cancels, the others then see the job
ended. A batch host that is alive ends the job itself (its script sees the srun step end).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping

WATCH_S = 120.0  # how long the watching rank asks Slurm before it leaves the job to its time limit
POLL_S = 10.0
_LOST = ("DOWN", "NOT_RESPONDING", "FAIL", "POWER")


def is_watcher(environ: Mapping[str, str]) -> bool:
    """Whether this task watches the batch host after the coordinator is lost: the first task of every node
    but the batch host's (node 0). Pure."""
    return bool(environ.get("SLURM_JOB_ID")) and environ.get("SLURM_NODEID", "0") != "0" and \
        environ.get("SLURM_LOCALID", "0") == "0"


def first_delay_s(environ: Mapping[str, str]) -> float:
    """Seconds a watcher waits before its first look, spread by node (0.5 s per node index, at most
    :data:`POLL_S`), so that the watchers of a large job do not ask Slurm at the same moment. Pure."""
    try:
        return min(POLL_S, 0.5 * (int(environ.get("SLURM_NODEID", "1")) - 1))
    except ValueError:
        return 0.0


def batch_host_lost(job: Mapping[str, str], node: Mapping[str, str] | None, hostnames: list[str]) -> str | None:
    """Why Slurm's records say the job's batch host is lost, or None. ``job``: ``scontrol show job``;
    ``node``: ``scontrol show node`` of its BatchHost; ``hostnames``: the job's NodeList expanded. Lost: the
    batch host was removed from the job's node list (Slurm excises a failed node from a ``--no-kill`` job),
    or its state is DOWN / NOT_RESPONDING / FAIL. Pure."""
    host = job.get("BatchHost")
    if not host or host == "(null)":
        return None
    if hostnames and host not in hostnames:
        return f"Slurm removed the batch host {host} from the job"
    state = str((node or {}).get("State") or "")
    if any(s in state.upper() for s in _LOST):
        return f"the batch host {host} is {state}"
    return None


def end_job_if_batch_host_lost(environ: Mapping[str, str] | None = None, client=None,
                               log: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic,
                               sleep: Callable[[float], None] = time.sleep, watch_s: float = WATCH_S) -> bool:
    """Called by a rank that gave up on the coordinator. On the watching task only: ask Slurm every
    :data:`POLL_S` seconds, for up to ``watch_s``, whether the batch host is lost; if so, cancel the job
    (``scancel JOB``). Returns whether it cancelled. Never raises for Slurm errors."""
    from phoenix_hpc.errors import SlurmError

    env = os.environ if environ is None else environ
    if not is_watcher(env):
        return False
    job_id = env["SLURM_JOB_ID"]
    if client is None:
        from phoenix_hpc.slurm.client import SlurmClient

        client = SlurmClient(timeout_s=15.0)
    deadline = clock() + watch_s
    sleep(first_delay_s(env))
    while clock() < deadline:
        try:
            job = client.show_job(job_id)
            if job.get("JobState") not in ("RUNNING", "SIGNALING", "CONFIGURING"):
                return False
            host = job.get("BatchHost")
            nodes = client.show_nodes(host) if host and host != "(null)" else []
            why = batch_host_lost(job, nodes[0] if nodes else None, client.hostnames(job.get("NodeList") or ""))
        except SlurmError:
            why = None
        if why is not None:
            log(f"[phoenix] {why}: nothing is left to end job {job_id}; cancelling it so its allocation is released "
                "(a chained run's next job then starts)")
            try:
                client.cancel(job_id)
            except SlurmError as exc:
                log(f"[phoenix] scancel {job_id} failed: {exc}")
                return False
            return True
        sleep(POLL_S)
    return False


def coordinator_listening(host: str, port: int, timeout_s: float = 2.0) -> bool:
    """Whether the coordinator's store still accepts a TCP connection at ``host:port``."""
    import socket

    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def log_line(message: str, run_dir: str | None) -> None:
    """To stderr and, since srun (which relays the tasks' stderr) may have died with the batch host, to
    ``RUN_DIR/logs/batch-host.log``."""
    import sys

    print(message, file=sys.stderr, flush=True)
    if run_dir:
        try:
            with open(os.path.join(run_dir, "logs", "batch-host.log"), "a") as f:
                f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {message}\n")
        except OSError:
            pass


def after_coordinator_loss(run_dir: str | None) -> bool:
    """Called by a slot that ends because the coordinator is gone (its watchdog, or a step that failed
    while the coordinator's store no longer answers): watch the batch host (:func:`end_job_if_batch_host_lost`).
    Never raises."""
    try:
        return end_job_if_batch_host_lost(log=lambda m: log_line(m, run_dir))
    except Exception:  # noqa: BLE001 -- the slot exits regardless
        return False
