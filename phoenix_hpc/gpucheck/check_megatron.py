"""Megatron engine on one GPU: bf16 small Llama-style model; determinism, save/restore, rebuild, Adam step.

Items (all on one rank, tp=pp=dp=1, world size 1 over NCCL):

- ``megatron.shards``: optimizer-shard names and dtypes, and every fp32 main param equal to its bf16 param;
- ``megatron.determinism``: two fresh engines trained ``STEPS`` steps give the same state hash
  (:meth:`~phoenix_hpc.engines.base.Engine.state_hash`) and the same losses;
- ``megatron.restore``: the host snapshot (shard + envelope) of step ``SAVE_AT`` loaded into a fresh engine
  continues to the same losses and final hash;
- ``megatron.rebuild``: the rebuild recovery path (docs/design.md section 6): ``teardown()`` at step
  ``SAVE_AT`` (parallel_state destroyed), a new engine constructed and loaded from the host snapshot,
  continues bitwise; skipped while the engine does not override ``Engine.teardown``;
- ``megatron.adam_step``: the Adam step counter of the optimizer megatron-core picks equals the engine step
  after a restore and after the continuation.

The model uses the Llama options of ``model`` that the config schema offers (:func:`llama_options`); the
items name which were found.
"""

from __future__ import annotations

import gc
import time
import typing
from pathlib import Path

from phoenix_hpc.gpucheck import common
from phoenix_hpc.gpucheck.report import equal_item, item

NAME = "megatron"
TIMEOUT_S = 120
ITEMS = ("megatron.shards", "megatron.determinism", "megatron.restore", "megatron.rebuild", "megatron.adam_step")
STEPS, SAVE_AT = 12, 6
MODEL = {"layers": 2, "hidden_size": 128, "heads": 4, "vocab_size": 256, "seq_length": 128, "dtype": "bfloat16"}
TRAINING = {"steps": STEPS, "micro_batch_size": 4, "global_batch_size": 8, "lr": 3e-3, "warmup_steps": 2, "seed": 3}

#: Values that mark a Llama-style choice in a model-config field (RMSNorm, SwiGLU, rotary positions).
LLAMA_WORDS = ("llama", "rmsnorm", "swiglu", "rope", "rotary")


def llama_options(fields: dict[str, tuple[str, tuple]]) -> dict[str, object]:
    """Field values that make the model Llama-style, from a description of the model config's fields:
    ``{field: ("bool", ()) | ("literal", allowed values) | ("other", ())}``. A bool field whose name holds
    one of :data:`LLAMA_WORDS` is set True; a literal field takes its first allowed value holding one."""
    out: dict[str, object] = {}
    for name, (kind, allowed) in fields.items():
        if kind == "bool" and any(w in name.lower() for w in LLAMA_WORDS):
            out[name] = True
        elif kind == "literal":
            hit = [v for v in allowed if isinstance(v, str) and any(w in v.lower() for w in LLAMA_WORDS)]
            if hit:
                out[name] = hit[0]
    return out


def describe_fields(model_cls) -> dict[str, tuple[str, tuple]]:
    """:func:`llama_options`' input from a pydantic model class."""
    out: dict[str, tuple[str, tuple]] = {}
    for name, f in model_cls.model_fields.items():
        ann = f.annotation
        if ann is bool:
            out[name] = ("bool", ())
        elif typing.get_origin(ann) is typing.Literal:
            out[name] = ("literal", typing.get_args(ann))
        else:
            out[name] = ("other", ())
    return out


def config(work: Path):
    """The job config of every item (CPU only; the dry run builds it). Returns ``(cfg, style)``: the Llama
    options used, or why the model is GPT-style (none offered, or the config refused them)."""
    from phoenix_hpc.config.schema import ModelConfig

    data = common.dataset(work)
    opts = llama_options(describe_fields(ModelConfig))
    if not opts:
        return common.job_config("megatron", data, MODEL, TRAINING), "GPT-style (the model config offers no Llama options)"
    try:
        return common.job_config("megatron", data, {**MODEL, **opts}, TRAINING), f"Llama options {opts}"
    except Exception as e:  # noqa: BLE001 -- reported in every item's numbers
        return (common.job_config("megatron", data, MODEL, TRAINING),
                f"GPT-style (the config refused the Llama options {opts}: {str(e).splitlines()[-1]})")


def plan(work: Path) -> dict:
    """Dry run: build the config and import megatron-core (no CUDA call)."""
    cfg, style = config(work)
    import warnings

    from phoenix_hpc.engines import megatron_engine

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Apex / Transformer Engine absent: megatron-core falls back
        megatron_engine._quiet_import()
    return {"model": cfg.model.model_dump(), "style": style}


def has_teardown(engine_cls) -> bool:
    """Whether ``engine_cls`` overrides :meth:`Engine.teardown` (the default only releases groups)."""
    from phoenix_hpc.engines.base import Engine

    return getattr(engine_cls, "teardown", Engine.teardown) is not Engine.teardown


def megatron_optimizers(engine) -> list:
    """The megatron-core optimizer(s) of the engine (``DistributedOptimizer`` s; one per chained part)."""
    opts = getattr(engine, "dist_opts", None)
    if opts is None:
        opts = getattr(engine.optimizer, "chained_optimizers", [engine.optimizer])
    return list(opts)


