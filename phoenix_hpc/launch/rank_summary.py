"""What an active rank writes about its run (the files are listed in :mod:`phoenix_hpc.launch.rank`): every
step's record in ``rank{r}.steps.jsonl`` and the step and evaluation lines on stdout (:class:`StepLog`), and
the summary ``rank{r}.json`` (:func:`done_summary`, :func:`end_summary`, :func:`write_summary`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

#: a summary's ``status`` when the rank left on the coordinator's word (the exception's ``job_state``): a
#: planned end (not a failure), a planned drain that moved the rank to a spare, a fence (declared dead), a
#: shrink that removed its DP replica; any other error leaves ``failed``
STATUS_OF_END = {"stopped": "stopped", "drained": "drained", "fenced": "fenced", "standby": "left"}
#: statuses whose summary goes to ``{status}-world{w}.json``: the logical rank is held by a spare now (or
#: soon), or by a renumbered member after a shrink
BY_WORLD_RANK = ("drained", "fenced", "left")


def write_json_atomic(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def tensors_hash(pairs) -> str:
    from phoenix_hpc.engines.base import tensors_digest

    return tensors_digest(pairs)


class StepLog:
    """A rank's record of its steps: the step log (one JSON object per step, appended), the progress its
    heartbeats report, the running totals of the summary, the metrics log (one rank: ``metrics``, or None),
    and on the ``reporter`` (last pipeline stage, DP rank 0) a line per ``training.log_interval`` steps and
    per evaluation."""

    def __init__(self, cfg, path: Path, progress, reporter: bool, metrics):
        from phoenix_hpc.launch.loop import StepTotals

        self.cfg, self.progress, self.reporter, self.metrics = cfg, progress, reporter, metrics
        self.totals = StepTotals()  # the records themselves go to the step log, not to memory
        self.file = path.open("a")

    def on_eval(self, rec) -> None:
        if self.reporter and rec.loss is not None:
            print(f"eval {rec.step:>6}/{self.cfg.training.steps} | validation loss {rec.loss:8.4f} | "
                  f"{rec.iters} batches | {rec.eval_time_ms:8.1f} ms{' | after training' if rec.final else ''}",
                  flush=True)
        if self.metrics is not None:
            self.metrics.evaluation(rec)

    def record(self, rec) -> None:
        self.totals.add(rec)
        if self.metrics is not None:
            self.metrics.step(rec)
        if self.progress is not None:  # what the coordinator heartbeat reports
            self.progress.set(step=rec.step)
        self.file.write(json.dumps(rec.as_dict()) + "\n")
        self.file.flush()
        steps = self.cfg.training.steps
        if self.reporter and (rec.step % self.cfg.training.log_interval == 0 or rec.step == steps):
            print(
                f"step {rec.step:>6}/{steps} | loss {rec.loss:8.4f} | {rec.step_time_ms:8.1f} ms "
                f"| {rec.tokens_per_s:10,.0f} tok/s | lr {rec.lr:.2e} | wait {rec.exposed_wait_ms:.1f} ms",
                flush=True,
            )

    def close(self) -> None:
        self.file.close()
        if self.metrics is not None:
            self.metrics.close()


def done_summary(engine, totals, tokens_per_step: int) -> dict[str, Any]:
    """The summary's fields of a finished run: steps, losses, speed, the state's hashes and shard sizes."""
    opt, par = engine.optimizer_shard(), engine.param_shard()
    return dict(
        status="done",
        steps=engine.step,
        first_loss=totals.first_loss,
        final_loss=totals.last_loss,
        mean_step_time_ms=totals.time_ms / totals.steps if totals.steps else None,
        tokens_per_s=tokens_per_step * totals.steps / (totals.time_ms / 1e3) if totals.time_ms > 0 else None,
        state_hash=engine.state_hash(),
        param_hash=tensors_hash(par),
        optimizer_hash=tensors_hash(opt),
        optimizer_shard_bytes=sum(t.numel() * t.element_size() for _, t in opt),
        param_shard_bytes=sum(t.numel() * t.element_size() for _, t in par),
    )


def done_line(summary: dict[str, Any], rank: int) -> str:
    """The reporter's closing line of a finished run (:func:`done_summary`'s ``summary``): steps, first and
    final loss, mean step time (ms) and throughput (tokens/s), and the first 16 hex digits of the rank's
    ``state_hash``. A job that trained no step (it started from a checkpoint already at ``training.steps``)
    has no losses, mean or throughput: the line says so instead of formatting ``None``. Pure."""
    head = f"done: {summary['steps']} steps"
    if summary.get("mean_step_time_ms") is None:
        speed = "no step trained in this job (started at its last step)"
    else:
        tok = summary.get("tokens_per_s")
        speed = (f"loss {summary['first_loss']} -> {summary['final_loss']}, {summary['mean_step_time_ms']:.1f} "
                 f"ms/step, " + ("no tokens/s" if tok is None else f"{tok:,.0f} tok/s"))
    return f"{head}, {speed}, state_hash[rank {rank}] {str(summary['state_hash'])[:16]}"


def end_summary(summary: dict[str, Any], member) -> None:
    """What every summary ends with: the collector's pauses and, for a member of the job's generations, its
    generation, recoveries, grid (a shrink changes it and renumbers the members), rank and coordinate."""
    from phoenix_hpc.launch.heap import PAUSES

    summary["gc"] = PAUSES.summary()
    if member is None:
        return
    summary["generation"] = member.generation
    summary["recoveries"] = [vars(r) for r in member.recoveries]
    summary["grid"] = member.env.grid.to_json()
    if member.logical is not None:
        summary["rank"] = member.logical
        if member.coord is not None:
            summary["coord"] = member.coord.to_json()


def write_summary(ranks_dir: Path, summary: dict[str, Any]) -> None:
    """``rank{r}.json``, or ``{status}-world{w}.json`` for a slot that left its rank (:data:`BY_WORLD_RANK`)."""
    moved = summary.get("status") in BY_WORLD_RANK
    name = f"{summary['status']}-world{summary['world_rank']}.json" if moved else f"rank{summary['rank']}.json"
    write_json_atomic(ranks_dir / name, summary)
