"""Megatron-LM checkpoints (``--ckpt-format torch_dist``) in and out of the Megatron engine, with megatron-core's
``dist_checkpointing``. The layout and its submit-time check: :mod:`phoenix_hpc.engines.megatron_layout`.

What a checkpoint holds, as Megatron-LM's ``generate_state_dict`` builds it (``megatron/training/
checkpointing.py``), with the same keys, so that Megatron-LM's ``--load`` reads what this writes and the
engine reads what Megatron-LM writes:

- ``model``: the GPTModel's ``sharded_state_dict`` (global keys, layers stacked on dimension 0; megatron-core
  re-partitions them over any tp and pp on load);
- ``optimizer``: the DistributedOptimizer's ``sharded_state_dict`` in the ``dp_reshardable`` layout
  (:data:`SHARDING`, Megatron-LM's default: fp32 main params, Adam moments and step; readable at the same tp
  and pp, any dp), recorded in ``content_metadata`` as Megatron-LM records it;
- ``iteration``, ``checkpoint_version`` (3.0), ``args`` (an ``argparse.Namespace`` with Megatron-LM's names of
  the model shape, parallelism and schedule: :func:`megatron_args`), ``opt_param_scheduler`` (Megatron-LM's
  ``OptimizerParamScheduler.state_dict()``, counted in samples as its iteration-based training counts them:
  :func:`phoenix_hpc.engines.megatron_schedule.scheduler_state`), ``rng_state`` (a ``ShardedObject`` of shape ``(pp, tp)``: Python, NumPy, torch
  CPU and CUDA generators and the CUDA RNG tracker's states, as Megatron-LM's ``get_rng_state``).

Loading (:func:`load_engine`) reads ``model``, and ``optimizer`` when the checkpoint has one (its own sharding
type, from its ``content_metadata``), and sets the step to ``iteration`` (0 for a checkpoint without
optimizer state or for ``release``: its weights then start a new run, as Megatron-LM's ``--finetune``);
``rng_state`` is restored when it was written at this job's tp and pp. The learning-rate schedule is the
config's (a pure function of the step, :mod:`phoenix_hpc.engines.schedule`); ``phoenix submit`` refuses a
checkpoint with optimizer state whose ``opt_param_scheduler`` says otherwise
(:func:`phoenix_hpc.engines.megatron_schedule.differences`), as Megatron-LM's own load does.

megatron-core's torch_dist writer calls ``torch.cuda.synchronize()`` and allocates a flag on
``torch.cuda.current_device()`` (``filesystem_async.py``, ``state_dict_saver.py``, megatron-core 0.16), so
saving needs CUDA; building the state dicts of the model, the layout and the loading of the model do not
(tests/unit/test_megatron_ckpt.py runs them on CPU).
"""

from __future__ import annotations

import argparse
import os
import random
from pathlib import Path
from typing import Any

import torch

from phoenix_hpc.engines.megatron_layout import has_optimizer, iter_dir, read_metadata, read_tracker, write_tracker
from phoenix_hpc.engines.megatron_schedule import scheduler_state

CHECKPOINT_VERSION = 3.0
#: the DistributedOptimizer layout written (Megatron-LM's default, ``_build_sharded_state_dict_metadata``)
SHARDING = "dp_reshardable"


def content_metadata() -> dict[str, Any]:
    """The ``metadata`` passed to the ``sharded_state_dict`` calls and saved as the checkpoint's
    ``content_metadata`` (the keys Megatron-LM's ``_build_sharded_state_dict_metadata`` sets, without its
    process group)."""
    return {"distrib_optim_sharding_type": SHARDING, "singleton_local_shards": False,
            "chained_optim_avoid_prefix": True}


