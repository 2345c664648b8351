"""Where a job's training metrics go (``logging.tensorboard``, ``logging.wandb`` of its ``config.yaml``), as
``phoenix status`` shows them. Pure.

The config is the run directory's ``config.yaml`` as a plain dict (status does not re-validate it: an older
version's config must still render), so a missing or malformed ``logging`` section reads as both off, and a
``tensorboard_dir`` that is not a string as TensorBoard off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def metrics_sinks(cfg: dict[str, Any] | None, run_dir: str) -> dict[str, Any] | None:
    """``{"tensorboard": the event files' folder or None, "wandb": {"project", "entity", "name", "mode", "dir"}
    or None}`` of the job's ``logging`` section, or None when neither is on. The folder is the one the logging
    rank writes (:func:`phoenix_hpc.launch.metrics_log.tensorboard_path`); the W&B run name defaults to the
    job's name, and ``dir`` is where an offline run's files are (``wandb.init(dir=RUN_DIR)`` writes under ``RUN_DIR/wandb``,
    :class:`phoenix_hpc.launch.metrics_log.WandbSink`; ``wandb sync`` uploads them)."""
    from phoenix_hpc.launch.metrics_log import tensorboard_path

    lg = (cfg or {}).get("logging")
    if not isinstance(lg, dict):
        return None
    tb_dir = lg.get("tensorboard_dir")
    # a tensorboard_dir that is not a path (hand-edited) is malformed: read as off, not joined to run_dir
    tb = (str(tensorboard_path(run_dir, tb_dir)) if lg.get("tensorboard") is True
          and (tb_dir is None or isinstance(tb_dir, str)) else None)
    w = lg.get("wandb")
    wandb = None
    if isinstance(w, dict) and w.get("project"):
        mode = w.get("mode") or "online"
        wandb = {"project": w["project"], "entity": w.get("entity"), "name": w.get("name") or (cfg or {}).get("name"),
                 "mode": mode, "dir": str(Path(run_dir) / "wandb") if mode == "offline" else None}
    if tb is None and wandb is None:
        return None
    return {"tensorboard": tb, "wandb": wandb}


def metrics_text(sinks: dict[str, Any]) -> str:
    """One line for the status header: each sink that is on, and where its data goes. Pure."""
    parts = []
    if sinks.get("tensorboard"):
        parts.append(f"TensorBoard {sinks['tensorboard']}")
    w = sinks.get("wandb")
    if w:
        where = f"{w['entity']}/{w['project']}" if w.get("entity") else w["project"]
        text = f"W&B project {where}, run {w.get('name') or '-'} ({w['mode']}"
        parts.append(text + (f": {w['dir']}, upload with wandb sync)" if w.get("dir") else ")"))
    return "; ".join(parts)
