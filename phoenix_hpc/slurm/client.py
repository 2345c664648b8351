"""Job-side Slurm access: the one module that talks to Slurm (through :func:`phoenix_hpc.slurm.run.run_slurm`).

Operations: ``sbatch --parsable``, ``squeue --json``, ``scontrol show job/node/step/topology`` (their
``key=value`` text, parsed here: Slurm 22.05 has no ``scontrol --json``, that needs 23.02+),
``scontrol show hostnames``, ``scontrol write batch_script``, ``scancel``.

Only the command path exists; pyslurm is not used. Its releases follow Slurm's (pyslurm 25.11.x for Slurm
25.11) and build only against that release's ``libslurm`` and headers; the package index offers it for Slurm
25.11 and for releases before 18.08, none for 22.05, the release this project is tested on, so a mapping from
pyslurm's objects to the records below could not be tested against the real package.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from phoenix_hpc.errors import SlurmError
from phoenix_hpc.slurm.run import run_slurm

Runner = Callable[..., Any]
#: Job states of a job that has not ended yet (squeue(1) / scontrol(1) "JOB STATE CODES").
ACTIVE_JOB_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
                               "RESIZING", "SIGNALING", "STAGE_OUT"})

_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")
_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_:/.\-]*$")


def parse_key_values(line: str) -> dict[str, str]:
    """Parse one ``scontrol show ... -o`` record (``Key=value Key2=value with spaces ...``) into a dict.

    A whitespace-separated token without ``=`` (or whose key part is not a key) continues the previous value,
    so values with spaces (``JobName=my job``) survive. Values keep everything after the first ``=``.
    """
    out: dict[str, str] = {}
    last: str | None = None
    for tok in line.split():
        key, eq, val = tok.partition("=")
        if eq and _KEY.match(key):
            out[key] = val
            last = key
        elif last is not None:
            out[last] = f"{out[last]} {tok}"
    return out


def parse_records(text: str) -> list[dict[str, str]]:
    """Each non-empty line of ``scontrol -o`` output as one record."""
    return [parse_key_values(line) for line in text.splitlines() if line.strip() and "=" in line]


def parse_job_id(text: str) -> str:
    """The job id printed by ``sbatch --parsable`` (``"1234"`` or ``"1234;cluster"``).

    Raises:
        SlurmError: the output holds no job id.
    """
    first = text.strip().splitlines()[-1] if text.strip() else ""
    job_id = first.split(";")[0].strip()
    if not job_id.isdigit():
        raise SlurmError(f"sbatch --parsable printed no job id: {text.strip()!r}")
    return job_id


# What Slurm's clients print when no controller can be reached (slurm 22.05: src/common/read_config.c,
# src/api/*: "Unable to contact slurm controller", "fetch_config: DNS SRV lookup failed", ...)
_UNREACHABLE = ("Unable to contact slurm controller", "Could not establish a configuration source",
                "DNS SRV lookup failed", "Unable to process configuration file", "Connection refused",
                "Socket timed out", "is not installed")


def slurm_unreachable(message: str) -> bool:
    """Whether a failed Slurm command's message (a :class:`SlurmError`) means no Slurm controller could be
    reached (none configured, daemons stopped, commands missing), rather than an answer such as "Invalid job
    id specified"."""
    return any(m.lower() in message.lower() for m in _UNREACHABLE)


def error_line(exc: Exception) -> str:
    """A Slurm failure as one short line: "Slurm not reachable" when :func:`slurm_unreachable`, else the
    first line of the message."""
    msg = str(exc)
    if slurm_unreachable(msg):
        return "Slurm not reachable"
    return (msg.splitlines() or [""])[0][:160]


_UNUSABLE_STATES = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "FUTURE", "MAINT", "POWERED_DOWN", "POWER_DOWN")


def node_usable(state: str | None) -> bool:
    """Whether a node in ``scontrol show node`` State ``state`` (``IDLE``, ``MIXED+DRAIN``, ``DOWN*``, ...) can
    be allocated: not DOWN, DRAIN(ED/ING), FAIL(ING), FUTURE, MAINT or powered down, and responding (no ``*``
    suffix); scontrol(1), "NODE STATE CODES" of sinfo(1)."""
    if not state:
        return False
    s = state.upper()
    return not s.endswith("*") and not any(u in s for u in _UNUSABLE_STATES)


def usable_node_names(records: Sequence[Mapping[str, str]], partition: str | None = None) -> list[str]:
    """The ``NodeName`` of each ``scontrol show node -o`` record that :func:`node_usable` accepts and, when
    ``partition`` is given, whose ``Partitions`` list names it."""
    out = []
    for r in records:
        parts = [p for p in str(r.get("Partitions") or "").split(",") if p]
        if partition is not None and partition not in parts:
            continue
        if node_usable(r.get("State")) and r.get("NodeName"):
            out.append(str(r["NodeName"]))
    return out


