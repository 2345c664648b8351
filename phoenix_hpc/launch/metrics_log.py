"""Training metrics to TensorBoard and W&B (``logging.tensorboard``, ``logging.wandb``), from one rank.

Which rank: the last pipeline stage's rank of DP index 0 and TP index 0 (:func:`is_logging_rank`), the one
that has the step's loss; a spare that takes its logical rank over after a hot swap logs from then on.

What, per step ``N`` (tags as Megatron-LM names them, ``megatron/training/training.py`` ``training_log`` and
``evaluate_and_print_results``, so dashboards of both compare; units in :data:`STEP_TAGS`): the training loss,
learning rate, grad norm, step time (seconds) and tokens/s; after an evaluation the validation loss
(:mod:`phoenix_hpc.launch.evaluate`). Every recovery the coordinator journals (``recovery_done``: generation,
action, recoverable step, steps replayed, total time and its phases detect/reconfigure/params/optimizer/replay,
:mod:`phoenix_hpc.control.recovery_machine`) becomes an event: in TensorBoard, scalars ``recovery/...`` and a
text summary at the recoverable step, in the run ``recoveries`` under the log directory (so that a later
rollback's purge never hides it); in W&B the same values with the next step's. The logging rank reads the
journal's new lines after each step (:class:`JournalTail`) and once more when it closes.

Replayed steps: after a rollback the replayed steps are logged again. TensorBoard: the writer is opened again
with ``purge_step`` at the first replayed step (``torch.utils.tensorboard.SummaryWriter``: TensorBoard hides
the older events at and after it), so each step shows once; a spare's first writer opens the same way. W&B
refuses steps below its last (its run's step only grows): a replayed step's values were logged already (the
recovery is bitwise) and are not sent again.

Nothing here changes training: a sink's failure to write is reported once on stderr and that sink stops, the
training goes on.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from phoenix_hpc.control import events as E

#: TensorBoard/W&B tag of each step value (Megatron-LM's names), and the unit. ``learning-rate`` at step s is
#: the rate step s's update used; Megatron-LM writes the next iteration's there (its scheduler has stepped)
STEP_TAGS = {"loss": ("lm loss", "nats/token"), "lr": ("learning-rate", "1"), "grad_norm": ("grad-norm", "1"),
             "step_time_s": ("iteration-time", "s"), "tokens_per_s": ("tokens-per-second", "tokens/s")}
#: the validation loss's tag (Megatron-LM's ``lm loss validation``)
VALID_TAG = "lm loss validation"
#: the TensorBoard run (sub-folder of the log directory) that holds the recovery events
RECOVERY_RUN = "recoveries"
#: the phases of a ``recovery_done`` record (phoenix_hpc.control.recovery_machine)
RECOVERY_PHASES = ("detect", "reconfigure", "params", "optimizer", "replay")


def is_logging_rank(coord, grid) -> bool:
    """Whether the rank at grid coordinate ``coord`` logs metrics: last pipeline stage, DP 0, TP 0. Pure."""
    return coord.pp == grid.pp - 1 and coord.dp == 0 and coord.tp == 0


def logging_problems(cfg) -> list[str]:
    """What the job's ``logging`` section asks that cannot work here: ``tensorboard: true`` without the
    tensorboard package, ``wandb`` without the wandb package (each importable, as the ranks will import it).
    Run by ``phoenix submit`` (a problem: exit 2) and by every slot before MPI starts."""
    out = []
    lg = cfg.logging
    if lg.tensorboard:
        try:
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401 -- needs the tensorboard package
        except Exception as exc:  # noqa: BLE001 -- ImportError, or tensorboard too old for torch
            out.append(f"logging.tensorboard: true needs the tensorboard package (pip install "
                       f"'phoenix-hpc[tensorboard]'); importing it failed: {type(exc).__name__}: {exc} (allowed "
                       "without it: tensorboard: false)")
    if lg.wandb is not None:
        try:
            import wandb  # noqa: F401
        except Exception as exc:  # noqa: BLE001
            out.append(f"logging.wandb: project {lg.wandb.project!r} needs the wandb package installed where the "
                       f"job runs (pip install wandb; then wandb login, or offline mode); importing it failed: "
                       f"{type(exc).__name__}: {exc} (allowed without it: no logging.wandb)")
    return out


def step_values(rec) -> dict[str, float]:
    """The logged values of a :class:`phoenix_hpc.launch.loop.StepRecord`, by tag (no loss: none logged). Pure."""
    vals = {"lr": rec.lr, "grad_norm": rec.grad_norm, "step_time_s": rec.step_time_ms / 1e3,
            "tokens_per_s": rec.tokens_per_s}
    if rec.loss is not None:
        vals["loss"] = rec.loss
    return {STEP_TAGS[k][0]: float(v) for k, v in vals.items()}


def recovery_values(ev: dict[str, Any]) -> dict[str, float]:
    """``recovery/...`` scalars of a ``recovery_done`` journal record (seconds; counts). Pure."""
    out = {"recovery/total_s": float(ev.get("total_s", 0.0)),
           "recovery/steps_replayed": float(ev.get("steps_replayed", 0)),
           "recovery/generation": float(ev.get("generation", 0))}
    for p in RECOVERY_PHASES:
        if p in (ev.get("phases") or {}):
            out[f"recovery/{p}_s"] = float(ev["phases"][p])
    return out


def recovery_text(ev: dict[str, Any]) -> str:
    """A markdown line describing a ``recovery_done`` record (what TensorBoard's text tab shows). Pure."""
    phases = ", ".join(f"{k} {v} s" for k, v in (ev.get("phases") or {}).items())
    return (f"generation {ev.get('generation')}: {ev.get('action')} at recoverable step {ev.get('recoverable_step')}, "
            f"{ev.get('steps_replayed')} steps replayed, {ev.get('total_s')} s ({phases})")


class JournalTail:
    """The new ``recovery_done`` records of ``RUN_DIR/journal.jsonl`` since the last call (whole lines only;
    a torn last line waits for its end). A missing journal (no coordinator) yields nothing.

    Args:
        path: the journal; ``since_step``: records whose recoverable step is below it are skipped (they were
            logged before this rank took the role over: a spare, a resumed job).
    """

    def __init__(self, path: str | os.PathLike, since_step: int = 0):
        self.path = Path(path)
        self.since_step = since_step
        self.offset = 0

    def new_recoveries(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        out = []
        for line in data[:end].splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and rec.get("event") == E.RecoveryDone.NAME \
                    and int(rec.get("recoverable_step", 0)) >= self.since_step:
                out.append(rec)
        return out


class TensorBoardSink:
    """Event files in ``log_dir`` (``torch.utils.tensorboard.SummaryWriter``, opened at the first value);
    recoveries in ``log_dir/recoveries``. ``writer_class`` is injectable for tests."""

    def __init__(self, log_dir: str | os.PathLike, writer_class=None):
        self.log_dir = Path(log_dir)
        self._cls = writer_class
        self._writer = None
        self._recoveries = None
        self.last_train_step: int | None = None

    def _class(self):
        if self._cls is None:
            from torch.utils.tensorboard import SummaryWriter

            self._cls = SummaryWriter
        return self._cls

    def scalars(self, step: int, values: dict[str, float], train: bool) -> None:
        """``values`` at ``step``; ``train``: a training step's (else an evaluation's, which comes before its
        step's record). A value at or below the last training step logged starts a replay: the writer is
        opened again with ``purge_step=step``."""
        if self._writer is None or (self.last_train_step is not None and step <= self.last_train_step):
            if self._writer is not None:
                self._writer.close()
            self._writer = self._class()(log_dir=str(self.log_dir), purge_step=step)
            self.last_train_step = step - 1
        for tag, v in values.items():
            self._writer.add_scalar(tag, v, step)
        if train:
            self.last_train_step = step
            self._writer.flush()

    def recovery(self, ev: dict[str, Any]) -> None:
        if self._recoveries is None:
            self._recoveries = self._class()(log_dir=str(self.log_dir / RECOVERY_RUN))
        step = int(ev.get("recoverable_step", 0))
        for tag, v in recovery_values(ev).items():
            self._recoveries.add_scalar(tag, v, step)
        self._recoveries.add_text("recovery", recovery_text(ev), step)
        self._recoveries.flush()

    def close(self) -> None:
        for w in (self._writer, self._recoveries):
            if w is not None:
                w.close()
        self._writer = self._recoveries = None


def wandb_run_id(run_dir: str | os.PathLike) -> str:
    """The W&B run id of a job: 16 hex digits of SHA-256 of its run directory's absolute path, the same for a
    spare that takes the logging rank over and for a resubmitted job of the same run directory. Pure."""
    return hashlib.sha256(str(Path(run_dir).absolute()).encode()).hexdigest()[:16]


class WandbSink:
    """A W&B run (``wandb.init(..., id=wandb_run_id(run_dir), resume="allow")``, opened at the first value).
    ``module`` is the ``wandb`` module (injectable for tests)."""

    def __init__(self, wcfg, job_name: str, run_dir: str | os.PathLike, config: dict, module=None):
        self.wcfg = wcfg
        self.job_name = job_name
        self.run_dir = Path(run_dir)
        self.config = config
        self._module = module
        self.run = None
        self.last_step: int | None = None
        self.last_train_step: int | None = None
        self._pending: dict[str, float] = {}

    def _open(self) -> None:
        wandb = self._module
        if wandb is None:
            import wandb
        w = self.wcfg
        kw = {"project": w.project, "name": w.name or self.job_name, "id": wandb_run_id(self.run_dir),
              "resume": "allow", "mode": w.mode, "dir": str(self.run_dir), "config": self.config}
        if w.entity is not None:
            kw["entity"] = w.entity
        self.run = wandb.init(**kw)

    def scalars(self, step: int, values: dict[str, float], train: bool) -> None:
        """``values`` at ``step`` (an evaluation's comes before its step's record, at the same W&B step); a
        value at or below the last training step sent is a replayed one and is not sent (module doc)."""
        if self.last_train_step is not None and step <= self.last_train_step:
            return
        if self.run is None:
            self._open()
        data = dict(values)
        if self._pending:
            data.update(self._pending)
            self._pending = {}
        self.run.log(data, step=step)
        self.last_step = step
        if train:
            self.last_train_step = step

    def recovery(self, ev: dict[str, Any]) -> None:
        self._pending.update(recovery_values(ev))

    def close(self) -> None:
        if self.run is not None:
            if self._pending and self.last_step is not None:
                self.run.log(dict(self._pending), step=self.last_step)
                self._pending = {}
            self.run.finish()
            self.run = None


class MetricsLog:
    """The logging rank's sinks fed from the loop's records and the journal (module doc).

    Args:
        sinks: objects with ``scalars(step, values, train)``, ``recovery(event)``, ``close()``.
        tail: the :class:`JournalTail` of the job's journal, or None.
        warn: where a failing sink is reported (once).
    """

    def __init__(self, sinks: list, tail: JournalTail | None = None, warn=None):
        self.sinks = list(sinks)
        self.tail = tail
        self._warn = warn or (lambda msg: print(msg, file=sys.stderr, flush=True))

    def _each(self, call: str, *args) -> None:
        for s in list(self.sinks):
            try:
                getattr(s, call)(*args)
            except Exception as exc:  # noqa: BLE001 -- logging never ends the training
                self.sinks.remove(s)
                self._warn(f"[phoenix] metrics logging to {type(s).__name__} stopped: {type(exc).__name__}: {exc}")

    def step(self, rec) -> None:
        """A :class:`phoenix_hpc.launch.loop.StepRecord`, then the recoveries journaled since the last call."""
        self._each("scalars", rec.step, step_values(rec), True)
        self.recoveries()

    def evaluation(self, rec) -> None:
        """A :class:`phoenix_hpc.launch.evaluate.EvalRecord` (nothing without a loss: not the last stage)."""
        if rec.loss is not None:
            self._each("scalars", rec.step, {VALID_TAG: float(rec.loss)}, False)

    def recoveries(self) -> None:
        """Log the recoveries journaled since the last call; an unreadable journal is reported once and no
        longer read (the step values still go out)."""
        if self.tail is None or not self.sinks:
            return
        try:
            events = self.tail.new_recoveries()
        except OSError as exc:
            self.tail = None
            self._warn(f"[phoenix] metrics logging: the journal cannot be read, recoveries are not logged: {exc}")
            return
        for ev in events:
            self._each("recovery", ev)

    def close(self) -> None:
        self.recoveries()
        self._each("close")


def tensorboard_path(run_dir: str | os.PathLike, tensorboard_dir: str | None) -> Path:
    """Where the event files go: ``logging.tensorboard_dir`` (relative: to ``run_dir``), by default
    ``RUN_DIR/tensorboard``. Pure."""
    return Path(run_dir) / (tensorboard_dir or "tensorboard")


def metrics_log_of(cfg, run_dir: str | os.PathLike, since_step: int) -> MetricsLog | None:
    """The job's :class:`MetricsLog` for the logging rank, or None when neither TensorBoard nor W&B is asked.
    ``since_step``: the step this rank starts logging from (its engine's step at the start)."""
    lg = cfg.logging
    sinks: list = []
    if lg.tensorboard:
        sinks.append(TensorBoardSink(tensorboard_path(run_dir, lg.tensorboard_dir)))
    if lg.wandb is not None:
        sinks.append(WandbSink(lg.wandb, cfg.name, run_dir, cfg.model_dump(mode="json")))
    if not sinks:
        return None
    from phoenix_hpc.control.journal import JOURNAL_NAME

    return MetricsLog(sinks, JournalTail(Path(run_dir) / JOURNAL_NAME, since_step))
