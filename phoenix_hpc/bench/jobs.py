"""Jobs of the benchmarks on the local cluster: job configs, batch submission, waiting, machine facts.

Slurm commands go through :class:`phoenix_hpc.slurm.client.SlurmClient` (``sbatch``, ``squeue``,
``scancel``); ``phoenix submit`` jobs are started with the ``phoenix`` CLI itself, as a user would.
A job that completed stays in ``squeue`` for ``MinJobAge`` seconds (slurm.conf(5)) with a final
``job_state``; :func:`wait_job_end` therefore watches the state, not the presence, of the job.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from phoenix_hpc.slurm.client import ACTIVE_JOB_STATES
from phoenix_hpc.errors import BenchError

#: squeue job states of a job that has not ended yet (squeue(1) "JOB STATE CODES").
LIVE_STATES = ACTIVE_JOB_STATES

#: The ``phoenix`` command run with this interpreter (the console script may not be on PATH).
PHOENIX_CLI = (sys.executable, "-c", "import sys; from phoenix_hpc.cli.main import cli; sys.exit(cli())")

#: Model sizes of the benchmarks (the CPU torch engine; byte-level vocabulary of ``phoenix data prepare``).
MODEL_SIZES: dict[str, dict[str, int]] = {
    "S": {"layers": 4, "hidden_size": 128, "heads": 4, "seq_length": 64},
    "M": {"layers": 4, "hidden_size": 256, "heads": 4, "seq_length": 128},
    "L": {"layers": 6, "hidden_size": 384, "heads": 6, "seq_length": 128},
}


def model_params(size: str, vocab_size: int = 256, seq_length: int | None = None) -> int:
    """Parameter count of a GPT of :data:`MODEL_SIZES` ``size`` (12 h^2 per layer for attention + MLP,
    plus embeddings and position embeddings, ``seq_length`` of them if given; biases and norms ignored:
    < 1 %)."""
    m = MODEL_SIZES[size]
    h = m["hidden_size"]
    return 12 * h * h * m["layers"] + vocab_size * h + (m["seq_length"] if seq_length is None else seq_length) * h


def job_config(*, name: str, size: str, pp: int, nodes: int, spares: int, steps: int, data_path: str,
               global_batch: int = 8, micro_batch: int = 2, resilience: Mapping[str, Any] | None = None,
               time_limit: str = "00:15:00", run_dir: str | None = None, seq_length: int | None = None) -> dict:
    """A job config (the dict form of ``config.yaml``) for the benchmarks: the torch engine on CPU, one
    slot per node, ``tp=1``, ``pp`` as given and ``dp = nodes / pp``; ``seq_length`` replaces the size's.

    Raises:
        BenchError: an unknown ``size`` or a ``seq_length`` below 1."""
    if size not in MODEL_SIZES:
        raise BenchError(f"model size: {size!r} is not one of {sorted(MODEL_SIZES)}")
    if seq_length is not None and seq_length < 1:
        raise BenchError(f"seq_length: {seq_length!r} -- allowed: a positive integer, or None for the size's")
    res = {"enabled": True, "mode": "phoenix", "k": 1, "placement_levels": ["node"],
           "heartbeat_interval_s": 0.5, "heartbeat_timeout_s": 3.0, "collective_timeout_s": 30.0}
    res.update(resilience or {})
    cfg = {
        "name": name,
        "engine": "torch",
        "model": {**MODEL_SIZES[size], **({} if seq_length is None else {"seq_length": seq_length}), "vocab_size": 256,
                  "dtype": "float32"},
        "parallelism": {"tp": 1, "pp": pp},
        "training": {"steps": steps, "micro_batch_size": micro_batch, "global_batch_size": global_batch,
                     "lr": 1.0e-4, "min_lr": 1.0e-5, "lr_schedule": "constant", "warmup_steps": 0, "seed": 1234,
                     "log_interval": 10},
        "data": {"path": data_path},
        "resilience": res,
        "resources": {"nodes": nodes, "spares": spares, "time_limit": time_limit},
    }
    if run_dir is not None:
        cfg["run_dir"] = run_dir
    return cfg


def write_yaml(path: Path, obj: Mapping[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(yaml.safe_dump(dict(obj), sort_keys=False))
    os.replace(tmp, path)
    return path


def job_state(client, job_id: str) -> str | None:
    """The job's ``job_state`` in squeue (None when squeue no longer lists it)."""
    jobs = [j for j in client.queue(job_id) if str(j.get("job_id")) == str(job_id)]
    if not jobs:
        return None
    st = jobs[0].get("job_state")
    return st[0] if isinstance(st, list) and st else str(st)


