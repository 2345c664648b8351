"""Megatron engine on one GPU: bf16 small Llama-style model; determinism, save/restore, rebuild, Adam step.

Items (all on one rank, tp=pp=dp=1, world size 1 over NCCL; the engine owns its groups, so it gets the
default group only):

- ``megatron.shards``: optimizer-shard names and dtypes, every fp32 main param equal to its bf16 param, and
  the Llama shape (no biases, no learned position embeddings);
- ``megatron.learns``: the first step's loss is within ``FIRST_LOSS_TOL`` nats of ln(vocab) (an untrained
  model predicts about uniformly, so a loss logged divided by the number of micro-batches fails it:
  :func:`first_loss_problem`), and the loss falls by more than ``LEARN_DROP`` nats over ``STEPS`` steps;
- ``megatron.determinism``: two fresh engines trained ``STEPS`` steps give the same state hash
  (:meth:`~phoenix_hpc.engines.base.Engine.state_hash`) and the same losses;
- ``megatron.restore``: the host snapshot (shard + envelope) of step ``SAVE_AT`` loaded into a fresh engine
  continues to the same losses and final hash;
- ``megatron.rebuild``: the rebuild recovery path (docs/design.md section 6) as a member runs it, in one
  process (:func:`recovery_rebuild`): a generation built by ``init_generation`` trains to ``SAVE_AT`` protected
  (the snapshot in the protector's page-locked buffers), then the generation abort
  (:class:`~phoenix_hpc.launch.abort.GenerationAbort`), the groups released (``destroy_process_group``,
  ``Engine.release_groups``), ``teardown()``, a new default group created with ``device_id``, a new engine
  (its constructor runs ``initialize_model_parallel``), the state loaded from the protected snapshot, and
  training continues bitwise;
- ``megatron.adam_step``: Adam's step counter of the optimizer megatron-core picks
  (:func:`phoenix_hpc.engines.adam_step.read_adam_step`, either location) equals the engine step after a
  restore and after the continuation;
- ``megatron.provider``: the engine with ``model.provider`` (examples/megatron-provider's Llama provider,
  megatron-core's own layer specs, with its ``qk_layernorm`` option) builds the provider's model (query/key
  norms present, no biases, no learned position embeddings), learns, and rebuilt from the host snapshot of
  step ``SAVE_AT`` continues bitwise;
- ``megatron.evaluate``: on a blend of the check's dataset with a validation part (:func:`blend_config`),
  two evaluations (:meth:`~phoenix_hpc.engines.base.Engine.evaluate`, megatron-core's schedule with
  ``forward_only=True``) of the same parameters give the same loss and leave the state hash and the CUDA RNG
  state as they were, and training with an evaluation every ``EVAL_EVERY`` steps ends in the state of training
  without (:func:`evaluate_item`);
- ``megatron.provider_refused``: a provider that returns a plain ``torch.nn.Module`` stops the engine's
  construction with a ConfigError naming ``model.provider`` (exit 2 on a rank), leaving no parallel state;
- ``megatron.dropout``: with ``attention_dropout = hidden_dropout = DROPOUT_P`` (:func:`dropout_config`), the
  losses differ from the run without dropout (the masks are drawn), and two recoveries end bitwise in the
  uninterrupted run's state hash and losses: the host snapshot of step ``SAVE_AT`` loaded into a fresh engine
  whose CUDA random states are then scrambled (as a spare's would be: the masks must come from the per-step
  reseed, :mod:`phoenix_hpc.engines.megatron_rng`, not from the snapshot's RNG states), and the rebuild path
  from the protected snapshot (:func:`recovery_rebuild`) (:func:`dropout_item`).

The engine conformance kit runs against this engine in check ``kit`` (:mod:`.check_kit`).
"""

from __future__ import annotations

import math
import time
from typing import Any
from pathlib import Path

from phoenix_hpc.gpucheck import common
from phoenix_hpc.gpucheck.report import equal_item, item

NAME = "megatron"
TIMEOUT_S = 180
ITEMS = ("megatron.shards", "megatron.learns", "megatron.determinism", "megatron.restore", "megatron.rebuild",
         "megatron.adam_step", "megatron.evaluate", "megatron.provider", "megatron.provider_refused",
         "megatron.dropout")
