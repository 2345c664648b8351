"""The engine conformance kit against the Megatron engine on CUDA: the rules users run against their own
engines (:mod:`phoenix_hpc.testing`, docs/engines.md), which need a GPU for this engine.

Item ``kit.megatron``: :func:`phoenix_hpc.testing.run_conformance` of the ``megatron`` check's job config
(bf16 Llama-style model, :func:`phoenix_hpc.gpucheck.check_megatron.config`) with ``device="cuda"``: one rank
over NCCL in a worker process of its own; every rule passes (``rebind`` is skipped: the engine recovers by
rebuilding).
"""

from __future__ import annotations

import time
from pathlib import Path

from phoenix_hpc.gpucheck import check_megatron, common
from phoenix_hpc.gpucheck.report import item

NAME = "kit"
TIMEOUT_S = 100
ITEMS = ("kit.megatron",)
KIT_TIMEOUT_S = 90  # the worker's wall-clock limit, inside this check's


def plan(work: Path) -> dict:
    """Dry run: the job config the kit gets (CPU only)."""
    from phoenix_hpc.testing import RULES

    cfg = check_megatron.config(work)
    return {"engine": cfg.engine, "rules": list(RULES), "device": "cuda"}


def run(work: Path) -> list[dict]:
    from phoenix_hpc.testing import run_conformance

    t0 = time.perf_counter()
    rep = run_conformance(check_megatron.config(work).model_dump(mode="json"), world_size=1, steps=2,
                          timeout_s=KIT_TIMEOUT_S, device="cuda")
    numbers = {"skipped": rep.skipped, "seconds": round(time.perf_counter() - t0, 1)}
    if rep.ok and rep.skipped == ["rebind"]:
        return [item("kit.megatron", "passed", numbers=numbers, limit=common.ONE_RANK)]
    return [item("kit.megatron", "failed", f"{rep.summary()}\n{rep.logs[-1500:]}", numbers, common.ONE_RANK)]
