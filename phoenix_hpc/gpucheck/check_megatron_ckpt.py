"""GPU check ``megatron_ckpt``: Megatron-LM checkpoints out of and back into the Megatron engine
(:mod:`phoenix_hpc.engines.megatron_ckpt`), on the Llama-shaped config of check ``megatron``.

- ``megatron_ckpt.round_trip``: engine A trains ``SAVE_AT`` steps, writes its state in Megatron-LM's
  torch_dist layout (``save_engine``: model and DistributedOptimizer sharded state dicts, iteration, scheduler,
  RNG; ``latest_checkpointed_iteration.txt``) and trains on to ``STEPS``; engine B, built fresh, loads the
  directory (``load_engine``) and trains to ``STEPS``: its start step, state hash and losses equal A's
  (bitwise: the hash covers every parameter, fp32 main parameter and Adam moment).
- ``megatron_ckpt.from_snapshot``: the final checkpoint of a planned end (:mod:`phoenix_hpc.launch.final_megatron`):
  A's state at ``SAVE_AT`` as a host snapshot (the shards and envelope the protector copies), written by a
  freshly built engine C (``save_snapshot``) into a second directory; engine D, built fresh, loads it and
  trains to ``STEPS``: its start step, state hash and losses equal A's.
- ``megatron_ckpt.mcore_load``: the directory loads with megatron-core's ``dist_checkpointing.load`` into a
  freshly built bare ``GPTModel`` (no DDP, no optimizer, as a Megatron-LM inference or conversion script
  loads it); its weights equal A's at ``SAVE_AT``.

What only runs here: megatron-core's DistributedOptimizer (CUDA) and its sharded state dict, the torch_dist
writer (it synchronises CUDA), and the whole round trip. The layout, the submit-time check and the model's
save and load run on CPU in tests/unit/test_megatron_ckpt.py.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from phoenix_hpc.gpucheck import common
from phoenix_hpc.gpucheck.report import equal_item, item

NAME = "megatron_ckpt"
TIMEOUT_S = 120
ITEMS = ("megatron_ckpt.round_trip", "megatron_ckpt.mcore_load", "megatron_ckpt.from_snapshot")
STEPS, SAVE_AT = 8, 4


def config(work: Path):
    """The job config: check ``megatron``'s (Llama shape, bf16), ``STEPS`` steps."""
    from phoenix_hpc.gpucheck import check_megatron

    cfg = check_megatron.config(work)
    return cfg.model_copy(update={"training": cfg.training.model_copy(update={"steps": STEPS})})