def megatron_args(cfg, dp: int) -> argparse.Namespace:
    """The ``args`` of the common state dict: the job config under Megatron-LM's argument names (those its
    ``check_checkpoint_args`` compares and ``load_args_from_checkpoint`` reads with ``--use-checkpoint-args``).
    ``dp``: the data-parallel size of the job writing it."""
    m, p, t = cfg.model, cfg.parallelism, cfg.training
    if t.train_samples is not None:  # sample-based training: Megatron-LM keeps train_iters it derived
        schedule = dict(train_samples=t.train_samples, lr_warmup_samples=t.lr_warmup_samples or 0,
                        lr_decay_samples=t.decay_samples, lr_warmup_iters=0, lr_decay_iters=None)
    else:
        schedule = dict(lr_warmup_iters=t.warmup_steps, lr_decay_iters=t.decay_steps)
    return argparse.Namespace(
        num_layers=m.layers, hidden_size=m.hidden_size, num_attention_heads=m.heads,
        num_query_groups=m.query_groups, group_query_attention=m.query_groups != m.heads,
        kv_channels=m.hidden_size // m.heads, ffn_hidden_size=m.ffn_size, seq_length=m.seq_length,
        max_position_embeddings=m.seq_length, position_embedding_type=m.position_embedding_type,
        add_position_embedding=m.position_embedding_type == "learned_absolute", rotary_base=m.rotary_base,
        swiglu=m.activation == "swiglu", normalization=m.normalization, add_bias_linear=m.add_bias_linear,
        untie_embeddings_and_output_weights=m.untie_embeddings_and_output_weights,
        padded_vocab_size=m.vocab_size, vocab_size=m.vocab_size, bf16=m.dtype == "bfloat16",
        fp16=m.dtype == "float16", tensor_model_parallel_size=p.tp, pipeline_model_parallel_size=p.pp,
        data_parallel_size=dp, micro_batch_size=t.micro_batch_size, global_batch_size=t.global_batch_size,
        train_iters=t.steps, lr=t.lr, min_lr=t.min_lr, lr_decay_style=t.lr_schedule, **schedule,
        weight_decay=t.weight_decay, clip_grad=t.grad_clip, seed=t.seed,
        use_distributed_optimizer=True, ckpt_format="torch_dist", sequence_parallel=cfg.megatron.sequence_parallel,
        transformer_impl=cfg.megatron.transformer_impl, init_method_std=m.init_method_std,
    )


def rng_states(tracker_states: dict | None) -> dict[str, Any]:
    """This process's generators as Megatron-LM's ``get_rng_state`` records them (``cuda_rng_state`` only when
    CUDA is available; ``rng_tracker_states``: megatron-core's CUDA RNG tracker, ``tracker_states``)."""
    import numpy as np

    out = {"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
           "torch_rng_state": torch.get_rng_state()}
    if torch.cuda.is_available():
        out["cuda_rng_state"] = torch.cuda.get_rng_state()
    out["rng_tracker_states"] = dict(tracker_states or {})
    return out


def rng_object(states: list | None, pp: tuple[int, int], tp: tuple[int, int], dp_rank: int):
    """The ``rng_state`` ShardedObject of rank ``(pp_rank, tp_rank)`` in a ``(pp_size, tp_size)`` grid,
    ``replica_id`` its dp rank (Megatron-LM's torch_dist layout); ``states``: ``[rng_states(...)]`` to save,
    None to load. ``pp``/``tp``: ``(rank, size)``."""
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    return ShardedObject("rng_state", states, (pp[1], tp[1]), (pp[0], tp[0]), replica_id=dp_rank)


def rng_key(pp: tuple[int, int], tp: tuple[int, int]) -> str:
    """The key under which torch.distributed.checkpoint stores :func:`rng_object` of ``(pp, tp)``
    (megatron-core's ``ShardedObject.unique_key``: ``rng_state/shard_{offsets}_{shape}``)."""
    return f"rng_state/shard_{pp[0]}.{tp[0]}_{pp[1]}.{tp[1]}"


def state_dict(model, optimizer, *, cfg, iteration: int, dp: int, rng) -> dict[str, Any]:
    """The sharded state dict of one rank, as Megatron-LM's ``generate_state_dict`` builds it: ``model``
    (``model.sharded_state_dict``; ``model`` is the bare GPTModel, not its DDP wrapper), ``optimizer``
    (``optimizer.sharded_state_dict(model's, metadata=content_metadata())``; left out when ``optimizer`` is
    None), ``opt_param_scheduler``, ``rng_state`` (``rng``: :func:`rng_object`, or None to leave it out),
    ``iteration``, ``args``, ``checkpoint_version``, ``num_floating_point_operations_so_far`` (0: not
    counted)."""
    md = content_metadata()
    sd: dict[str, Any] = {"args": megatron_args(cfg, dp), "checkpoint_version": CHECKPOINT_VERSION,
                          "iteration": int(iteration), "model": model.sharded_state_dict(metadata=md),
                          "opt_param_scheduler": scheduler_state(cfg, iteration),
                          "num_floating_point_operations_so_far": 0}
    if optimizer is not None:
        sd["optimizer"] = optimizer.sharded_state_dict(sd["model"], metadata=md)
    if rng is not None:
        sd["rng_state"] = rng
    return sd


