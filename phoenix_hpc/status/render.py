"""Rich rendering of a :class:`~phoenix_hpc.status.model.Status` for people (``phoenix status``).

:func:`status_renderable` builds the whole view (header, warnings, nodes, slots, replicas, recoveries,
faults and injections) as one rich renderable, so the same object serves a one-shot print and the
``--watch`` live display. Times are shown relative to the job's start (``t+12.3s``) or as ages.
"""

from __future__ import annotations

import time
from typing import Sequence

from rich.console import Group
from rich.table import Table
from rich.text import Text

from phoenix_hpc.control.events import TIMED_PHASES
from phoenix_hpc.status.metrics_sinks import metrics_text
from phoenix_hpc.status.model import AgreementRepair, Status
from phoenix_hpc.status.text import REPLAYED_MEANS, shorten

_STATE_STYLE = {"running": "green", "done": "green", "recovering": "yellow", "starting": "cyan",
                "pending": "cyan", "fallback": "red", "failed": "red", "stopped": "yellow", "ended": "red",
                "unknown": "dim"}
_SLOT_STYLE = {"active": "green", "standby": "cyan", "joining": "yellow", "quiesced": "yellow", "dead": "red",
               "done": "dim"}
PHASES = (TIMED_PHASES[0], "quiesce", *TIMED_PHASES[1:])  # quiesce: recovery_start -> recovery_plan


def _fmt_s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}s"


