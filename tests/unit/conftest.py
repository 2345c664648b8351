"""Fixtures shared by unit modules that run a torch engine in this process or in a child process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

#: the start of a child's code (:func:`child_result`) that builds a 2-layer torch ``engine`` on CPU, logical
#: rank 0 of a 1x1x1 grid on a gloo world of size 1, on a dataset written in the child's argument folder;
#: ``{global_batch_size}`` is filled in by the test
TORCH_ENGINE_CHILD = r"""
import json, sys
from pathlib import Path
import torch, torch.distributed as dist
from phoenix_hpc.gpucheck import common
from phoenix_hpc.engines.factory import create_engine
from phoenix_hpc.launch.groups import Grid, init_generation
from phoenix_hpc.launch.loop import train

work = Path(sys.argv[1])
cfg = common.job_config("torch", common.dataset(work),
                        {"layers": 2, "hidden_size": 32, "heads": 4, "vocab_size": 256, "seq_length": 32},
                        {"steps": 100, "micro_batch_size": 2, "global_batch_size": {global_batch_size}, "seed": 1})
groups, coord = init_generation(dist.HashStore(), 0, 0, Grid(1, 1, 1), "gloo", 60.0)
engine = create_engine(cfg, coord, groups, torch.device("cpu"))
"""


@pytest.fixture()
def torch_engine_child():
    """``code(global_batch_size)``: :data:`TORCH_ENGINE_CHILD` with that global batch size."""
    return lambda global_batch_size: TORCH_ENGINE_CHILD.replace("{global_batch_size}", str(global_batch_size))


@pytest.fixture()
def child_result(tmp_path):
    """``run(code, timeout=300, env=None)``: runs ``code`` in a fresh interpreter (``python -c``, from the
    repository root, with ``tmp_path`` as its one argument) and returns the JSON it printed on its line that
    starts with ``RESULT ``; the test fails with the child's stderr when it exits non-zero."""

    def run(code: str, timeout: float = 300, env: dict | None = None):
        r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                           timeout=timeout, cwd=Path(__file__).resolve().parents[2], env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT "))[7:])

    return run


@pytest.fixture()
def world1():
    """A gloo default group of world size 1 (a ``HashStore``), as the four groups of one rank; destroyed after."""
    from phoenix_hpc.engines.base import ProcessGroups

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    g = dist.group.WORLD
    yield ProcessGroups(world=g, dp=g, pp=g, tp=g, generation=0)
    dist.destroy_process_group()


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory) -> str:
    """A byte-level dataset of the first 100 kB of the standard library: its path prefix."""
    from phoenix_hpc.data.prepare import prepare_dataset, stdlib_dir

    out = tmp_path_factory.mktemp("data") / "stdlib"
    prepare_dataset(stdlib_dir(), out, max_bytes=100_000)
    return str(out)