def adam_steps(engine) -> list[int]:
    """The ``step`` of every parameter's Adam state in the engine's optimizer(s) (distinct values)."""
    seen = set()
    for o in megatron_optimizers(engine):
        for st in o.optimizer.state.values():
            if "step" in st:
                seen.add(int(st["step"]))
    return sorted(seen)


def run(work: Path) -> list[dict]:
    import torch

    from phoenix_hpc.engines.base import GridCoord, ProcessGroups
    from phoenix_hpc.engines.factory import create_engine
    from phoenix_hpc.engines.megatron_engine import MegatronEngine

    cfg, style = config(work)
    world = common.init_nccl_world()
    dev = torch.device("cuda", 0)
    owns = bool(getattr(MegatronEngine, "owns_groups", False))
    groups = ProcessGroups(world, None, None, None, 0) if owns else ProcessGroups(world, world, world, world, 0)
    tokens = cfg.training.global_batch_size * cfg.model.seq_length
    limit = common.ONE_RANK
    teardown = has_teardown(MegatronEngine)

    def new():
        return create_engine(cfg, GridCoord(0, 0, 0), groups, dev)

    def finish(e) -> None:
        if teardown:
            e.teardown()
        del e
        gc.collect()
        torch.cuda.empty_cache()

    from phoenix_hpc.launch.loop import train

    items = []
    a = new()
    opt, par = dict(a.optimizer_shard()), dict(a.param_shard())
    bad = [n for n, t in opt.items() if not n.startswith("opt/pp0/tp0/dp0/") or t.dtype != torch.float32]
    bad += [n for n, p in par.items() if p.dtype != torch.bfloat16
            or not torch.equal(opt.get(f"opt/pp0/tp0/dp0/{n.split('/', 3)[3]}/main", torch.empty(0, device=p.device)), p.reshape(-1).float())]
    optim = sorted({f"{type(o.optimizer).__module__}.{type(o.optimizer).__qualname__}" for o in megatron_optimizers(a)})
    items.append(item("megatron.shards", "failed" if bad or not opt else "passed",
                      f"names/dtypes/main params wrong for {bad[:3]}" if bad else ("" if opt else "empty optimizer shard"),
                      {"optimizer_tensors": len(opt), "param_tensors": len(par), "optimizer": optim,
                       "model": style}, limit))
    ra = train(a, SAVE_AT, tokens)
    snap = common.host_snapshot(a)
    ra += train(a, STEPS, tokens)
    hash_a, loss_a = a.state_hash(), common.losses(ra)
    finish(a)
    b = new()
    rb = train(b, STEPS, tokens)
    items.append(equal_item("megatron.determinism", (b.state_hash(), common.losses(rb)), (hash_a, loss_a),
                            "second run (hash, losses) vs first",
                            {"hash": hash_a[:16], **common.step_numbers(ra), "steps": STEPS, "model": style}, limit))
    finish(b)

    c = new()
    common.load_snapshot(c, snap)
    adam_at_load = adam_steps(c)
    rc = train(c, STEPS, tokens)
    items.append(equal_item("megatron.restore", (c.state_hash(), common.losses(rc)), (hash_a, loss_a[SAVE_AT:]),
                            f"restored at step {SAVE_AT} and continued (hash, losses) vs uninterrupted",
                            {"save_at": SAVE_AT, "steps": STEPS, "hash": hash_a[:16]}, limit))
    items.append(equal_item("megatron.adam_step", (adam_at_load, adam_steps(c)), ([SAVE_AT], [STEPS]),
                            "Adam step counters (after load, after continuing)",
                            {"after_load": adam_at_load, "after_continue": adam_steps(c), "optimizer": optim}, limit))
    finish(c)

    if not teardown:
        items.append(item("megatron.rebuild", "skipped",
                          "engine has no teardown yet: MegatronEngine does not override Engine.teardown, so "
                          "parallel_state cannot be destroyed and rebuilt at a step", limit=limit))
        return items
    from megatron.core import parallel_state

    d = new()
    train(d, SAVE_AT, tokens)
    host = common.host_snapshot(d)
    t0 = time.perf_counter()
    d.teardown()
    t_down = time.perf_counter() - t0
    still = parallel_state.model_parallel_is_initialized()
    del d
    gc.collect()
    torch.cuda.empty_cache()
    if still:
        items.append(item("megatron.rebuild", "failed", "teardown() left parallel_state initialised", limit=limit))
        return items
    t0 = time.perf_counter()
    e = new()
    common.load_snapshot(e, host)
    t_up = time.perf_counter() - t0
    re_ = train(e, STEPS, tokens)
    items.append(equal_item("megatron.rebuild", (e.state_hash(), common.losses(re_)), (hash_a, loss_a[SAVE_AT:]),
                            f"torn down and rebuilt at step {SAVE_AT}, continued (hash, losses) vs uninterrupted",
                            {"teardown_ms": round(t_down * 1e3, 1), "rebuild_and_load_ms": round(t_up * 1e3, 1),
                             "save_at": SAVE_AT}, limit))
    finish(e)
    return items