def _fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _fmt_age(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 120:
        return f"{s:.1f}s"
    if s < 7200:
        return f"{s / 60:.1f}min"
    return f"{s / 3600:.1f}h"


def _rel(ts: float | None, t0: float | None) -> str:
    if ts is None:
        return "-"
    return f"t+{ts - t0:.1f}s" if t0 is not None else time.strftime("%H:%M:%S", time.localtime(ts))


def _header(st: Status) -> Table:
    j = st.job
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("job", f"{j.job_id or '-'}  {j.name or ''}".rstrip())
    t.add_row("state", Text(j.state, style=_STATE_STYLE.get(j.state, "")).append(
        f"   (Slurm: {j.slurm_state or ('not reachable' if j.slurm_unreachable else 'no record')}" + (f", reason {j.slurm_reason}" if j.slurm_reason else "")
        + ")", style="dim"))
    t.add_row("run dir", j.run_dir)
    if j.grid:
        g = j.grid
        t.add_row("grid", f"tp={g['tp']} pp={g['pp']} dp={g['dp']} ({g['tp'] * g['pp'] * g['dp']} ranks), "
                          f"k={j.k if j.k is not None else '-'}")
    t.add_row("step", f"{step_text(st)}   committed {j.recoverable_step if j.recoverable_step is not None else '-'}"
                      f"   checkpoint {j.checkpoint_step if j.checkpoint_step is not None else '-'}"
                      f"   generation {j.generation}")
    if j.protect_every != 1:
        t.add_row("protection", f"every {j.protect_every} steps (adaptive: protection does not fit in one step's "
                                f"compute; a fault loses at most {2 * j.protect_every - 1} steps while m stays, "
                                f"at most 2 x resilience.protect_every_max - 1 in any case)")
    spares = "-" if st.spare_nodes_left is None else f"{st.spare_nodes_left} node(s), {st.spare_slots_left} slot(s)"
    t.add_row("spares left", spares)
    if j.node_list:
        from phoenix_hpc.hostlist import compress

        t.add_row("nodes", f"{compress(j.node_list)}   batch host {j.batch_host or '-'}")
    if len(st.run_jobs) > 1:
        for n, rj in enumerate(st.run_jobs):
            t.add_row("jobs" if n == 0 else "", run_job_line(rj))
    elif len(j.jobs) > 1:
        t.add_row("jobs", f"{', '.join(j.jobs)} (one run, resumed {len(j.jobs) - 1} time(s); this is the newest job)")
    if j.end_event:
        sig = f" [SIG{j.end_signal}]" if j.end_signal else ""
        t.add_row("ended", f"{j.end_event}{sig}{': ' + j.end_reason if j.end_reason else ''}")
    elif j.end_cause and st.finished:
        t.add_row("ended", f"by {j.end_cause} (no final record from the coordinator)")
    if j.final_hash:
        t.add_row("final hash", j.final_hash)
    if j.metrics:
        t.add_row("metrics", metrics_text(j.metrics))
    return t


def step_text(st: Status) -> str:
    """The live step as ``STEP/TOTAL``, how fresh it is while the job runs (``as of 0.4s ago``: the age of the
    newest record that gave it; a step asked for with ``--at-step`` must be ahead of it by the steps that
    pass meanwhile), and for a resumed job the checkpoint it resumed from and the steps trained since. Pure."""
    j = st.job
    out = ("-" if j.step is None else str(j.step)) + (f"/{j.steps_total}" if j.steps_total else "")
    notes = []
    if j.resume_step is not None:
        trained = None if j.step is None else j.step - j.resume_step
        notes.append(f"resumed from the checkpoint of step {j.resume_step}, "
                     + ("no step trained" if not trained else f"{trained} steps trained"))
    if j.step is not None and j.step_at is not None and not st.finished:
        notes.append(f"as of {_fmt_age(max(0.0, st.now - j.step_at))} ago")
    return out + (f" ({'; '.join(notes)})" if notes else "")


def run_job_line(rj) -> str:
    """One job of a run (:class:`phoenix_hpc.status.model.RunJobStatus`) as one line. Pure."""
    how = f"chain {rj.chain_index}, after {rj.after}" if rj.chain_index else "submitted"
    start = f"from checkpoint {rj.resume_step}" if rj.resume_step is not None else "from step 0"
    if rj.end in ("queued", "not started", "running"):
        state = rj.end + (f" ({rj.slurm_state})" if rj.slurm_state else "")
    else:
        state = f"ended by {rj.cause}" if rj.cause else rj.end
    reached = f", reached step {rj.last_step}" if rj.last_step is not None else ""
    lost = ""
    if rj.lost_steps is not None:
        lost = f", steps lost {rj.lost_steps}"
        if rj.committed_lost_steps is not None:
            lost += f" (committed {rj.committed_lost_steps})"
    return f"{rj.job_id}: {how}, {start}{reached}, {state}{lost}"


def _warnings(st: Status) -> Text | None:
    if not st.warnings:
        return None
    out = Text()
    for w in st.warnings:
        style = "yellow" if w.code in ("slurm", "placement", "pending", "journal") else "bold red"
        out.append(f"! {w.message}\n", style=style)
        if w.action:
            out.append(f"  -> {w.action}\n", style="bold")
    return out


def _nodes(st: Status) -> Table:
    t = Table(title="Nodes", title_justify="left")
    for c in ("node", "Slurm state", "role", "domain", "in job", "slots"):
        t.add_column(c)
    for n in st.nodes:
        style = {"lost": "red", "spare": "cyan", "active": "green"}.get(n.role, "")
        t.add_row(n.name, n.slurm_state or "-", Text(n.role, style=style), n.domain or "-",
                  "yes" if n.in_job else "no", ",".join(map(str, n.slots)) or "-")
    return t


def _slots(st: Status) -> Table:
    t = Table(title="Slots", title_justify="left")
    for c in ("world", "node", "pid", "state", "logical", "coord (pp,dp,tp)", "gen", "note"):
        t.add_column(c)
    for s in st.slots:
        t.add_row(str(s.world_rank), s.node, str(s.pid or "-"), Text(s.state, style=_SLOT_STYLE.get(s.state, "")),
                  "-" if s.logical_rank is None else str(s.logical_rank),
                  "-" if s.coord is None else ",".join(map(str, s.coord)),
                  "-" if s.generation is None else str(s.generation), s.note)
    return t


def _replicas(st: Status) -> Table:
    k = st.job.k
    src = {r.source for r in st.replicas}
    title = "Replicas"
    if src == {"planned"}:  # the journal does not name the holders: they are computed from the config
        title += (" (holders: the placement planned from the config; committed: as the ranks reported)"
                  if st.commits else " (placement planned from the config; no commit reported yet)")
    with_bytes = any(r.bytes_ is not None for r in st.replicas)
    t = Table(title=title, title_justify="left")
    for c in ("shard", "owner", "holders", f"live/{k if k else '?'}", "verified (domains)", "committed",
              *(("bytes",) if with_bytes else ()), "last commit"):
        t.add_column(c)
    for r in st.replicas:
        owner = Text(f"{r.owner_rank}@{r.owner_node or '?'}", style="" if r.owner_alive else "red")
        hs = Text()
        for i, h in enumerate(r.holders):
            if i:
                hs.append(", ")
            dom = f" [{h.domain}]" if h.domain and h.domain != h.node else ""
            step = f" s{h.step}" if h.step is not None else ""
            hs.append(f"{h.logical_rank}@{h.node or '?'}{dom}{step}", style="" if h.alive else "red")
        live = Text(str(r.live_holders), style="red" if k and r.live_holders < k else "green")
        if r.verified_replicas is None:
            ver = Text("-")
        else:
            ver = Text(f"{r.verified_replicas}" + (f" ({', '.join(r.verified_domains)})" if r.verified_domains else ""),
                       style="red" if k and r.verified_replicas < k else "green")
        t.add_row(r.shard_id, owner, hs if r.holders else "-", live, ver,
                  "-" if r.committed_step is None else str(r.committed_step),
                  *((_fmt_bytes(r.bytes_),) if with_bytes else ()),
                  _fmt_age(r.age_s) + (" ago" if r.age_s is not None else ""))
    return t


def _phase(r, name: str) -> float | None:
    return r.quiesce_s if name == "quiesce" else r.phases.get(name)


def _recoveries(st: Status) -> Table:
    t0 = st.job.started_at
    t = Table(title="Recoveries", title_justify="left", caption=REPLAYED_MEANS, caption_justify="left")
    for c in ("gen", "action", "state", "start", *PHASES, "other", "total", "replayed", "joins"):
        t.add_column(c)
    for r in st.recoveries:
        joins = ", ".join(f"{j.get('world_rank')}->{j.get('logical_rank')}@{j.get('node')}" for j in r.joins)
        t.add_row(str(r.generation), r.action or "-", r.state, _rel(r.started_at, t0),
                  *(_fmt_s(_phase(r, p)) for p in PHASES), _fmt_s(r.other_s),
                  _fmt_s(r.total_s), "-" if r.steps_replayed is None else str(r.steps_replayed), joins or "-")
    return t


def _faults(st: Status) -> Table:
    t0 = st.job.started_at
    t = Table(title="Faults", title_justify="left")
    for c in ("when", "kind", "source", "slot", "node", "step", "phase", "detail"):
        t.add_column(c)
    for f in st.faults:
        t.add_row(_rel(f.ts, t0), f.kind, f.source, "-" if f.world_rank is None else str(f.world_rank),
                  f.node or "-", "-" if f.step is None else str(f.step), f.phase or "-", shorten(f.message, 100))
    return t


def _injections(st: Status) -> Table:
    t0 = st.job.started_at
    t = Table(title="Injected faults", title_justify="left")
    for c in ("when", "request", "kind", "at step", "phase", "targets", "landed"):
        t.add_column(c)
    for i in st.injections:
        landed = ", ".join(f"w{f['world_rank']} step {f['step']} {f['phase']}" for f in i.fired)
        if i.state == "refused":
            landed = f"[red]refused[/red]: {i.reason}"
        elif i.missed:
            landed = "; ".join([landed] * bool(landed) + [f"[red]missed[/red] w{m['world_rank']}: {m['reason']}"
                                                          for m in i.missed])
        elif not landed:
            landed = "armed, not yet" if i.state == "armed" else "not confirmed yet"
        if i.outcome:
            landed += f"; {i.outcome}"
        t.add_row(_rel(i.ts, t0), i.request_id, i.kind, "-" if i.at_step is None else str(i.at_step), i.phase,
                  ",".join(map(str, i.targets)) or "-", landed)
    return t


def _drains(st: Status) -> Table:
    t0 = st.job.started_at
    t = Table(title="Planned drains", title_justify="left")
    for c in ("when", "request", "nodes", "targets", "at step", "state", "replayed", "moved / reason"):
        t.add_column(c)
    for d in st.drains:
        what = ", ".join(f"w{a}->w{b} (rank {r})" for a, b, r in d.moved) if d.state == "done" else (d.reason or "-")
        state = f"[red]{d.state}[/red]" if d.state in ("refused", "missed") else d.state
        t.add_row(_rel(d.ts, t0), d.request_id, ",".join(d.nodes) or "-", ",".join(map(str, d.targets)) or "-",
                  "-" if d.at_step is None else str(d.at_step), state,
                  "-" if d.steps_replayed is None else str(d.steps_replayed), shorten(what, 100))
    return t


def status_line(st: Status) -> str:
    """One line of the job's progress, for ``--watch`` into a pipe: time since start, state, step, committed
    and checkpoint steps, generation, spares left, recoveries and faults so far."""
    j = st.job
    rec = st.recoveries[-1] if st.recoveries else None
    parts = [_rel(st.now, j.started_at), j.state + (f" (Slurm: {j.slurm_state})" if j.slurm_state else ""),
             f"step {'-' if j.step is None else j.step}{f'/{j.steps_total}' if j.steps_total else ''}",
             f"committed {'-' if j.recoverable_step is None else j.recoverable_step}",
             f"checkpoint {'-' if j.checkpoint_step is None else j.checkpoint_step}",
             f"generation {j.generation}"]
    if st.spare_nodes_left is not None:
        parts.append(f"spares {st.spare_nodes_left}")
    if rec is not None:
        parts.append(f"recoveries {len(st.recoveries)} (last: gen {rec.generation} {rec.state}"
                     + (f" {rec.total_s:.2f}s" if rec.total_s is not None else "") + ")")
    if st.faults:
        parts.append(f"faults {len(st.faults)}")
    if st.drains:
        parts.append(f"drains {len(st.drains)} (last: {st.drains[-1].state})")
    if st.shrinks:
        parts.append(f"shrinks {len(st.shrinks)} (dp {st.shrinks[0]['dp_from']} -> {st.shrinks[-1]['dp_to']})")
    if st.agreement or st.repairs:
        parts.append(agreement_text(st.agreement, st.repairs))
    return "  ".join(parts)


def agreement_text(a: dict, repairs: Sequence[AgreementRepair] = ()) -> str:
    """The replica agreement of :attr:`Status.agreement` in words: the DP peers' parameter digests compared,
    up to which step, how many sets differed, how many of those differences were repaired from memory
    (``repairs``: :attr:`Status.repairs`) and whether a second difference stopped the job, digests refused;
    or why nothing is compared (``resilience.replica_agreement: false``, or dp = 1)."""
    if a.get("off"):
        return f"agreement: off ({a['off']})"
    if a.get("undetectable"):
        return f"agreement: undetectable ({a['undetectable']})"
    text = f"agreement: {a.get('checked') or 0} checks"
    if a.get("last_step") is not None:
        text += f" (to step {a['last_step']})"
    text += f", {a.get('disagreed') or 0} differed"
    if repairs:
        text += f", {sum(r.state == 'repaired' for r in repairs)} repaired from memory"
        second = [r for r in repairs if r.stop and r.stop.get("second")]
        if second:
            text += f", stopped: a second difference at step {second[0].step}"
    if a.get("rejected"):
        text += f", {a['rejected']} digest report(s) rejected"
    return text


def repair_outcome(r: AgreementRepair, finished: bool) -> str:
    """What became of one difference, in words (``finished``: the job has ended). Pure."""
    if r.state == "repaired":
        return f"repaired from memory ({r.action or 'recovery'}, generation {r.recovery_generation})"
    if r.state == "repairing":
        return f"repairing ({r.action or 'recovery'}, generation {r.recovery_generation})"
    if r.state == "decided":
        return f"{r.action or 'recovery'} decided"
    if r.state == "fallback":
        return "not repaired from memory: fell back to the persistent checkpoint"
    if r.state == "stopped":
        st = r.stop or {}
        ck = st.get("checkpoint_step")
        text = ("stopped: second difference at this step after its rollback and replay" if st.get("second")
                else f"stopped: {st.get('reason') or 'clean stop'}")
        return text + ("; restart from the checkpoint of step " + str(ck) if ck is not None else
                       "; no checkpoint vouched for" if st.get("message") is not None else "")
    return "not repaired (found after the job's end)" if finished else "found, no decision yet"


def _repairs(st: Status) -> Table:
    t0 = st.job.started_at
    t = Table(title="Replica agreement: differences and repairs from memory", title_justify="left")
    for c in ("when", "step", "pp,tp", "gen", "suspects (logical->world)", "majority", "outcome", "restored step",
              "replayed"):
        t.add_column(c)
    for r in st.repairs:
        world = dict(zip(r.suspects, r.suspect_world_ranks)) if len(r.suspect_world_ranks) == len(r.suspects) else {}
        sus = ", ".join(f"{x}->{world[x]}" if x in world else str(x) for x in r.suspects)
        out = repair_outcome(r, st.finished)
        style = "green" if r.state == "repaired" else "red" if r.state in ("stopped", "fallback") else "yellow"
        t.add_row(_rel(r.ts, t0), str(r.step), "-" if r.pp is None else f"{r.pp},{r.tp}",
                  "-" if r.generation is None else str(r.generation), sus or "-",
                  ", ".join(map(str, r.majority)) or ("none" if r.suspects else "-"), Text(out, style=style),
                  "-" if r.restored_step is None else str(r.restored_step),
                  "-" if r.steps_replayed is None else str(r.steps_replayed))
    return t


def _shrinks(st: Status) -> Table:
    t0 = st.job.started_at
    t = Table(title="Shrinks (spares exhausted or drain --shrink)", title_justify="left")
    for c in ("when", "generation", "dp", "recoverable step", "lost or drained slots", "back to standby", "drain"):
        t.add_column(c)
    for x in st.shrinks:
        t.add_row(_rel(x["ts"], t0), str(x["generation"]), f"{x['dp_from']} -> {x['dp_to']}",
                  str(x["recoverable_step"]), ",".join(map(str, x["lost"])) or "-",
                  ",".join(map(str, x["freed"])) or "-", x["drain"] or "-")
    return t


def status_renderable(st: Status) -> Group:
    """The full human view of ``st``; empty sections are left out."""
    parts: list = [_header(st)]
    w = _warnings(st)
    if w is not None:
        parts.append(w)
    if st.nodes:
        parts.append(_nodes(st))
    if st.slots:
        parts.append(_slots(st))
    if st.replicas:
        parts.append(_replicas(st))
    if st.recoveries:
        parts.append(_recoveries(st))
    if st.faults:
        parts.append(_faults(st))
    if st.injections:
        parts.append(_injections(st))
    if st.drains:
        parts.append(_drains(st))
    if st.shrinks:
        parts.append(_shrinks(st))
    if st.repairs:
        parts.append(_repairs(st))
    if st.agreement or st.repairs:
        parts.append(Text(agreement_text(st.agreement, st.repairs),
                          style="red" if st.agreement.get("disagreed") or st.repairs else ""))
    if st.journal_records == 0:
        parts.append(Text("(no journal yet: the coordinator has not started)", style="dim"))
    return Group(*parts)
