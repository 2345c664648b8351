"""Host memory per rank of the protector on CUDA (pinned buffers) against ``2 x snapshot + 2k x shard``.

Item ``memory.host``: a ~100M-parameter torch-engine model (bf16 weights, fp32 optimizer state); the
protector (k=0, :mod:`phoenix_hpc.gpucheck.protect`) is created and runs 2 protected steps (both ping-pong
buffers written), then 2 unprotected ones as the control. Numbers: the design's expected bytes
(:func:`phoenix_hpc.bench.stats.expected_host_bytes` of the state's bytes: optimizer shard + params), the
runtime's plan (which adds a header and an index per buffer), the bytes of its buffers resident
in RAM (mincore(2)), the RSS growth over create + protected steps and over the control steps. Passes when
the plan matches the formula (up to the per-buffer header and index, at most 1 % + 1 MiB) and every
planned byte is resident; the RSS ratio is reported (1.508 when the buffers came from torch's caching host
allocator, which rounds each up to a power of two; exactly sized since, :mod:`phoenix_hpc.runtime.pinned`).
"""

from __future__ import annotations

from pathlib import Path

from phoenix_hpc.gpucheck import common, protect
from phoenix_hpc.gpucheck.report import item

NAME = "memory"
TIMEOUT_S = 60
ITEMS = ("memory.host",)
MODEL = {"layers": 8, "hidden_size": 1024, "heads": 16, "vocab_size": 256, "seq_length": 512, "dtype": "bfloat16"}
TRAINING = {"steps": 100, "micro_batch_size": 4, "global_batch_size": 4, "lr": 1e-4, "warmup_steps": 2, "seed": 3}


def config(work: Path):
    """The job config (CPU only)."""
    return common.job_config("torch", common.dataset(work), MODEL, TRAINING)


def plan(work: Path) -> dict:
    """Dry run: the config (no CUDA call)."""
    return {"model": config(work).model.model_dump()}


def verdict(expected: int, planned: int, resident: int) -> str:
    """Empty when the plan is within 1 % + 1 MiB above ``expected`` (never below) and ``resident`` covers
    the plan; else what is wrong (pure)."""
    if planned < expected or planned > expected * 1.01 + (1 << 20):
        return f"runtime plans {planned} bytes, the formula gives {expected}"
    if resident < planned:
        return f"only {resident} of the {planned} planned bytes are resident in RAM"
    return ""


def run(work: Path) -> list[dict]:
    import gc

    import torch.distributed as dist
    from mpi4py import MPI

    from phoenix_hpc.bench.overhead_rank import buffer_tensors, resident_bytes, rss_bytes
    from phoenix_hpc.bench.stats import expected_host_bytes
    from phoenix_hpc.engines.factory import create_engine
    from phoenix_hpc.launch.groups import Grid, init_generation
    from phoenix_hpc.launch.loop import train

    cfg = config(work)
    dev = common.prepare_cuda()
    groups, coord = init_generation(dist.HashStore(), 0, 0, Grid(1, 1, 1), "nccl", 120.0, device_id=dev)
    engine = create_engine(cfg, coord, groups, dev)
    tokens = cfg.training.global_batch_size * cfg.model.seq_length
    train(engine, 2, tokens)
    opt_bytes = sum(t.numel() * t.element_size() for _, t in engine.optimizer_shard())
    state_bytes = opt_bytes + sum(t.numel() * t.element_size() for _, t in engine.param_shard())
    gc.collect()
    before = rss_bytes()
    prot = protect.make_protector(engine, MPI.COMM_WORLD, dev)
    try:
        train(engine, engine.step + 2, tokens, protector=prot)
        after = rss_bytes()
        resident = resident_bytes(buffer_tensors(prot))
        plan_ = prot.memory_plan
    finally:
        prot.close()
    c0 = rss_bytes()
    train(engine, engine.step + 2, tokens)
    control = rss_bytes() - c0
    expected = expected_host_bytes(state_bytes, opt_bytes, 0)
    nums = {"k": 0, "snapshot_state_bytes": state_bytes, "snapshot_buffer_bytes": plan_.snapshot_bytes, "optimizer_shard_bytes": opt_bytes,
            "expected_bytes": expected, "planned_bytes": plan_.total_bytes, "buffers_resident_bytes": resident,
            "rss_growth_on_bytes": after - before, "rss_growth_off_bytes": control,
            "rss_growth_over_expected": round((after - before) / expected, 3)}
    why = verdict(expected, plan_.total_bytes, resident)
    return [item(ITEMS[0], "failed" if why else "passed", why, nums, protect.NO_PEER)]
