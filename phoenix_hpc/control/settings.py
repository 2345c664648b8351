"""The coordinator's settings: :class:`Timing`, from the job's config (:func:`timing_from_run_dir`).

Every time is in seconds. They come from ``resilience`` of ``RUN_DIR/config.yaml`` (docs/design.md section 9),
whose schema checks them; the defaults are for a coordinator started without a config (tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class Timing:
    """The resilience timing settings the coordinator uses (seconds)."""

    heartbeat_interval_s: float = 1.0
    heartbeat_timeout_s: float = 10.0
    collective_timeout_s: float = 30.0
    checkpoint_path: str | None = None
    summary_interval_s: float = 30.0
    progress_interval_s: float = 1.0  # at most one ``progress`` record per this many seconds
    commit_log_every: int = 10  # a ``commit`` record every this many recoverable steps, or per progress interval
    linger_s: float = 5.0
    final_checkpoint: bool = False  # a planned end writes a checkpoint from host memory (mode: phoenix)
    final_write_timeout_s: float = 120.0  # the members' write of that checkpoint (config.resolve.final_write_timeout_s)
    checkpoint_keep: int = 2  # complete checkpoints kept (resilience.checkpoint.keep)
    startup_grace_s: float = 0.0  # a slot's heartbeats are judged once it reported a step or after this (registration)
    in_job_restart: bool = False  # mode checkpoint-restart, checkpoint.restart in-job: a fault ends the step for a new one
    recovery_from_checkpoint: bool = False  # recovery_source checkpoint: every recovery loads the persistent checkpoint
    shrink: bool = False  # spares exhausted: shrink (remove the lost slots' DP replica) instead of stopping
    shrink_capable: bool = False  # the engine can shrink (drain --shrink asks for one whatever spares_exhausted says)
    # a member named the corrupted DP replica at two steps at most this far apart is replaced (0: never)
    agreement_strikes_window_steps: int = 1000
    # resilience.replica_agreement: false: nothing is compared, journalled once per generation (agreement_off)
    replica_agreement: bool = True
    # mode phoenix (enabled): the ranks snapshot every step; otherwise no digest exists to compare, journalled
    # once at job_running (agreement_off)
    snapshots: bool = True
    # the job's learning-rate schedule, recorded in the complete.json of a checkpoint it writes
    # (recovery.continuation.schedule_record; None: not recorded)
    lr_scheduler: dict | None = None


def timing_from_run_dir(run_dir: Path) -> tuple[Timing, tuple[int, int, int] | None]:
    """Timing and grid from ``RUN_DIR/config.yaml`` (defaults when the file is absent).

    Raises:
        ConfigError: the config exists but is invalid.
    """
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.exists():
        return Timing(), None
    from phoenix_hpc.config import load_job_config

    cfg = load_job_config(cfg_path)
    from phoenix_hpc.config.resolve import final_write_timeout_s
    from phoenix_hpc.recovery.ckpt_files import checkpoint_root
    from phoenix_hpc.recovery.continuation import schedule_record
    from phoenix_hpc.recovery.shrink import shrinks_when_spares_run_out

    r = cfg.resilience
    ck = str(checkpoint_root(cfg, run_dir))
    t = Timing(r.heartbeat_interval_s, r.heartbeat_timeout_s, r.collective_timeout_s, ck,
               linger_s=max(2.0, 2 * r.heartbeat_interval_s),
               final_checkpoint=bool(r.enabled and r.mode == "phoenix"), checkpoint_keep=r.checkpoint.keep,
               startup_grace_s=r.coordinator_grace_s,
               in_job_restart=bool(r.enabled and r.mode == "checkpoint-restart" and r.checkpoint.restart == "in-job"),
               recovery_from_checkpoint=bool(r.enabled and r.mode == "phoenix" and r.recovery_source == "checkpoint"),
               shrink=shrinks_when_spares_run_out(enabled=r.enabled, mode=r.mode,
                                                  spares_exhausted=r.spares_exhausted, engine=cfg.engine),
               shrink_capable=bool(r.enabled and r.mode == "phoenix" and cfg.engine == "torch"),
               agreement_strikes_window_steps=r.agreement_strikes_window_steps,
               replica_agreement=r.replica_agreement, snapshots=bool(r.enabled and r.mode == "phoenix"),
               final_write_timeout_s=final_write_timeout_s(bool(r.checkpoint.save_megatron), r.collective_timeout_s),
               lr_scheduler=schedule_record(cfg.training))
    par = cfg.parallelism
    grid = (par.tp, par.pp, par.dp) if par.dp else None
    return t, grid