def wait_job_end(client, job_id: str, timeout_s: float, poll_s: float = 0.25) -> tuple[str | None, float]:
    """Wait until the job has ended. Returns ``(final state, time.time() when the end was seen)``.

    Raises BenchError after ``timeout_s`` (the job is cancelled first, so nothing is left running)."""
    deadline = time.monotonic() + timeout_s
    while True:
        st = job_state(client, job_id)
        if st is None or st not in LIVE_STATES:
            return st, time.time()
        if time.monotonic() > deadline:
            client.cancel(job_id)
            raise BenchError(f"job {job_id} did not end within {timeout_s:.0f} s (state {st}); cancelled it")
        time.sleep(poll_s)


def submit_batch(client, script_path: Path, body: str, *, nodes: int, name: str, time_limit: str = "00:15:00",
                 ntasks_per_node: int = 1) -> str:
    """Write a batch script (``#!/bin/bash`` + ``body``) and submit it with ``sbatch``. Returns the job id."""
    script_path.parent.mkdir(parents=True, exist_ok=True)
    script_path.write_text("#!/bin/bash\nset -euo pipefail\n" + body)
    script_path.chmod(0o700)
    out = script_path.with_suffix(".out")
    return client.submit(script_path, extra_args=[f"--nodes={nodes}", f"--ntasks-per-node={ntasks_per_node}",
                                                  f"--time={time_limit}", f"--job-name={name}",
                                                  f"--output={out}", "--no-requeue"])


def phoenix_submit(config_path: Path, run_dir: Path, env: Mapping[str, str]) -> dict:
    """``phoenix submit --site local CONFIG --run-dir RUN_DIR --json`` (the CLI a user runs). Returns its
    JSON summary plus ``submitted_at`` (unix s, just before the command). Raises BenchError on failure."""
    t0 = time.time()
    proc = subprocess.run([*PHOENIX_CLI, "submit", "--site", "local",
                           str(config_path), "--run-dir", str(run_dir), "--json"],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise BenchError(f"phoenix submit {config_path} failed (exit {proc.returncode}): {proc.stderr.strip()}")
    out = json.loads(proc.stdout)
    out["submitted_at"] = t0
    return out


def git_commit(repo: Path) -> str:
    """``git rev-parse HEAD`` of ``repo`` ("unknown" outside a git checkout), ``+dirty`` if files differ."""
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + ("+dirty" if dirty else "")


def dirty_files(repo: Path) -> list[str]:
    """Tracked files of ``repo`` that differ from HEAD (what a ``+dirty`` commit consisted of)."""
    try:
        out = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line[3:] for line in out.splitlines() if line.strip()]


def machine_info(slurm_version: str | None, meminfo: str = "/proc/meminfo", cpuinfo: str = "/proc/cpuinfo",
                 thp_path: str | None = None, environ: dict[str, str] | None = None) -> dict:
    """Facts about this machine for the report: CPU model, logical CPUs, memory, OS, Python, torch, Slurm
    (``slurm_version``, from :meth:`SlurmClient.slurm_version`) and Open MPI versions, the kernel's
    transparent-huge-page mode (:func:`phoenix_hpc.slurm.procs.thp_mode` of ``thp_path``, default the
    kernel's file; None when unreadable) and the
    ``THP_MEM_ALLOC_ENABLE`` of the environment the benchmark's jobs inherit (``environ``, default this
    process's; None when unset): with both, torch's CPU tensors of >= 2 MiB get huge pages
    (``launcher.torch_huge_pages``, docs/design.md section 6)."""
    import torch

    from phoenix_hpc.profiles.model import TORCH_THP_VARIABLE
    from phoenix_hpc.slurm.procs import THP_MODE_PATH, thp_mode

    model = "unknown"
    try:
        for line in Path(cpuinfo).read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass

    def version(cmd: list[str]) -> str | None:
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
            text = (out.stdout or out.stderr).strip().splitlines()
            return text[0] if text else None
        except (OSError, subprocess.SubprocessError):
            return None

    return {"cpu": model, "logical_cpus": os.cpu_count(), "mem_gib": mem_gib, "os": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__,
            "slurm": slurm_version, "mpi": version(["mpirun", "--version"]),
            "gpu": "none (CPU torch engine, gloo)", "thp_mode": thp_mode(thp_path or THP_MODE_PATH),
            "thp_mem_alloc_enable": (os.environ if environ is None else environ).get(TORCH_THP_VARIABLE)}
