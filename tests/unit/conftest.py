"""Fixtures shared by unit modules that run a torch engine in this process."""

from __future__ import annotations

import pytest
import torch.distributed as dist


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
