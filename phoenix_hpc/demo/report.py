"""The demo's verdict: one finished run summarised from its journal and rank files, two runs compared, and
the report printed at the end of ``phoenix demo``. Pure: inputs are the records already read.

A run's *final state hash* is the coordinator's ``job_done.final_hash`` (SHA-256 over every rank's
:meth:`~phoenix_hpc.engines.base.Engine.state_hash` -- parameters and optimizer shards -- in logical-rank
order). Two runs of the same config reached an identical training state exactly when these are equal (the
correctness oracle of docs/design.md section 10). The *final loss* is the training loss of the last step as the
last pipeline stage computed it, averaged over that stage's data-parallel ranks (each rank's own
micro-batches, ``final_loss`` of ``RUN_DIR/ranks/rank{r}.json``); with equal micro-batch counts per rank this
mean is the loss of the whole global batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from phoenix_hpc.control import events as E

#: The recovery phases of ``recovery_done.phases``, in the order they happen.
PHASES = E.TIMED_PHASES


@dataclass
class RunSummary:
    """One run as the demo reports it. ``None`` where the run did not produce the value.

    ``recoveries``: the ``recovery_done`` records; ``joins``: ``recovery_plan.joins`` of every plan
    (``{world_rank, node, logical_rank, ...}``: a spare slot taking a logical rank); ``dead``: the
    ``slots_dead`` records; ``injections``: the ``inject_forwarded`` records (what was asked: wire kind and
    phase names, ``at_step``, ``target``); ``fired``: where injected faults landed (``inject_fired``
    records and ``RUN_DIR/faults/fired-*.json``: ``world_rank``, ``step``, ``phase``); ``transfers``: the
    state transfers of every recovery plan (``kind`` params|optimizer, ``shard_id``, ``sender``,
    ``receiver`` world ranks, ``step``).
    """

    run_dir: str
    job_id: str | None
    end_event: str | None
    steps: int | None
    final_hash: str | None
    final_loss: float | None
    loss_ranks: list[int]
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    joins: list[dict[str, Any]] = field(default_factory=list)
    dead: list[dict[str, Any]] = field(default_factory=list)
    fired: list[dict[str, Any]] = field(default_factory=list)
    injections: list[dict[str, Any]] = field(default_factory=list)
    transfers: list[dict[str, Any]] = field(default_factory=list)
    started_at: float | None = None
    ended_at: float | None = None

    @property
    def done(self) -> bool:
        """Whether the job ended with ``job_done`` (every active rank finished) and a final hash."""
        return self.end_event == E.JobDone.NAME and bool(self.final_hash)

    @property
    def wall_s(self) -> float | None:
        """Seconds from the coordinator's start to the job's end event."""
        if self.started_at is None or self.ended_at is None:
            return None
        return self.ended_at - self.started_at


END_EVENTS = tuple(E.JOB_END_STATES)


def final_loss(rank_summaries: Iterable[Mapping[str, Any]]) -> tuple[float | None, list[int]]:
    """Mean ``final_loss`` of the last pipeline stage's ranks, and those logical ranks (sorted).

    ``rank_summaries`` are the ``RUN_DIR/ranks/rank{r}.json`` objects (keys ``rank``, ``coord {pp, dp, tp}``,
    ``grid {tp, pp, dp}``, ``status``, ``final_loss``). Ranks that did not finish (``status != "done"``) or
    have no loss are left out; ``(None, [])`` when none is left.
    """
    done = [s for s in rank_summaries if s.get("status") == "done" and s.get("final_loss") is not None]
    if not done:
        return None, []
    last_pp = max(int(s["grid"]["pp"]) for s in done) - 1
    last = [s for s in done if int(s["coord"]["pp"]) == last_pp]
    if not last:
        return None, []
    return sum(float(s["final_loss"]) for s in last) / len(last), sorted(int(s["rank"]) for s in last)


def summarize_run(run_dir: str, job_id: str | None, records: Iterable[Mapping[str, Any]],
                  rank_summaries: Iterable[Mapping[str, Any]],
                  fired: Iterable[Mapping[str, Any]] = ()) -> RunSummary:
    """A :class:`RunSummary` from a run's journal records (in file order), its rank summaries and the
    landing records of its injected faults (:func:`phoenix_hpc.faults.trigger.read_fired`)."""
    records = list(records)
    end = next((r for r in records if r["event"] in END_EVENTS), None)
    started = next((r for r in records if r["event"] == E.CoordinatorStarted.NAME), None)
    loss, loss_ranks = final_loss(rank_summaries)
    joins: list[dict[str, Any]] = []
    transfers: list[dict[str, Any]] = []
    for r in records:
        if r["event"] == E.RecoveryPlanned.NAME:
            joins.extend(dict(j) for j in r.get("joins", []))
            transfers.extend(dict(t) for t in r.get("transfers", []))
    landed = {(f.get("request_id"), f.get("world_rank")): dict(f) for f in fired}
    for r in records:
        if r["event"] == E.InjectFired.NAME:
            landed.setdefault((r.get("request_id"), r.get("world_rank")), dict(r))
    return RunSummary(
        run_dir=run_dir, job_id=job_id, end_event=end["event"] if end else None,
        steps=end.get("step") if end else None,
        final_hash=end.get("final_hash") if end and end["event"] == E.JobDone.NAME else None,
        final_loss=loss, loss_ranks=loss_ranks,
        recoveries=[dict(r) for r in records if r["event"] == E.RecoveryDone.NAME],
        joins=joins,
        dead=[dict(r) for r in records if r["event"] == E.SlotsDead.NAME],
        fired=sorted(landed.values(), key=lambda f: float(f.get("ts", 0.0))),
        injections=[dict(r) for r in records if r["event"] == E.InjectForwarded.NAME],
        transfers=transfers,
        started_at=float(started["ts"]) if started else None,
        ended_at=float(end["ts"]) if end else None,
    )


@dataclass
class Verdict:
    """The comparison of the fault run against the fault-free reference.

    ``identical``: both runs ended with ``job_done`` and their final state hashes are equal.
    ``recovered``: the fault run has at least one ``recovery_done`` and every dead slot was replaced.
    ``problems``: human-readable reasons for a failed check (empty when everything passed).
    """

    identical: bool
    recovered: bool
    problems: list[str]

    @property
    def passed(self) -> bool:
        return self.identical and self.recovered and not self.problems


def compare(reference: RunSummary, fault: RunSummary) -> Verdict:
    """Check the fault run against the reference (see :class:`Verdict`)."""
    problems = []
    for name, run in (("fault-free reference", reference), ("node-loss run", fault)):
        if not run.done:
            problems.append(f"the {name} did not finish with job_done "
                            f"(end event: {run.end_event or 'none'}); see {run.run_dir}")
    identical = reference.done and fault.done and reference.final_hash == fault.final_hash
    if reference.done and fault.done and not identical:
        problems.append(f"final state hashes differ: {fault.final_hash} (node-loss run) vs "
                        f"{reference.final_hash} (fault-free reference)")
    if reference.steps is not None and fault.steps is not None and reference.steps != fault.steps:
        problems.append(f"the runs ended at different steps: {fault.steps} vs {reference.steps}")
    recovered = bool(fault.recoveries) and bool(fault.dead)
    if not fault.dead:
        problems.append("no slot of the node-loss run was seen dead: the fault did not land")
    elif not fault.recoveries:
        problems.append("the node-loss run has no finished recovery (recovery_done)")
    return Verdict(identical=identical, recovered=recovered, problems=problems)


def _kind(wire: str | None) -> str:
    from phoenix_hpc.faults.kinds import KIND_OF_WIRE

    return KIND_OF_WIRE.get(wire, wire or "?")


def _phase(wire: str | None) -> str:
    from phoenix_hpc.faults.kinds import PHASE_OF_WIRE

    return PHASE_OF_WIRE.get(wire, wire or "?")


def _s(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f} s"


def _loss(v: float | None) -> str:
    return "-" if v is None else f"{v:.6f}"


def format_report(reference: RunSummary, fault: RunSummary, verdict: Verdict, *, timeline: str | None,
                  fault_node: str | None = None, demo_wall_s: float | None = None) -> str:
    """The report printed at the end of the demo, as plain text (copyable; no colours)."""
    w = 28
    lines = ["", "=" * 78, "PHOENIX demo report", "=" * 78]

    def row(label: str, ref: str, flt: str) -> None:
        lines.append(f"{label:<{w}}{ref:<25}{flt}")

    row("", "fault-free reference", "node loss + hot swap")
    row("Slurm job", reference.job_id or "-", fault.job_id or "-")
    row("end", reference.end_event or "-", fault.end_event or "-")
    row("steps", str(reference.steps if reference.steps is not None else "-"),
        str(fault.steps if fault.steps is not None else "-"))
    row("job wall time", _s(reference.wall_s, 1), _s(fault.wall_s, 1))
    ranks = ",".join(str(r) for r in fault.loss_ranks or reference.loss_ranks)
    row(f"final loss (ranks {ranks})" if ranks else "final loss", _loss(reference.final_loss), _loss(fault.final_loss))
    if reference.final_loss is not None and fault.final_loss is not None:
        lines.append(f"{'  difference':<{w}}{abs(fault.final_loss - reference.final_loss):.3g}")
    lines.append("final state hash (SHA-256 of every rank's parameters and optimizer state):")
    lines.append(f"  {'reference':<{w - 2}}{reference.final_hash or '-'}")
    lines.append(f"  {'node-loss run':<{w - 2}}{fault.final_hash or '-'}")
    lines.append(f"{'identical final state':<{w}}{'YES: the hashes are equal' if verdict.identical else 'NO'}")
    lines.append("")
    for inj in fault.injections:
        target = ", ".join(f"{k} {v}" for k, v in (inj.get("target") or {}).items()) or "?"
        lines.append(f"{'fault injected':<{w}}{_kind(inj.get('kind'))} on {target} at step {inj.get('at_step')}, "
                     f"phase {_phase(inj.get('phase'))}")
        for f in fault.fired:
            if f.get("request_id") in (None, inj.get("request_id")):
                lines.append(f"{'  landed':<{w}}world rank {f.get('world_rank')} died at step {f.get('step')}, "
                             f"phase {_phase(f.get('phase'))}")
    for d in fault.dead:
        nodes = ", ".join(d.get("nodes") or []) or fault_node or "?"
        lines.append(f"{'detected':<{w}}world rank(s) {', '.join(str(s) for s in d.get('slots', []))} on "
                     f"{nodes} dead: {d.get('reason') or d.get('kind', '?')}")
    for j in fault.joins:
        coord = ",".join(str(c) for c in j.get("coord") or []) or "?"
        lines.append(f"{'hot swap':<{w}}spare world rank {j.get('world_rank')} on {j.get('node')} became logical "
                     f"rank {j.get('logical_rank')} (pp,dp,tp = {coord})")
    for t in fault.transfers:
        what = "parameters" if t.get("kind") == "params" else "optimizer shard"
        lines.append(f"{'  restored':<{w}}{what} {t.get('shard_id')} of step {t.get('step')}: world rank "
                     f"{t.get('sender')} -> {t.get('receiver')}")
    for rec in fault.recoveries:
        phases = rec.get("phases", {})
        lines.append(f"{'recovery':<{w}}{rec.get('action', '?')}, generation {rec.get('generation', '?')}, "
                     f"total {_s(rec.get('total_s'))}")
        for p in PHASES:
            lines.append(f"  {p:<{w - 2}}{_s(phases.get(p))}")
        other = None
        if rec.get("total_s") is not None and all(phases.get(p) is not None for p in PHASES):
            other = float(rec["total_s"]) - sum(float(phases[p]) for p in PHASES)
        if other is not None and other > 0.005:
            lines.append(f"  {'(quiesce and other)':<{w - 2}}{_s(other)}")
        lines.append(f"{'steps replayed':<{w}}{rec.get('steps_replayed', '-')} (resumed from committed step "
                     f"{rec.get('recoverable_step', '-')})")
    if not fault.recoveries:
        lines.append(f"{'recovery':<{w}}none finished")
    lines.append("")
    lines.append(f"{'timeline picture':<{w}}{timeline or '-'}")
    lines.append(f"{'run directories':<{w}}{reference.run_dir}")
    lines.append(f"{'':<{w}}{fault.run_dir}")
    if demo_wall_s is not None:
        lines.append(f"{'demo wall time':<{w}}{demo_wall_s:.0f} s")
    lines.append("=" * 78)
    if verdict.passed:
        lines.append("PASSED: a node was lost mid-run, a spare took its place, and training ended in exactly "
                     "the fault-free state.")
    else:
        lines.append("FAILED:")
        lines.extend(f"  - {p}" for p in verdict.problems)
    return "\n".join(lines)
