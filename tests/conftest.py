"""Shared pytest fixtures.

``slurm_cluster`` starts ONE real local Slurm cluster per test session (6 nodes on 2 leaf switches plus a
spine, 4 fake GPUs per node) the first time a test asks for it, and stops it at session end, also when
tests fail or the session is interrupted (pytest finalizer plus an ``atexit`` hook). Tests that take a node
down (``phoenix_hpc.slurm.cluster.kill_node``) must bring it back (``revive_node``) before they end, and
tests must cancel the jobs they leave running, so later tests find every node idle.

Set ``PHOENIX_KEEP_CLUSTER_DIR=1`` to keep the run directory (daemon logs) after the session.

The runs index (``$PHOENIX_HOME/runs.jsonl``, by default the user's ``~/.phoenix``) is never the user's own:
:func:`pytest_configure` points ``PHOENIX_HOME`` at a fresh temporary folder for the whole session (each
xdist worker its own), so every ``phoenix`` command a test runs in-process or as a subprocess records and
looks up its jobs there; tests that need an index of their own set ``PHOENIX_HOME`` again.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from phoenix_hpc.errors import ClusterError
from phoenix_hpc.slurm import cluster as local_cluster

REPO_ROOT = Path(__file__).resolve().parents[1]

#: Size of the session cluster: the main drill uses 4 active + 2 spare nodes.
SESSION_NODES = 6
SESSION_SWITCHES = 2
SESSION_GPUS_PER_NODE = 4


def pytest_configure(config) -> None:
    home = Path(tempfile.mkdtemp(prefix="phx-home-"))
    config._phoenix_home = home  # removed again by pytest_unconfigure
    os.environ["PHOENIX_HOME"] = str(home)


def pytest_unconfigure(config) -> None:
    home = getattr(config, "_phoenix_home", None)
    if home is not None:
        shutil.rmtree(home, ignore_errors=True)


def _short_run_dir() -> Path:
    # Unix socket paths under the run directory must stay below 108 bytes: use a short temp folder.
    return Path(tempfile.mkdtemp(prefix="phx-", dir=tempfile.gettempdir()))


@pytest.fixture(scope="session")
def slurm_cluster(request) -> local_cluster.Cluster:
    """The session's local Slurm cluster (:class:`phoenix_hpc.slurm.cluster.Cluster`).

    Useful attributes: ``run_dir``, ``env`` (``{"SLURM_CONF": ...}``, add it to a Slurm command's
    environment), ``nodes`` (``["nid00001", ...]``), ``switches`` (leaf -> nodes), ``slurm_conf``,
    ``slurmd_timeout_s``.
    """
    run_dir = _short_run_dir()
    done = []

    def stop() -> None:
        if done:
            return
        done.append(True)
        try:
            local_cluster.down(run_dir)
        except ClusterError as exc:  # no cluster.json (start failed early): nothing of ours runs
            if (run_dir / local_cluster.CLUSTER_JSON).exists():
                raise
            print(f"slurm_cluster teardown: {exc}")
        if os.environ.get("PHOENIX_KEEP_CLUSTER_DIR") == "1":
            print(f"slurm_cluster: run directory kept at {run_dir}")
        else:
            shutil.rmtree(run_dir, ignore_errors=True)

    request.addfinalizer(stop)
    atexit.register(stop)
    return local_cluster.up(run_dir, nodes=SESSION_NODES, switches=SESSION_SWITCHES,
                            gpus_per_node=SESSION_GPUS_PER_NODE)


def slurm_env_for(cluster: local_cluster.Cluster) -> dict[str, str]:
    """A full environment for a subprocess that runs Slurm commands against ``cluster``: this process's
    environment plus the cluster's variables, with the project's virtualenv first on PATH."""
    env = dict(os.environ)
    env.update(cluster.env)
    venv_bin = REPO_ROOT / ".venv" / "bin"
    if venv_bin.is_dir():
        env["PATH"] = f"{venv_bin}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.fixture(scope="session")
def slurm_env(slurm_cluster) -> dict[str, str]:
    """:func:`slurm_env_for` of the session cluster (pass as ``env=`` to subprocess calls)."""
    return slurm_env_for(slurm_cluster)
