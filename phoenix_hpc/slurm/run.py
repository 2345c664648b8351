"""The single place where Slurm client commands (sbatch, srun, squeue, scontrol, sinfo, scancel) are run.

Everything else calls :func:`run_slurm`, so tests and the local cluster can point all of them at one
cluster by passing its environment (``SLURM_CONF``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence

from phoenix_hpc.errors import SlurmError

SLURM_CLIENTS = frozenset({"sbatch", "srun", "squeue", "scontrol", "sinfo", "scancel", "sacct", "sstat"})


def run_slurm(
    args: Sequence[str],
    env: Mapping[str, str] | None = None,
    timeout_s: float = 60.0,
    check: bool = True,
    input_text: str | None = None,
) -> subprocess.CompletedProcess:
    """Run one Slurm client command and return the finished process (text stdout/stderr).

    Args:
        args: the command and its arguments, e.g. ``["squeue", "--json"]``; never passed to a shell.
        env: variables added to this process's environment (e.g. ``SLURM_CONF`` of a local cluster).
        timeout_s: seconds before the command is killed.
        check: raise on a non-zero exit status.
        input_text: text written to the command's stdin.

    Raises:
        SlurmError: the command is not a Slurm client, is not installed (names ``scripts/setup.sh``), timed
            out, or (with ``check``) exited non-zero; the message carries its stderr.
    """
    if not args or args[0] not in SLURM_CLIENTS:
        raise SlurmError(f"not a Slurm client command: {list(args)[:1]}")
    if shutil.which(args[0]) is None:
        raise SlurmError(f"{args[0]} is not installed; run scripts/setup.sh to install Slurm")
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    try:
        proc = subprocess.run(
            list(args), env=full_env, capture_output=True, text=True, timeout=timeout_s, input=input_text
        )
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{' '.join(args)} did not finish within {timeout_s} s") from None
    if check and proc.returncode != 0:
        raise SlurmError(f"{' '.join(args)} failed (exit {proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return proc