STEPS, SAVE_AT, LEARN_DROP = 12, 6, 0.3
FIRST_LOSS_TOL = 1.0  # nats around ln(vocab) for the first step's loss (ln 256 = 5.55; halved: 2.77)
MODEL = {"layers": 2, "hidden_size": 128, "heads": 4, "vocab_size": 256, "seq_length": 128, "dtype": "bfloat16"}
#: Llama-style options of ``model`` (RoPE, SwiGLU, RMSNorm, no biases, grouped-query attention).
LLAMA = {"position_embedding_type": "rope", "activation": "swiglu", "normalization": "RMSNorm",
         "add_bias_linear": False, "num_query_groups": 2, "ffn_hidden_size": 352}
TRAINING = {"steps": STEPS, "micro_batch_size": 4, "global_batch_size": 8, "lr": 3e-3, "warmup_steps": 2, "seed": 3}

#: examples/megatron-provider: the Llama provider and its options (qk_layernorm: a setting of its own).
PROVIDER_DIR = Path(__file__).resolve().parents[2] / "examples" / "megatron-provider"
PROVIDER = "llama_provider.provider:llama_stage"
PROVIDER_OPTIONS = {"num_query_groups": 2, "qk_layernorm": True, "transformer_impl": "local"}


def config(work: Path):
    """The job config of every item but the provider's (CPU only; the dry run builds it)."""
    return common.job_config("megatron", common.dataset(work), {**MODEL, **LLAMA}, TRAINING)


EVAL_EVERY, EVAL_ITERS, EVAL_STEPS = 2, 2, 4


def blend_config(work: Path):
    """:func:`config` reading the check's dataset as a one-dataset blend with a validation part (split 90,10,0),
    evaluating every ``EVAL_EVERY`` steps (``megatron.evaluate``)."""
    from phoenix_hpc.config.schema import JobConfig

    base = config(work).model_dump(mode="json", exclude_unset=True)
    return JobConfig.model_validate({**base, "data": {"blend": [{"path": common.dataset(work)}], "split": "90,10,0"},
                                     "training": {**TRAINING, "steps": EVAL_STEPS, "eval_interval": EVAL_EVERY,
                                                  "eval_iters": EVAL_ITERS}})


DROPOUT_P = 0.1


def dropout_config(work: Path):
    """:func:`config` with ``attention_dropout = hidden_dropout = DROPOUT_P`` (``megatron.dropout``)."""
    return common.job_config("megatron", common.dataset(work),
                             {**MODEL, **LLAMA, "attention_dropout": DROPOUT_P, "hidden_dropout": DROPOUT_P}, TRAINING)


def provider_config(work: Path, provider: str = PROVIDER):
    """The job config of ``megatron.provider``: ``MODEL``'s shape, the model from ``provider``."""
    return common.job_config("megatron", common.dataset(work),
                             {**MODEL, "ffn_hidden_size": LLAMA["ffn_hidden_size"], "provider": provider,
                              "options": PROVIDER_OPTIONS}, TRAINING, python_path=[str(PROVIDER_DIR)])


def plain_torch_provider(*, pre_process, post_process, config, vocab_size, max_sequence_length, options):
    """A provider that breaks the contract: a plain ``torch.nn.Module``, not a megatron-core module."""
    import torch

    return torch.nn.Linear(4, 4)


def plan(work: Path) -> dict:
    """Dry run: build the configs, import megatron-core and the example provider as submit does (no CUDA
    call)."""
    cfg = config(work)
    import warnings

    from phoenix_hpc.engines import megatron_engine
    from phoenix_hpc.engines.factory import check_user_code

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Apex / Transformer Engine absent: megatron-core falls back
        megatron_engine.import_megatron_core()
    blend_config(work)
    dropout_config(work)
    pcfg = provider_config(work)
    check_user_code(pcfg)
    check_user_code(provider_config(work, f"{__name__}:plain_torch_provider"))
    return {"model": cfg.model.model_dump(), "provider": pcfg.model.provider}


def first_loss_problem(loss_first: float | None, vocab_size: int, tol: float = FIRST_LOSS_TOL) -> str:
    """Empty when the first step's loss is within ``tol`` nats of ln(``vocab_size``), the cross entropy of a
    uniform prediction (an untrained model with small initial weights); else what is wrong (pure)."""
    import math

    want = math.log(vocab_size)
    if loss_first is None or not math.isfinite(loss_first):
        return f"first loss {loss_first!r} is not a finite number"
    if abs(loss_first - want) > tol:
        return (f"first loss {loss_first:.3f} is not within {tol} nats of ln({vocab_size}) = {want:.3f} (a loss "
                "divided by the number of micro-batches, or a wrong loss, would be)")
    return ""


