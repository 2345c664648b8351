"""Persistent-checkpoint hooks of the training loop (docs/design.md section 6): a DCP checkpoint every
``resilience.checkpoint.interval_steps`` steps, and at start-up a restore from the newest complete one.

With ``resilience.mode: checkpoint-restart`` (the baseline) this is the whole mechanism. With
``mode: phoenix`` it is the coarse fallback: when memory replicas cannot cover a loss the members of the
next generation load the newest checkpoint in the job (:func:`restore_step`), and a resubmitted job
resumes from it at start-up.

With ``resilience.checkpoint.save_megatron`` every persistent checkpoint is also written in Megatron-LM's
torch_dist layout there (:func:`phoenix_hpc.engines.megatron_ckpt.save_engine`; event
``save_megatron``); with ``load_megatron`` a job with no checkpoint of its own starts from that Megatron-LM
checkpoint.

Both hooks are collective over ``groups.world`` (every active rank calls them at the same step) and use
:mod:`phoenix_hpc.recovery.checkpoint` (torch.distributed.checkpoint on that explicit group). The
checkpoint root is ``resilience.checkpoint.path`` or ``RUN_DIR/checkpoints``; a restarted job points at
the same root (an absolute ``checkpoint.path``) to find it.

Timings for the benchmarks (unix seconds, wall clock) are appended by each rank to
``RUN_DIR/ranks/rank{r}.persist.jsonl``: ``{"event": "save", "step", "t_start", "t_end"}``, ``{"event": "save_megatron", "step", "t_start", "t_end"}``
(with ``"final": true`` for the final checkpoint of a planned end, :mod:`phoenix_hpc.launch.final_megatron`) and
``{"event": "restore", "step", "t_start", "t_end", "slurm_job_id", "slurm_step_id"}`` (or ``{"event": "restore", "step": null, ...}`` when
there was nothing to restore).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from phoenix_hpc.engines.base import Engine, ProcessGroups
from phoenix_hpc.recovery.ckpt_files import checkpoint_root  # noqa: F401 -- also re-exported


def enabled(cfg) -> bool:
    """True when this job writes and restores persistent checkpoints: resilience on, ``mode`` either
    ``checkpoint-restart`` (the baseline) or ``phoenix`` (the fallback behind the memory replicas)."""
    from phoenix_hpc.recovery.continuation import checkpoints_on

    return checkpoints_on(cfg)


def is_due(step: int, interval_steps: int) -> bool:
    """A checkpoint is written after steps ``K, 2K, ...`` (never after step 0)."""
    return step > 0 and step % interval_steps == 0


def log_event(run_dir, rank: int, rec: dict) -> None:
    """Append ``rec`` to ``RUN_DIR/ranks/rank{rank}.persist.jsonl`` (one JSON object a line)."""
    d = Path(run_dir) / "ranks"
    d.mkdir(parents=True, exist_ok=True)
    with open(d / f"rank{rank}.persist.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")


def _rank(groups: ProcessGroups) -> int:
    import torch.distributed as dist

    return dist.get_rank(groups.world)


def save_if_due(engine: Engine, groups: ProcessGroups, step: int, cfg, run_dir: str | os.PathLike) -> Path | None:
    """After ``step``: write S(step) when persistent checkpoints are on and the step is due. Collective over
    ``groups.world``. Returns the checkpoint folder, or None when nothing was written. DCP/I-O errors
    propagate (the caller reports a fault)."""
    from phoenix_hpc.recovery.checkpoint import save_checkpoint
    from phoenix_hpc.recovery.ckpt_compat import model_record
    from phoenix_hpc.recovery.continuation import MARKER_KEY, schedule_record

    if not enabled(cfg) or not is_due(step, cfg.resilience.checkpoint.interval_steps):
        return None
    t0 = time.time()
    path = save_checkpoint(engine, checkpoint_root(cfg, run_dir), groups.world, keep=cfg.resilience.checkpoint.keep,
                           record={**model_record(cfg), MARKER_KEY: schedule_record(cfg.training)})
    log_event(run_dir, _rank(groups), {"event": "save", "step": int(step), "t_start": t0, "t_end": time.time()})
    if cfg.resilience.checkpoint.save_megatron:
        t1 = time.time()
        from phoenix_hpc.engines.megatron_ckpt import save_engine

        save_engine(engine, cfg.resilience.checkpoint.save_megatron)
        log_event(run_dir, _rank(groups), {"event": "save_megatron", "step": int(step), "t_start": t1, "t_end": time.time()})
    return path


def restore_latest(engine: Engine, groups: ProcessGroups, cfg, run_dir: str | os.PathLike) -> int | None:
    """At start-up: load the newest complete checkpoint into ``engine`` when persistent checkpoints are on
    and one exists; else, with ``resilience.checkpoint.load_megatron``, the Megatron-LM checkpoint it names
    (:func:`phoenix_hpc.engines.megatron_ckpt.load_engine`: weights, and optimizer state and iteration when
    present; logged as event ``load_megatron``). Collective over ``groups.world``. Returns the restored step,
    or None (nothing restored).

    Raises RecoveryError (from :func:`load_checkpoint`) when ``latest`` names a checkpoint that is missing, or
    when the Megatron-LM checkpoint cannot be loaded (its tracker file, its format, another model shape).
    """
    from phoenix_hpc.recovery.checkpoint import latest_step, load_checkpoint

    t0 = time.time()
    root = checkpoint_root(cfg, run_dir)
    step = latest_step(root) if enabled(cfg) else None
    if step is not None:
        step = load_checkpoint(engine, root, groups.world, step)
    elif cfg.resilience.checkpoint.load_megatron:
        step = _load_megatron(engine, cfg.resilience.checkpoint.load_megatron)
        log_event(run_dir, _rank(groups), {"event": "load_megatron", "step": step, "t_start": t0, "t_end": time.time(),
                                      "dir": cfg.resilience.checkpoint.load_megatron})
        return step
    if not enabled(cfg):
        return None
    log_event(run_dir, _rank(groups), {"event": "restore", "step": step, "t_start": t0, "t_end": time.time(),
                                  **slurm_ids()})
    return step


def _load_megatron(engine: Engine, root: str) -> int:
    """:func:`phoenix_hpc.engines.megatron_ckpt.load_engine`, its EngineError reported as a RecoveryError (the
    start-up restore's)."""
    from phoenix_hpc.engines.megatron_ckpt import load_engine
    from phoenix_hpc.errors import EngineError, RecoveryError

    try:
        return int(load_engine(engine, root))
    except EngineError as exc:
        raise RecoveryError(str(exc)) from None


def slurm_ids(env=None) -> dict:
    """``{"slurm_job_id", "slurm_step_id"}`` of this process (``SLURM_JOB_ID``/``SLURM_STEP_ID``, srun(1)
    OUTPUT ENVIRONMENT VARIABLES; None outside a step): which job and step a restore ran in."""
    env = os.environ if env is None else env
    return {"slurm_job_id": env.get("SLURM_JOB_ID"), "slurm_step_id": env.get("SLURM_STEP_ID")}


def start_step(cfg, run_dir: str | os.PathLike) -> int:
    """The step :func:`restore_latest` will leave the engine at: the newest complete checkpoint's, else the
    iteration of the Megatron-LM checkpoint of ``load_megatron`` when it holds optimizer state
    (:func:`phoenix_hpc.engines.megatron_layout.start_iteration`), else 0 (a file-system read; no
    collective)."""
    from phoenix_hpc.recovery.checkpoint import latest_step

    own = latest_step(checkpoint_root(cfg, run_dir)) if enabled(cfg) else None
    if own is None and cfg.resilience.checkpoint.load_megatron:
        from phoenix_hpc.engines.megatron_layout import start_iteration

        try:
            return start_iteration(cfg.resilience.checkpoint.load_megatron)
        except ValueError:
            return 0  # restore_latest reports it
    return own or 0


def restore_step(engine: Engine, groups: ProcessGroups, cfg, run_dir: str | os.PathLike, step: int) -> int:
    """In the job (the fallback of a recovery plan): load the checkpoint of ``step`` into ``engine``.
    Collective over ``groups.world`` of the new generation. Returns ``step``.

    Raises RecoveryError when that checkpoint is missing."""
    from phoenix_hpc.recovery.checkpoint import load_checkpoint

    t0 = time.time()
    got = load_checkpoint(engine, checkpoint_root(cfg, run_dir), groups.world, int(step))
    log_event(run_dir, _rank(groups), {"event": "restore", "step": got, "t_start": t0, "t_end": time.time(),
                                  "in_job": True})
    return got
