"""A closed protector is freed by reference counting alone (its host buffers go as soon as the last user drops
it), not only by CPython's cyclic garbage collector, which in a rank runs rarely (docs/design.md section 7:
``gc.freeze``): before, the H2H engine held a bound method of its protector, and after every recovery the
previous generation's protector with its host buffers stayed until the next recovery's collection.
Runs in a child process (MPI initialised there as a singleton, COMM_WORLD of size 1; gloo world of size 1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import gc, json, sys, weakref
from pathlib import Path
import torch
from mpi4py import MPI
from phoenix_hpc.gpucheck import common, protect
from phoenix_hpc.engines.factory import create_engine
from phoenix_hpc.launch.groups import Grid, init_generation
from phoenix_hpc.launch.loop import train

work = Path(sys.argv[1])
cfg = common.job_config("torch", common.dataset(work),
                        {"layers": 2, "hidden_size": 32, "heads": 4, "vocab_size": 256, "seq_length": 32},
                        {"steps": 100, "micro_batch_size": 2, "global_batch_size": 2, "seed": 1})
import torch.distributed as dist
groups, coord = init_generation(dist.HashStore(), 0, 0, Grid(1, 1, 1), "gloo", 60.0)
engine = create_engine(cfg, coord, groups, torch.device("cpu"))
out = {}
for abandon in (False, True):  # the normal end, and a recovery's close (abandon=True)
    prot = protect.make_protector(engine, MPI.COMM_WORLD, torch.device("cpu"))
    train(engine, engine.step + 3, 64, protector=prot, keep=False)
    prot.close(abandon=abandon)
    buf = weakref.ref(prot.buffers.local.bufs[0])
    ref = weakref.ref(prot)
    gc.collect()
    gc.disable()
    del prot
    out[str(abandon)] = [ref() is None, buf() is None]
    gc.enable()
print("RESULT " + json.dumps(out))
"""


def test_a_closed_protector_and_its_buffers_are_freed_without_the_cycle_collector(tmp_path):
    r = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, timeout=300,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    assert out == {"False": [True, True], "True": [True, True]}, out