def recovery_rebuild(cfg, dev, tokens: int, save_at: int, steps: int) -> tuple[Any, list, dict]:
    """The rebuild recovery path of one member in one process (see ``megatron.rebuild`` in the module
    docstring), on ``dev`` (CUDA with NCCL; CPU with gloo in the unit test, any engine). Returns ``(the new
    engine, the records of its steps save_at+1 .. steps, numbers)``; the caller tears the engine down.

    Raises:
        what the engine, the protector or torch.distributed raise.
    """
    import gc

    import torch.distributed as dist
    from mpi4py import MPI

    from phoenix_hpc.engines.factory import create_engine
    from phoenix_hpc.gpucheck import protect
    from phoenix_hpc.launch.execute import generation_abort
    from phoenix_hpc.launch.groups import Grid, init_generation
    from phoenix_hpc.launch.loop import train
    from phoenix_hpc.runtime import snapshot as S

    backend = "nccl" if dev.type == "cuda" else "gloo"
    kw = {"device_id": dev} if backend == "nccl" else {}
    owns = cfg.engine == "megatron"  # megatron-core builds its own dp/pp/tp groups (sub_groups=False)
    if dist.is_initialized():
        dist.destroy_process_group()
    groups, coord = init_generation(dist.HashStore(), 0, 0, Grid(1, 1, 1), backend, 300.0, sub_groups=not owns, **kw)
    aborter = generation_abort(backend, 0, {}, groups)
    eng = create_engine(cfg, coord, groups, dev)
    prot = protect.make_protector(eng, MPI.COMM_WORLD, dev)
    try:
        train(eng, save_at, tokens, protector=prot)
        prot.flush(eng)
    finally:
        prot.close()
    nums: dict = {"save_at": save_at}
    t0 = time.perf_counter()
    nums["abort_method"] = aborter.abort("rebuild check").method
    nums["abort_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
    t0 = time.perf_counter()
    if dist.is_initialized():  # the recovery's guard: an NCCL abort may have unregistered the groups already
        dist.destroy_process_group()
    eng.release_groups()
    eng.teardown()
    del eng, groups
    gc.collect()
    nums["release_and_teardown_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
    t0 = time.perf_counter()
    groups, coord = init_generation(dist.HashStore(), 1, 0, Grid(1, 1, 1), backend, 300.0, sub_groups=not owns, **kw)
    nums["new_generation_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
    t0 = time.perf_counter()
    eng = create_engine(cfg, coord, groups, dev)
    nums["new_engine_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
    t0 = time.perf_counter()
    step_buf = prot.buffers.local.find(save_at)
    nums["snapshot_pinned"] = bool(step_buf.is_pinned())
    u = prot.local_snapshot(step=save_at, copy=False)  # verified against the checksums taken at the snapshot
    eng.load_optimizer_shard({n: t for n, t in u.tensors.items() if n.startswith(S.OPT + "/")})
    eng.load_param_shard({n: t for n, t in u.tensors.items() if not n.startswith(S.OPT + "/")})
    eng.load_envelope(u.envelope)
    nums["load_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
    return eng, train(eng, steps, tokens), nums


def adam_step(engine) -> int:
    """Adam's step counter read from the engine's optimizer(s), wherever megatron-core's pick keeps it."""
    from phoenix_hpc.engines.adam_step import read_adam_step

    return read_adam_step([o.optimizer for o in engine.dist_opts])


def optimizer_names(engine) -> list[str]:
    """Class names of the torch optimizers inside the engine's megatron-core optimizer(s)."""
    return sorted({f"{type(o.optimizer).__module__}.{type(o.optimizer).__qualname__}" for o in engine.dist_opts})


def run(work: Path) -> list[dict]:
    import torch

    from phoenix_hpc.engines.base import GridCoord, ProcessGroups
    from phoenix_hpc.engines.factory import create_engine

    cfg = config(work)
    world = common.init_nccl_world()
    dev = torch.device("cuda", 0)
    groups = ProcessGroups(world, None, None, None, 0)  # owns_groups: megatron-core makes dp/pp/tp itself
    tokens = cfg.training.global_batch_size * cfg.model.seq_length
    limit = common.ONE_RANK

    def new():
        return create_engine(cfg, GridCoord(0, 0, 0), groups, dev)

    def finish(e) -> None:  # the next engine needs a fresh parallel state
        e.teardown()

    from phoenix_hpc.launch.loop import train

    items = []
    a = new()
    opt, par = dict(a.optimizer_shard()), dict(a.param_shard())
    bad = [n for n, t in opt.items() if not n.startswith("opt/pp0/tp0/dp0/") or t.dtype != torch.float32]
    for n, p in par.items():
        main = opt.get(f"opt/pp0/tp0/dp0/{n.split('/', 3)[3]}/main")
        if p.dtype != torch.bfloat16 or main is None or not torch.equal(main, p.reshape(-1).float()):
            bad.append(n)
    bad += [n for n in par if n.endswith(".bias") or "position_embeddings" in n]  # not the Llama shape
    optim = optimizer_names(a)
    items.append(item("megatron.shards", "failed" if bad or not opt else "passed",
                      f"names/dtypes/main params/Llama shape wrong for {bad[:3]}" if bad
                      else ("" if opt else "empty optimizer shard"),
                      {"optimizer_tensors": len(opt), "param_tensors": len(par), "optimizer": optim,
                       "params_cast_to_dtype": len(getattr(a, "params_cast", [])),
                       "model": {**MODEL, **LLAMA}}, limit))
    ra = train(a, SAVE_AT, tokens)
    snap = common.host_snapshot(a)
    ra += train(a, STEPS, tokens)
    hash_a, loss_a = a.state_hash(), common.losses(ra)
    drop = loss_a[0] - loss_a[-1]
    why = first_loss_problem(loss_a[0], cfg.model.vocab_size)
    if not why and drop <= LEARN_DROP:
        why = f"loss fell by {drop:.3f} nats over {STEPS} steps, not > {LEARN_DROP}"
    items.append(item("megatron.learns", "failed" if why else "passed", why,
                      {"loss_first": loss_a[0], "loss_last": loss_a[-1], "steps": STEPS,
                       "ln_vocab": round(math.log(cfg.model.vocab_size), 4), "micro_batches": a.n_micro}, limit))
    finish(a)
    b = new()
    rb = train(b, STEPS, tokens)
    items.append(equal_item("megatron.determinism", (b.state_hash(), common.losses(rb)), (hash_a, loss_a),
                            "second run (hash, losses) vs first",
                            {"hash": hash_a[:16], **common.step_numbers(ra), "steps": STEPS}, limit))
    finish(b)

    c = new()
    common.load_snapshot(c, snap)
    adam_at_load = adam_step(c)
    rc = train(c, STEPS, tokens)
    items.append(equal_item("megatron.restore", (c.state_hash(), common.losses(rc)), (hash_a, loss_a[SAVE_AT:]),
                            f"restored at step {SAVE_AT} and continued (hash, losses) vs uninterrupted",
                            {"save_at": SAVE_AT, "steps": STEPS, "hash": hash_a[:16]}, limit))
    adam_end = adam_step(c)
    items.append(equal_item("megatron.adam_step", (adam_at_load, adam_end), (SAVE_AT, STEPS),
                            "Adam step counter (after load, after continuing)",
                            {"after_load": adam_at_load, "after_continue": adam_end, "optimizer": optim,
                             "location": c.envelope().get("adam_step_location")}, limit))
    finish(c)

    items.append(evaluate_item(work, groups, dev, limit))

    from megatron.core import parallel_state

    e, re_, nums = recovery_rebuild(cfg, dev, tokens, SAVE_AT, STEPS)
    left = parallel_state.model_parallel_is_initialized()
    got = (e.state_hash(), common.losses(re_))
    if not nums["snapshot_pinned"]:
        items.append(item("megatron.rebuild", "failed", "the protected snapshot was not in page-locked memory",
                          nums, limit))
    else:
        items.append(equal_item("megatron.rebuild", got, (hash_a, loss_a[SAVE_AT:]),
                                f"generation aborted, groups released, engine torn down and rebuilt at step {SAVE_AT} "
                                "from the protected snapshot, continued (hash, losses) vs uninterrupted",
                                {**nums, "parallel_state_after_new_engine": left}, limit))
    groups = e.groups
    finish(e)
    items += provider_items(work, groups, dev, tokens)
    return items + [dropout_item(work, groups, dev, tokens, loss_a)]


def scramble_cuda_rng(seed: int = 987654321) -> None:
    """Put torch's default CUDA generator and megatron-core's CUDA RNG tracker in states no run of the check
    uses (a process that did not train the steps before: a spare)."""
    import torch
    from megatron.core import tensor_parallel

    tensor_parallel.model_parallel_cuda_manual_seed(seed)
    torch.rand(1000, device="cuda")  # and move the default generator on from that seed's state


def dropout_item(work: Path, groups, dev, tokens: int, plain_losses: list) -> dict:
    """``megatron.dropout`` (module docstring). ``plain_losses``: the losses of the same training without
    dropout (``megatron.learns``'s run). An exception is the item's failure; it runs last (the rebuild leaves
    a new default group behind)."""
    from phoenix_hpc.engines.base import GridCoord
    from phoenix_hpc.engines.factory import create_engine
    from phoenix_hpc.launch.loop import train

    limit, e = common.ONE_RANK, None
    try:
        cfg = dropout_config(work)
        e = create_engine(cfg, GridCoord(0, 0, 0), groups, dev)
        ra = train(e, SAVE_AT, tokens)
        snap = common.host_snapshot(e)
        ra += train(e, STEPS, tokens)
        want = (e.state_hash(), common.losses(ra))
        e.teardown()
        e = create_engine(cfg, GridCoord(0, 0, 0), groups, dev)
        common.load_snapshot(e, snap)
        scramble_cuda_rng()
        rb = train(e, STEPS, tokens)
        restored = (e.state_hash(), common.losses(rb))
        e.teardown()
        e = None
        r, rr, nums = recovery_rebuild(cfg, dev, tokens, SAVE_AT, STEPS)
        rebuilt = (r.state_hash(), common.losses(rr))
        r.teardown()
    except Exception as exc:  # noqa: BLE001 -- reported as this item's failure
        if e is not None:
            e.teardown()
        return item("megatron.dropout", "failed", f"{type(exc).__name__}: {str(exc)[:300]}", {}, limit)
    tail = (want[0], want[1][SAVE_AT:])
    problems = [why for bad, why in (
        (want[1] == plain_losses, "the losses with dropout equal those without: no mask was drawn"),
        (restored != tail, f"restored at step {SAVE_AT} with scrambled CUDA random states, continued (hash, losses) "
                           f"{restored[0][:16]} {restored[1]} vs uninterrupted {tail[0][:16]} {tail[1]}"),
        (rebuilt != tail, f"rebuilt at step {SAVE_AT} from the protected snapshot, continued (hash, losses) "
                          f"{rebuilt[0][:16]} {rebuilt[1]} vs uninterrupted {tail[0][:16]} {tail[1]}"),
    ) if bad]
    nums = {"dropout": DROPOUT_P, "save_at": SAVE_AT, "steps": STEPS, "hash": want[0][:16], "losses": want[1],
            "losses_without_dropout": plain_losses, "rebuild": nums}
    return item("megatron.dropout", "failed" if problems else "passed", "; ".join(problems), nums, limit)


def evaluate_item(work: Path, groups, dev, limit: str) -> dict:
    """``megatron.evaluate`` (module docstring): two engines on :func:`blend_config` train ``EVAL_STEPS`` steps,
    the second with an evaluation every ``EVAL_EVERY`` steps; then each evaluates its final parameters twice. An
    exception is the item's failure (the other items still run)."""
    import torch

    from phoenix_hpc.data.blend import open_blend
    from phoenix_hpc.engines.base import GridCoord
    from phoenix_hpc.engines.factory import create_engine
    from phoenix_hpc.launch.evaluate import Evaluator
    from phoenix_hpc.launch.loop import train

    e = None
    try:
        cfg = blend_config(work)
        open_blend(cfg)  # as a slot: before a group of more than one rank exists
        tokens = cfg.training.global_batch_size * cfg.model.seq_length
        runs, evals = [], []
        for every in (None, EVAL_EVERY):
            e = create_engine(cfg, GridCoord(0, 0, 0), groups, dev)
            ev = Evaluator(every, EVAL_ITERS, cfg.training.global_batch_size, evals.append) if every else None
            losses = common.losses(train(e, EVAL_STEPS, tokens, evaluator=ev))
            h, rng = e.state_hash(), torch.cuda.get_rng_state(dev)
            a, b = e.evaluate(0, EVAL_ITERS), e.evaluate(0, EVAL_ITERS)
            runs.append((h, losses, a, b, e.state_hash() == h, torch.equal(torch.cuda.get_rng_state(dev), rng)))
            e.teardown()
            e = None
    except Exception as exc:  # noqa: BLE001 -- reported as this item's failure
        if e is not None:
            e.teardown()  # the next items build engines on a fresh parallel state
        return item("megatron.evaluate", "failed", f"{type(exc).__name__}: {str(exc)[:300]}", {}, limit)
    (h0, l0, a0, b0, same0, rng0), (h1, l1, a1, b1, same1, rng1) = runs
    nums = {"hash": h0[:16], "valid_loss": a0, "evaluated_steps": [r.step for r in evals],
            "eval_losses": [r.loss for r in evals]}
    problems = [why for bad, why in (
        (a0 != b0 or a1 != b1, f"two evaluations differ ({a0} vs {b0}; {a1} vs {b1})"),
        (not (same0 and same1), "an evaluation changed the state hash"),
        (not (rng0 and rng1), "an evaluation changed the CUDA RNG state"),
        ((h1, l1) != (h0, l0), "training with evaluations ended in another state (hash, losses) than without"),
        (a0 != a1, "the same parameters evaluated to another loss in the second engine"),
        ([r.step for r in evals] != list(range(EVAL_EVERY, EVAL_STEPS + 1, EVAL_EVERY)), "evaluated at other steps"),
    ) if bad]
    return item("megatron.evaluate", "failed" if problems else "passed", "; ".join(problems), nums, limit)


def provider_items(work: Path, groups, dev, tokens: int) -> list[dict]:
    """``megatron.provider`` and ``megatron.provider_refused`` (see the module docstring)."""
    from megatron.core import parallel_state

    from phoenix_hpc.engines.base import GridCoord
    from phoenix_hpc.engines.factory import create_engine
    from phoenix_hpc.errors import ConfigError
    from phoenix_hpc.launch.loop import train

    limit, cfg = common.ONE_RANK, provider_config(work)
    a = create_engine(cfg, GridCoord(0, 0, 0), groups, dev)
    par = dict(a.param_shard())
    norms = [n for n in par if n.endswith(("q_layernorm.weight", "k_layernorm.weight"))]
    bad = [n for n in par if n.endswith(".bias") or "position_embeddings" in n]
    ra = train(a, SAVE_AT, tokens)
    snap = common.host_snapshot(a)
    ra += train(a, STEPS, tokens)
    hash_a, loss_a = a.state_hash(), common.losses(ra)
    a.teardown()
    b = create_engine(cfg, GridCoord(0, 0, 0), groups, dev)
    common.load_snapshot(b, snap)
    rb = train(b, STEPS, tokens)
    got = (b.state_hash(), common.losses(rb))
    b.teardown()
    drop = loss_a[0] - loss_a[-1]
    detail = {"provider": cfg.model.provider, "options": PROVIDER_OPTIONS, "param_tensors": len(par),
              "qk_norms": len(norms), "loss_first": loss_a[0], "loss_last": loss_a[-1], "save_at": SAVE_AT}
    if not norms or bad or drop <= LEARN_DROP:
        why = ("no q/k layernorm parameters (options.qk_layernorm)" if not norms else
               f"not the Llama shape: {bad[:3]}" if bad else
               f"loss fell by {drop:.3f} nats over {STEPS} steps, not > {LEARN_DROP}")
        items = [item("megatron.provider", "failed", why, detail, limit)]
    else:
        items = [equal_item("megatron.provider", got, (hash_a, loss_a[SAVE_AT:]),
                            f"provider's model rebuilt at step {SAVE_AT}, continued (hash, losses) vs uninterrupted",
                            detail, limit)]
    bad_cfg = provider_config(work, f"{__name__}:plain_torch_provider")
    try:
        e = create_engine(bad_cfg, GridCoord(0, 0, 0), groups, dev)
        e.teardown()
        items.append(item("megatron.provider_refused", "failed", "a provider returning torch.nn.Linear was accepted",
                          limit=limit))
    except ConfigError as exc:
        ok = "model.provider" in str(exc) and "MegatronModule" in str(exc)
        left = parallel_state.model_parallel_is_initialized()
        items.append(item("megatron.provider_refused", "passed" if ok and not left else "failed",
                          "" if ok and not left else
                          ("parallel state left initialised" if left else f"message does not name the field: {exc}"),
                          {"message": str(exc).splitlines()[-1]}, limit))
    return items

