"""Whether a job can continue from the newest complete checkpoint of its checkpoint folder
(``resilience.checkpoint.path``), as ``phoenix submit`` judges it before anything is written or submitted: a
step left to train (:func:`nothing_left`), and the learning-rate schedule that checkpoint was trained with
against the config's (:func:`schedule_differences`). File reading of ``complete.json`` only (no torch: submit
runs on a login node).

A job's ranks load that checkpoint at start-up whenever persistent checkpoints are on
(:func:`checkpoints_on`; ``launch/persist.py`` ``restore_latest``), whether the job was submitted with
``--resume`` or afresh with a config whose checkpoint folder already holds one (a config that names an
absolute ``resilience.checkpoint.path``, e.g. one ``phoenix config from-megatron`` converted from a script
that passes the same ``--save`` folder every time).

The schedule. A checkpoint's ``complete.json`` records the schedule of the job that wrote it (``lr_scheduler``:
:func:`phoenix_hpc.engines.schedule.scheduler_record` without the step and rate reached). The rate of a step is
always :func:`phoenix_hpc.engines.schedule.lr_for` of the job's own config (the engine does not read the
schedule back from the checkpoint), so a config with another schedule trains on with that one. What decides the
rate (:data:`STEP_FIELDS`, or :data:`SAMPLE_FIELDS` for a run counted in samples) is compared: the decay style,
the peak and final rate, the warm-up and the decay length in effect (``training.lr_decay_steps``, else
``training.steps``). ``training.steps`` itself is not compared: a job may train longer with the same schedule
by fixing ``training.lr_decay_steps`` at the checkpoint's decay length, as with Megatron-LM, whose
``OptimizerParamScheduler.load_state_dict`` (megatron-core's ``optimizer_param_scheduler.py``) asserts the same
values unless ``--override-opt_param-scheduler`` or ``--use-checkpoint-opt_param-scheduler`` is given.
phoenix's use (``cli/submit.py``): a fresh submit that would continue from such a checkpoint is refused, as a
Megatron-LM checkpoint with another schedule is (:mod:`phoenix_hpc.engines.megatron_schedule`); ``phoenix
submit --resume RUN_DIR [CONFIG]`` (whose config may change ``training.steps``, docs/design.md "Resume") trains
on with the config's schedule and warns, naming each value that changed.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from phoenix_hpc.recovery.ckpt_files import read_marker, step_dir

#: ``complete.json``'s key of the schedule record
MARKER_KEY = "lr_scheduler"
#: the record's fields that decide the rate of a run counted in steps: (field, the config field it comes from)
STEP_FIELDS = (("kind", "training.lr_schedule"), ("lr", "training.lr"), ("min_lr", "training.min_lr"),
               ("warmup_steps", "training.warmup_steps"), ("decay_steps", "training.lr_decay_steps"))
#: the same for a run counted in samples (``training.train_samples``)
SAMPLE_FIELDS = (("kind", "training.lr_schedule"), ("lr", "training.lr"), ("min_lr", "training.min_lr"),
                 ("warmup_samples", "training.lr_warmup_samples"), ("decay_samples", "training.lr_decay_samples"))


def checkpoints_on(cfg) -> bool:
    """True when the job writes and restores persistent checkpoints: resilience on, ``mode`` either
    ``checkpoint-restart`` or ``phoenix`` (its ranks then load the newest complete checkpoint of
    ``resilience.checkpoint.path`` at start-up)."""
    return bool(cfg.resilience.enabled and cfg.resilience.mode in ("checkpoint-restart", "phoenix"))


def schedule_record(training) -> dict[str, Any]:
    """The schedule the job's ``training`` section defines, as a checkpoint's ``complete.json`` records it
    (:data:`MARKER_KEY`): :func:`phoenix_hpc.engines.schedule.scheduler_record` without ``last_step`` and
    ``last_lr``."""
    from phoenix_hpc.engines.schedule import scheduler_record

    rec = scheduler_record(training, 0, None)
    return {k: v for k, v in rec.items() if k not in ("last_step", "last_lr")}


def nothing_left(root, step: int, steps: int, resuming: bool) -> str | None:
    """Why a job whose checkpoint folder ``root`` holds the complete checkpoint of ``step`` has nothing to
    train with ``training.steps`` = ``steps`` (its ranks would load it and stop at once), naming what is
    allowed; None when ``step < steps``. ``resuming``: worded for ``phoenix submit --resume``. Pure."""
    if step < steps:
        return None
    where = "beyond" if step > steps else "at"
    head = (f"resilience.checkpoint.path: {root} holds a complete checkpoint of step {step}, {where} "
            f"training.steps {steps}, which this job would continue from: nothing left to train")
    if resuming:
        return (f"--resume: {head}; allowed: more steps (--steps N or training.steps in a config passed with "
                f"--resume, N > {step})")
    return (f"{head}; allowed: more steps (--steps N or training.steps, N > {step}; to keep the learning-rate "
            "schedule the checkpoint was trained with, also training.lr_decay_steps at its decay length), another "
            "resilience.checkpoint.path (a new run, from step 0), or moving that checkpoint folder aside")


@dataclass(frozen=True)
class Difference:
    """One schedule value that differs: ``field`` (the record's name), its value in the checkpoint
    (``checkpoint``) and in the config (``config``), and the config field that sets it (``source``)."""

    field: str
    checkpoint: Any
    config: Any
    source: str


def _same(a: Any, b: Any) -> bool:
    """Equal; floats within a relative 1e-9 (a rate written to YAML and read back)."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) \
            and not isinstance(b, bool):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
    return a == b


def schedule_differences(recorded: dict[str, Any], training) -> list[Difference]:
    """Where the schedule a checkpoint records (``recorded``, :data:`MARKER_KEY` of its ``complete.json``)
    differs from the one ``training`` defines, in what decides the rate (module doc): a run counted in steps
    against one counted in samples is one difference (``counted_in``); a field the record lacks is not
    compared. Empty: the job continues on the schedule the checkpoint was trained with. Pure."""
    want = schedule_record(training)
    ck_samples = recorded.get("train_samples") is not None
    cfg_samples = want.get("train_samples") is not None
    if ck_samples != cfg_samples:
        unit = {True: "samples", False: "steps"}
        return [Difference("counted_in", unit[ck_samples], unit[cfg_samples], "training.train_samples")]
    out = []
    for field, source in (SAMPLE_FIELDS if cfg_samples else STEP_FIELDS):
        if field in recorded and not _same(recorded[field], want.get(field)):
            if field == "decay_steps" and training.lr_decay_steps is None:
                source = "training.steps (training.lr_decay_steps unset)"
            elif field == "decay_samples" and training.lr_decay_samples is None:
                source = "training.train_samples (training.lr_decay_samples unset)"
            out.append(Difference(field, recorded[field], want.get(field), source))
    return out


def _change(d: Difference) -> str:
    """What to set in the config to keep the checkpoint's value of ``d``."""
    if d.field == "counted_in":
        return ("training.train_samples set" if d.checkpoint == "samples" else "training.train_samples unset")
    fld = dict(STEP_FIELDS + SAMPLE_FIELDS)[d.field]  # the config field that sets it
    return f"{fld}: {d.checkpoint}"


def checkpoint_schedule(root, step: int) -> dict[str, Any] | None:
    """The schedule record of the checkpoint of ``step`` under ``root`` (None: its ``complete.json`` has
    none, as a checkpoint written before it was recorded)."""
    rec = (read_marker(root, step) or {}).get(MARKER_KEY)
    return rec if isinstance(rec, dict) else None


def schedule_problems(root, step: int, training, resuming: bool) -> list[str]:
    """The schedule differences (:func:`schedule_differences`) between the checkpoint of ``step`` under
    ``root`` and the config's ``training`` section, as messages: one problem (a fresh submit: it is refused)
    or one warning (``resuming``: ``--resume`` trains on with the config's schedule), naming the file, every
    differing field with the checkpoint's and the config's value, and what keeps or accepts the change.
    Empty when they agree or the checkpoint records no schedule."""
    recorded = checkpoint_schedule(root, step)
    if recorded is None:
        return []
    diffs = schedule_differences(recorded, training)
    if not diffs:
        return []
    where = os.path.join(str(step_dir(root, step)), "complete.json")
    listed = "; ".join(f"lr_scheduler.{d.field} is {d.checkpoint!r} there and {d.config!r} for this config "
                       f"({d.source})" for d in diffs)
    keep = ", ".join(_change(d) for d in diffs)
    if resuming:
        return [f"--resume: the checkpoint of step {step} was trained with another learning-rate schedule "
                f"({where}): {listed}; the run continues from step {step} on this config's schedule (the rate of "
                f"every step is that of the config); to keep the checkpoint's instead: {keep}"]
    return [f"resilience.checkpoint.path: {root} holds the checkpoint of step {step}, which this job would "
            f"continue from, trained with another learning-rate schedule ({where}): {listed}; continuing would "
            "change the schedule it was trained with (phoenix refuses it as Megatron-LM does without "
            f"--override-opt_param-scheduler); allowed: {keep} (the checkpoint's schedule), another "
            "resilience.checkpoint.path (a new run, from step 0), or `phoenix submit --resume RUN_DIR CONFIG` of the "
            "stopped run that wrote it, which continues on CONFIG's schedule with a warning"]