def save(sd: dict[str, Any], root: str | os.PathLike, iteration: int, process_group=None) -> Path:
    """Write ``sd`` (:func:`state_dict`) as ``root/iter_{iteration:07d}`` with ``dist_checkpointing.save``
    (torch_dist; collective over the default group, every rank calls it), then, on rank 0 of
    ``process_group`` (default: the default group) after a barrier, ``latest_checkpointed_iteration.txt``:
    a checkpoint is named by the tracker only once every rank wrote its files. Returns the folder.

    A folder of the same iteration already there (a step replayed after a restart) is overwritten, as
    megatron-core does. Raises whatever megatron-core raises (I/O errors); the tracker then still names the
    previous checkpoint."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    d = iter_dir(root, iteration)
    if dist.get_rank(process_group) == 0:
        d.mkdir(parents=True, exist_ok=True)
    dist.barrier(group=process_group)
    dist_checkpointing.save(sd, str(d), content_metadata=content_metadata())
    dist.barrier(group=process_group)
    if dist.get_rank(process_group) == 0:
        write_tracker(root, iteration)
    dist.barrier(group=process_group)
    return d


def checkpoint_folder(root: str | os.PathLike) -> tuple[Path, int | str, bool, set[str]]:
    """``(folder, iteration, has optimizer state, DCP keys)`` of the checkpoint ``root``'s tracker names.

    Raises:
        ValueError: the tracker file is missing or malformed, or the folder is not a torch_dist checkpoint.
    """
    it = read_tracker(root)
    d = iter_dir(root, it)
    meta = read_metadata(d)
    return d, it, has_optimizer(meta.shapes), set(meta.keys)


def load_request(model, optimizer, d: Path, keys: set[str], *, pp, tp, dp_rank: int) -> dict[str, Any]:
    """The sharded state dict to pass to ``dist_checkpointing.load`` for the checkpoint folder ``d`` (DCP keys
    ``keys``): ``model``; ``optimizer`` (when given: the caller passes None for a checkpoint without optimizer
    state) in the checkpoint's own sharding type (its ``content_metadata``; Megatron-LM's fallback for a
    checkpoint without one); ``rng_state`` when written at this ``(pp, tp)`` grid; ``iteration``."""
    from megatron.core import dist_checkpointing

    md = dist_checkpointing.load_content_metadata(str(d)) or {}
    if "distrib_optim_sharding_type" not in md:
        args = dist_checkpointing.load_common_state_dict(str(d)).get("args")
        md = {**md, "distrib_optim_sharding_type": "fully_sharded_model_space"
              if getattr(args, "ckpt_fully_parallel_save", False) else "dp_zero_gather_scatter"}
    req: dict[str, Any] = {"model": model.sharded_state_dict(metadata=md), "iteration": None}
    if optimizer is not None:
        req["optimizer"] = optimizer.sharded_state_dict(req["model"], is_loading=True, metadata=md)
    if rng_key(pp, tp) in keys:
        req["rng_state"] = rng_object(None, pp, tp, dp_rank)
    return req


# --- the Megatron engine's checkpoints (called by phoenix_hpc.launch.persist) ----------------------------
def _grid(engine) -> tuple[tuple[int, int], tuple[int, int]]:
    return (engine.coord.pp, engine.pp), (engine.coord.tp, engine.tp)


def save_engine(engine, root: str | os.PathLike) -> Path:
    """Write S(step) of a :class:`~phoenix_hpc.engines.megatron_engine.MegatronEngine` into ``root`` in
    Megatron-LM's torch_dist layout (``root/iter_{step:07d}``, then ``latest_checkpointed_iteration.txt``):
    the model's and the DistributedOptimizer's sharded state dicts, iteration, scheduler, RNG
    (:func:`state_dict`). The optimizer's param groups are first set to the rate of the next update
    (``lr_for(training, step + 1)``, the rate at ``step x global_batch_size`` samples), where Megatron-LM's
    scheduler has left them when it saves iteration ``step`` (``train_step`` steps it after the optimizer);
    the engine sets them again before its next update. Collective over the default group (the generation's):
    every rank calls it. Returns the folder. Raises what megatron-core raises (I/O errors; CUDA is needed, see
    the module docstring)."""
    from phoenix_hpc.engines.schedule import lr_for

    for g in engine.optimizer.param_groups:
        g["lr"] = lr_for(engine.cfg.training, engine.step + 1)
    pp, tp = _grid(engine)
    tracker = engine._mc["tensor_parallel"].get_cuda_rng_tracker().get_states()
    rng = rng_object([rng_states(tracker)], pp, tp, engine.coord.dp)
    sd = state_dict(engine.model.module, engine.optimizer, cfg=engine.cfg, iteration=engine.step, dp=engine.dp,
                    rng=rng)
    return save(sd, root, engine.step, engine.groups.world if engine.groups is not None else None)


def save_snapshot(engine, optimizer_shard: dict[str, torch.Tensor], param_shard: dict[str, torch.Tensor],
                  envelope: dict[str, Any], root: str | os.PathLike) -> Path:
    """Write a host snapshot S(step) of this rank (the protector's local snapshot: ``optimizer_shard`` fp32 1-D
    main params and Adam moments, ``param_shard`` the model parameters in the model's dtype, both by the
    engine's shard names; ``envelope`` with the step, RNG and scheduler) into ``root`` in Megatron-LM's
    torch_dist layout: loaded into ``engine`` (a freshly built
    :class:`~phoenix_hpc.engines.megatron_engine.MegatronEngine` of the same grid coordinate), then
    :func:`save_engine`. Collective over the default group. Returns the folder ``root/iter_{step:07d}``.

    Raises:
        EngineError: the snapshot is not of this engine's shard (names, shapes, dtypes, coordinate).
        Whatever :func:`save_engine` raises.
    """
    engine.load_optimizer_shard(optimizer_shard)
    engine.load_param_shard(param_shard)
    engine.load_envelope(envelope)
    return save_engine(engine, root)


def restore_rng(states: dict, device, tracker=None) -> None:
    """Set Python's, NumPy's, torch's CPU (and, when recorded, CUDA on ``device``) generators and the CUDA RNG
    tracker (``tracker``, megatron-core's ``get_cuda_rng_tracker()``; skipped when None or nothing was
    recorded) from one entry of a checkpoint's ``rng_state`` list (:func:`rng_states`)."""
    import numpy as np

    random.setstate(states["random_rng_state"])
    np.random.set_state(states["np_rng_state"])
    torch.set_rng_state(states["torch_rng_state"])
    if "cuda_rng_state" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state(states["cuda_rng_state"], device)
    if tracker is not None and states.get("rng_tracker_states"):
        tracker.set_states(states["rng_tracker_states"])


def start_step(iteration: int | str, with_optimizer: bool, loaded_iteration) -> int:
    """The step a run loaded from a checkpoint of tracker ``iteration`` continues from: the common state's
    ``iteration`` (``loaded_iteration``; the tracker's when absent) when the checkpoint holds optimizer
    state, else 0 (weights only, or ``release``). Pure."""
    if not with_optimizer or iteration == "release":
        return 0
    return int(loaded_iteration if loaded_iteration is not None else iteration)


def load_engine(engine, root: str | os.PathLike) -> int:
    """Load the Megatron-LM torch_dist checkpoint that ``root/latest_checkpointed_iteration.txt`` names into a
    :class:`~phoenix_hpc.engines.megatron_engine.MegatronEngine`: the weights; with optimizer state, also the
    DistributedOptimizer (fp32 main params, Adam moments and step) and the iteration, which becomes the step
    (else the step is 0 and the fp32 main params are the loaded weights: ``reload_model_params``); the RNG
    states when written at this tp and pp. Step, data position and learning rate follow
    (:func:`start_step`). Collective over the default group. Returns the step.

    Raises:
        EngineError: the tracker file is missing or malformed, the folder is not a torch_dist checkpoint, or
            megatron-core cannot load it into this model (another shape).
    """
    from megatron.core import dist_checkpointing

    from phoenix_hpc.engines.adam_step import ensure_step_entries
    from phoenix_hpc.engines.schedule import lr_for
    from phoenix_hpc.errors import EngineError

    try:
        d, it, with_opt, keys = checkpoint_folder(root)
    except ValueError as exc:
        raise EngineError(f"resilience.checkpoint.load_megatron: {exc}") from None
    pp, tp = _grid(engine)
    gpt = engine.model.module
    req = load_request(gpt, engine.optimizer if with_opt else None, d, keys, pp=pp, tp=tp, dp_rank=engine.coord.dp)
    try:
        loaded = dist_checkpointing.load(req, str(d))
        gpt.load_state_dict(loaded["model"])
    except (RuntimeError, KeyError, AssertionError, ValueError) as exc:
        raise EngineError(f"resilience.checkpoint.load_megatron: {d} cannot be loaded into this model "
                          f"({type(exc).__name__}: {str(exc)[:300]})") from None
    if with_opt:
        engine.optimizer.load_state_dict(loaded["optimizer"])
    else:
        engine.optimizer.reload_model_params()
    for o in engine.dist_opts:
        ensure_step_entries(o.optimizer)
    if loaded.get("rng_state"):
        restore_rng(loaded["rng_state"][0], engine.device, engine._mc["tensor_parallel"].get_cuda_rng_tracker())
    t = engine.cfg.training
    step = start_step(it, with_opt, loaded.get("iteration"))
    engine.step, engine.data_position = step, step * t.global_batch_size
    # the rate iteration ``step`` trained with (that of (step - 1) x G samples); the next update uses
    # lr_for(t, step + 1), the rate at the checkpoint's num_steps = step x G, as Megatron-LM's would
    engine.last_lr = lr_for(t, step) if step > 0 else 0.0
    return step