class SlurmClient:
    """Slurm operations for jobs. ``env`` is added to each command's environment (e.g. the local cluster's
    ``SLURM_CONF``); ``runner`` defaults to :func:`run_slurm` (tests of parsing may pass another)."""

    def __init__(self, env: Mapping[str, str] | None = None, runner: Runner = run_slurm, timeout_s: float = 60.0):
        self.env = dict(env or {})
        self._run = runner
        self.timeout_s = timeout_s

    def _out(self, args: Sequence[str], check: bool = True) -> str:
        return self._run(list(args), env=self.env, timeout_s=self.timeout_s, check=check).stdout

    # --- versions / backend ---------------------------------------------------------------------------------
    def slurm_version(self) -> str | None:
        """The installed Slurm release, e.g. ``"22.05.8"`` (from ``sbatch --version``); None if unknown."""
        try:
            text = self._out(["sbatch", "--version"])
        except SlurmError:
            return None
        m = _VERSION.search(text)
        return m.group(0) if m else None

    # --- submission / cancel ------------------------------------------------------------------------------
    def submit(self, script: str | Path, extra_args: Sequence[str] = ()) -> str:
        """``sbatch --parsable [extra_args] SCRIPT``; returns the job id.

        Raises:
            SlurmError: sbatch failed (its message is included) or printed no job id.
        """
        return parse_job_id(self._out(["sbatch", "--parsable", *extra_args, str(script)]))

    def cancel(self, job_id: str, signal: str | None = None, batch: bool = False) -> None:
        """``scancel [--batch] [--signal=SIG] JOB``. scancel(1): with ``--signal`` alone the signal goes to the
        job's steps, not to the batch shell; ``--batch`` sends it to the batch shell only (what Slurm does
        before the time limit for ``sbatch --signal=B:SIG@s``)."""
        self._out(["scancel", *(["--batch"] if batch else []), *([f"--signal={signal}"] if signal else []),
                   str(job_id)])

    def set_time_limit(self, job_id: str, minutes: int) -> None:
        """``scontrol update JobId=JOB TimeLimit=MINUTES``. scontrol(1): a user may lower the time limit of
        a job of their own, also while it runs; a limit already passed ends the job as TIMEOUT at slurmctld's
        next time-limit check (about every 30 s).

        Raises:
            SlurmError: scontrol refused (its message is included).
        """
        self._out(["scontrol", "update", f"JobId={job_id}", f"TimeLimit={int(minutes)}"])

    # --- reading ------------------------------------------------------------------------------------------
    def queue(self, job_id: str | None = None) -> list[dict[str, Any]]:
        """``squeue --json [--jobs=ID]``: the ``jobs`` list (Slurm's JSON objects, works on 22.05)."""
        args = ["squeue", "--json"] + ([f"--jobs={job_id}"] if job_id else [])
        text = self._out(args)
        try:
            return list(json.loads(text).get("jobs", []))
        except (json.JSONDecodeError, AttributeError) as exc:
            raise SlurmError(f"squeue --json printed unreadable output: {exc}") from None

    def show_job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o ID`` as a dict (JobState, NodeList, NumNodes, BatchHost, ...).

        Raises:
            SlurmError: no such job (Slurm forgets finished jobs after MinJobAge).
        """
        recs = parse_records(self._out(["scontrol", "show", "job", "-o", str(job_id)]))
        if not recs:
            raise SlurmError(f"scontrol show job {job_id} printed no job")
        return recs[0]

    def show_nodes(self, nodes: str | None = None) -> list[dict[str, str]]:
        """``scontrol show node -o [NODES]``: one dict per node (NodeName, State, ...)."""
        return parse_records(self._out(["scontrol", "show", "node", "-o", *([nodes] if nodes else [])]))

    def node_counts(self, partition: str | None = None) -> tuple[int, int]:
        """``(usable, all)`` nodes of the cluster (of ``partition`` when given), from ``scontrol show node``
        (:func:`usable_node_names`).

        Raises:
            SlurmError: scontrol failed (Slurm not reachable).
        """
        recs = self.show_nodes()
        if partition is not None:
            recs = [r for r in recs if partition in str(r.get("Partitions") or "").split(",")]
        return len(usable_node_names(recs)), len(recs)

    def show_steps(self, job_id: str) -> list[dict[str, str]]:
        """``scontrol show step -o JOB``: one dict per step of the job (StepId, State, NodeList, ...)."""
        text = self._out(["scontrol", "show", "step", "-o", str(job_id)], check=False)
        return parse_records(text)

    def show_topology(self) -> list[dict[str, str]]:
        """``scontrol show topology``: one dict per switch (SwitchName, Level, Nodes or Switches); an empty list
        when the cluster has no topology plugin configured."""
        text = self._out(["scontrol", "show", "topology"], check=False)
        return [r for r in parse_records(text) if "SwitchName" in r]

    def hostnames(self, nodelist: str) -> list[str]:
        """``scontrol show hostnames LIST``: the expanded node names."""
        return [h for h in self._out(["scontrol", "show", "hostnames", nodelist]).split() if h]

    def batch_script(self, job_id: str) -> str:
        """The batch script Slurm stored for the job (``scontrol write batch_script JOB -``)."""
        return self._out(["scontrol", "write", "batch_script", str(job_id), "-"])
