"""Torch engine on CUDA: determinism and save/restore on one GPU (bf16 weights, fp32 ZeRO-1 AdamW state).

Items (one rank, world size 1 over NCCL, groups built by the launcher's own ``init_generation``):

- ``torch.determinism``: two fresh engines trained ``STEPS`` steps give the same state hash and losses;
- ``torch.restore``: the host snapshot of step ``SAVE_AT`` loaded into a fresh engine continues to the same
  losses and final hash (the CUDA RNG state travels in the envelope).
"""

from __future__ import annotations

import gc
from pathlib import Path

from phoenix_hpc.gpucheck import common
from phoenix_hpc.gpucheck.report import equal_item

NAME = "torch_engine"
TIMEOUT_S = 75
ITEMS = ("torch.determinism", "torch.restore")
STEPS, SAVE_AT = 12, 6
MODEL = {"layers": 2, "hidden_size": 128, "heads": 4, "vocab_size": 256, "seq_length": 128, "dtype": "bfloat16"}
TRAINING = {"steps": STEPS, "micro_batch_size": 4, "global_batch_size": 8, "lr": 3e-3, "warmup_steps": 2, "seed": 3}


def config(work: Path):
    """The job config (CPU only)."""
    return common.job_config("torch", common.dataset(work), MODEL, TRAINING)


def plan(work: Path) -> dict:
    """Dry run: the config (no CUDA call)."""
    return {"model": config(work).model.model_dump()}


def run(work: Path) -> list[dict]:
    import torch.distributed as dist

    from phoenix_hpc.engines.factory import create_engine
    from phoenix_hpc.launch.groups import Grid, init_generation
    from phoenix_hpc.launch.loop import train

    cfg = config(work)
    dev = common.prepare_cuda()
    groups, coord = init_generation(dist.HashStore(), 0, 0, Grid(1, 1, 1), "nccl", 120.0, device_id=dev)
    tokens = cfg.training.global_batch_size * cfg.model.seq_length

    def new():
        return create_engine(cfg, coord, groups, dev)

    a = new()
    ra = train(a, SAVE_AT, tokens)
    snap = common.host_snapshot(a)
    ra += train(a, STEPS, tokens)
    hash_a, loss_a = a.state_hash(), common.losses(ra)
    del a
    b = new()
    rb = train(b, STEPS, tokens)
    items = [equal_item("torch.determinism", (b.state_hash(), common.losses(rb)), (hash_a, loss_a),
                        "second run (hash, losses) vs first",
                        {"hash": hash_a[:16], **common.step_numbers(ra), "steps": STEPS}, common.ONE_RANK)]
    del b
    gc.collect()
    c = new()
    common.load_snapshot(c, snap)
    rc = train(c, STEPS, tokens)
    items.append(equal_item("torch.restore", (c.state_hash(), common.losses(rc)), (hash_a, loss_a[SAVE_AT:]),
                            f"restored at step {SAVE_AT} and continued (hash, losses) vs uninterrupted",
                            {"save_at": SAVE_AT, "steps": STEPS, "hash": hash_a[:16]}, common.ONE_RANK))
    return items
