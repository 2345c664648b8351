"""The NCCL check's probe can fail at world size 1: an all-gather into a separate output (run on gloo here)."""

import subprocess
import sys
from pathlib import Path

CHILD = r"""
import torch.distributed as dist
from phoenix_hpc.gpucheck.check_nccl import collective_ran
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
ran = collective_ran(None, device="cpu")
dist.all_gather = lambda outs, x, group=None: None  # a collective that does nothing
idle = collective_ran(None, device="cpu")
print("RESULT", ran, idle)
"""


def test_a_collective_that_ran_passes_and_one_that_did_nothing_fails():
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0, r.stderr[-2000:]
    assert "RESULT True False" in r.stdout