def plan(work: Path) -> dict:
    """Dry run: the config, the import of megatron-core's dist_checkpointing and of the module under test,
    the shapes the submit check expects for this model (no CUDA call)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core import dist_checkpointing  # noqa: F401

        from phoenix_hpc.engines import megatron_ckpt  # noqa: F401
        from phoenix_hpc.engines.megatron_layout import expected_shapes
    cfg = config(work)
    return {"model": cfg.model.model_dump(), "steps": STEPS, "save_at": SAVE_AT,
            "shapes": {k: v for k, v in expected_shapes(cfg.model).items() if v is not None}}


def run(work: Path) -> list[dict]:
    import torch
    from megatron.core import dist_checkpointing

    from phoenix_hpc.engines import megatron_ckpt as mck
    from phoenix_hpc.engines.base import GridCoord, ProcessGroups
    from phoenix_hpc.engines.factory import create_engine
    from phoenix_hpc.engines.megatron_engine import build_gpt_model, cast_to_params_dtype
    from phoenix_hpc.engines.megatron_layout import TRACKER, iter_dir
    from phoenix_hpc.launch.loop import train

    cfg = config(work)
    world = common.init_nccl_world()
    dev = torch.device("cuda", 0)
    groups = ProcessGroups(world, None, None, None, 0)
    tokens = cfg.training.global_batch_size * cfg.model.seq_length
    limit = common.ONE_RANK
    root = Path(work) / "megatron-ckpt"
    shutil.rmtree(root, ignore_errors=True)

    a = create_engine(cfg, GridCoord(0, 0, 0), groups, dev)
    train(a, SAVE_AT, tokens)
    t0 = time.perf_counter()
    mck.save_engine(a, root)
    save_s = time.perf_counter() - t0
    at_save = {n: t.detach().clone() for n, t in a.model.module.state_dict().items() if torch.is_tensor(t)}
    snapshot = ({n: t.detach().cpu().clone() for n, t in a.optimizer_shard()},
                {n: t.detach().cpu().clone() for n, t in a.param_shard()}, a.envelope())
    ra = train(a, STEPS, tokens)
    hash_a, loss_a = a.state_hash(), common.losses(ra)
    a.teardown()

    tracker = (root / TRACKER).read_text() if (root / TRACKER).is_file() else None
    b = create_engine(cfg, GridCoord(0, 0, 0), groups, dev)
    t0 = time.perf_counter()
    start = mck.load_engine(b, root)
    load_s = time.perf_counter() - t0
    rb = train(b, STEPS, tokens)
    d = iter_dir(root, SAVE_AT)
    numbers = {"save_at": SAVE_AT, "steps": STEPS, "tracker": tracker, "save_s": round(save_s, 3),
               "load_s": round(load_s, 3), "hash": hash_a[:16],
               "files": sorted(p.name for p in d.iterdir()) if d.is_dir() else []}
    items = [equal_item("megatron_ckpt.round_trip", (tracker, start, b.state_hash(), common.losses(rb)),
                        (str(SAVE_AT), SAVE_AT, hash_a, loss_a[SAVE_AT:]),
                        f"saved in Megatron-LM's layout at step {SAVE_AT}, loaded into a fresh engine, continued "
                        "(tracker, start step, hash, losses) vs uninterrupted", numbers, limit)]

    # a bare GPTModel, as a script of Megatron-LM's would build it, while b's parallel state is still up
    _, gpt = build_gpt_model(cfg, True, True)
    gpt = gpt.to(dev)
    cast_to_params_dtype(gpt, b.dtype)
    loaded = dist_checkpointing.load({"model": gpt.sharded_state_dict()}, str(d))
    gpt.load_state_dict(loaded["model"])
    got = {n: t for n, t in gpt.state_dict().items() if torch.is_tensor(t)}
    differ = sorted(n for n in at_save if n not in got or not torch.equal(got[n], at_save[n]))
    missing = sorted(set(got) - set(at_save))
    b.teardown()
    if differ or missing:
        items.append(item("megatron_ckpt.mcore_load", "failed",
                          f"weights differ from the saved engine's: {differ[:3]}; unexpected: {missing[:3]}",
                          {"tensors": len(at_save)}, limit))
    else:
        items.append(item("megatron_ckpt.mcore_load", "passed", numbers={"tensors": len(at_save)}, limit=limit))

    # the planned end's export: a fresh engine takes the host snapshot of SAVE_AT and writes it
    root2 = Path(work) / "megatron-ckpt-final"
    shutil.rmtree(root2, ignore_errors=True)
    c = create_engine(cfg, GridCoord(0, 0, 0), groups, dev)
    t0 = time.perf_counter()
    mck.save_snapshot(c, *snapshot, root2)
    export_s = time.perf_counter() - t0
    c.teardown()
    tracker2 = (root2 / TRACKER).read_text() if (root2 / TRACKER).is_file() else None
    d_ = create_engine(cfg, GridCoord(0, 0, 0), groups, dev)
    start2 = mck.load_engine(d_, root2)
    rd = train(d_, STEPS, tokens)
    items.append(equal_item("megatron_ckpt.from_snapshot", (tracker2, start2, d_.state_hash(), common.losses(rd)),
                            (str(SAVE_AT), SAVE_AT, hash_a, loss_a[SAVE_AT:]),
                            f"host snapshot of step {SAVE_AT} written in Megatron-LM's layout by a fresh engine, "
                            "loaded into another, continued (tracker, start step, hash, losses) vs uninterrupted",
                            {"export_s": round(export_s, 3)}, limit))
    d_.teardown()
    return items
