"""The Megatron check's parts that run on CPU: the first-loss rule of megatron.learns, and the rebuild
recovery sequence of megatron.rebuild (run here with the torch engine on gloo: same calls, another engine)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from phoenix_hpc.gpucheck.check_megatron import first_loss_problem


def test_a_first_loss_far_from_ln_vocab_fails_and_one_near_it_passes():
    assert first_loss_problem(math.log(256) + 0.2, 256) == ""
    halved = first_loss_problem(math.log(256) / 2, 256)  # a loss divided by two micro-batches
    assert "not within 1.0 nats of ln(256) = 5.545" in halved
    assert "not a finite number" in first_loss_problem(float("nan"), 256)
    assert "not a finite number" in first_loss_problem(None, 256)


CHILD = r"""
import json, sys
from pathlib import Path
import torch
from phoenix_hpc.gpucheck import common
from phoenix_hpc.gpucheck.check_megatron import recovery_rebuild
from phoenix_hpc.launch.loop import train
from phoenix_hpc.engines.factory import create_engine
from phoenix_hpc.launch.groups import Grid, init_generation
import torch.distributed as dist
work = Path(sys.argv[1])
cfg = common.job_config("torch", common.dataset(work),
                        {"layers": 2, "hidden_size": 32, "heads": 4, "vocab_size": 256, "seq_length": 32},
                        {"steps": 100, "micro_batch_size": 2, "global_batch_size": 4, "seed": 1})
groups, coord = init_generation(dist.HashStore(), 0, 0, Grid(1, 1, 1), "gloo", 60.0)
ref = create_engine(cfg, coord, groups, torch.device("cpu"))
want = ([r.loss for r in train(ref, 8, 128)][4:], ref.state_hash())
eng, recs, nums = recovery_rebuild(cfg, torch.device("cpu"), 128, 4, 8)
print("RESULT " + json.dumps({"want": want, "got": ([r.loss for r in recs], eng.state_hash()), "nums": nums,
                              "gen": eng.groups is not None}))
"""


def test_the_rebuild_sequence_continues_bitwise_from_the_protected_snapshot(tmp_path):
    r = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, timeout=300,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    assert out["got"] == out["want"] and len(out["got"][0]) == 4
    nums = out["nums"]
    assert nums["abort_method"] == "gloo:shutdown" and nums["save_at"] == 4 and out["gen"]
    assert nums["snapshot_pinned"] is False  # CPU: no page-locked memory; the GPU check requires it
