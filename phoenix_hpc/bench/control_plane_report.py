"""The control-plane benchmark's analysis and report: scaling laws, goals, the BENCHMARKS section, the
capacity table.

- :func:`analyse`: every measured figure fitted against the rank count with
  :func:`phoenix_hpc.model.fit.fit_scaling` (the code behind ``phoenix model fit``: constant, linear, log
  and power laws ranked by AIC(c)) and extrapolated to 100,000 ranks; the coordinator's CPU per message
  (:func:`phoenix_hpc.control.capacity.fit_cpu_line`); the goals at the largest rank count.
- :func:`section_lines`: the "Control plane at scale" section of BENCHMARKS.md.
- :func:`update_benchmarks`: keeps the results as ``benchmarks/control_plane.json`` (read by every later
  report) and under ``control_plane`` in BENCHMARKS.json, re-renders BENCHMARKS.md, and writes the capacity
  table :mod:`phoenix_hpc.control.capacity_table` that ``phoenix submit`` judges jobs by.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SECTION_TITLE = "## 5. Control plane at scale"
TARGET_RANKS = 100_000
GOALS = {"detect_exit_s": 2.0, "plan_deliver_s": 1.0, "coordinator_cores": 1.0}

#: (key in a run, what it is, unit) of the figures fitted against the rank count
FITTED = (("heartbeat_age_p99_s", "heartbeat age at handling, p99", "s"),
          ("coordinator_cores", "coordinator CPU", "cores"),
          ("detect_exit_s", "detection after a process exit", "s"),
          ("plan_deliver_s", "plan made and pushed to every member", "s"),
          ("quiesce_s", "quiesce (every survivor answered)", "s"))


def derived(run: dict[str, Any]) -> dict[str, Any]:
    """A run with the derived figures added: ``heartbeat_age_p99_s`` and ``plan_deliver_s`` (= plan_s +
    the push to every member's queue, journalled as ``recovery_plan_sent``)."""
    out = dict(run)
    if run.get("heartbeat_age_p99_ms") is not None:
        out["heartbeat_age_p99_s"] = run["heartbeat_age_p99_ms"] / 1e3
    if run.get("plan_s") is not None and run.get("plan_delivered_s") is not None:
        out["plan_deliver_s"] = round(run["plan_s"] + run["plan_delivered_s"], 4)
    return out


def analyse(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Scaling laws (best by AIC(c), prediction at 100k ranks with its 95 % interval), the CPU line and the
    goals at the largest run. A figure with fewer than 3 positive values is not fitted (``"not fitted"``)."""
    from phoenix_hpc.control.capacity import fit_cpu_line
    from phoenix_hpc.errors import ModelError
    from phoenix_hpc.model.fit import fit_scaling

    rows = [derived(r) for r in runs]
    ok = [r for r in rows if not r.get("error")]  # a failed run's figures are not fitted
    fits: dict[str, Any] = {}
    for key, what, unit in FITTED:
        pts = [(r["ranks"], r[key]) for r in ok if isinstance(r.get(key), (int, float)) and r[key] > 0]
        if len(pts) < 3:
            fits[key] = {"what": what, "unit": unit, "not_fitted": f"{len(pts)} positive value(s), 3 needed"}
            continue
        try:
            res = fit_scaling([p[0] for p in pts], [p[1] for p in pts], (TARGET_RANKS,))
        except ModelError as exc:
            fits[key] = {"what": what, "unit": unit, "not_fitted": str(exc)}
            continue
        best = res.law(res.best)
        pred = best.predictions[0]
        fits[key] = {"what": what, "unit": unit, "law": best.law, "formula": best.formula,
                     "params": {k: float(f"{v:.6g}") for k, v in best.params.items()}, "r2": round(best.r2, 4),
                     "criterion": res.criterion, "runner_up": res.runner_up,
                     "evidence_ratio": None if res.evidence_ratio == float("inf") else round(res.evidence_ratio, 2),
                     "at_100k": round(pred.seconds, 4), "at_100k_low": round(pred.low, 4),
                     "at_100k_high": round(pred.high, 4),
                     "all_laws_at_100k": {lf.law: round(lf.predictions[0].seconds, 4) for lf in res.laws}}
    cpu = None
    pairs = [((r.get("handled_heartbeats_per_s") or 0) + (r.get("sent_commits_per_s") or 0), r["coordinator_cores"])
             for r in ok if r.get("coordinator_cores") is not None]
    if len(pairs) >= 2:
        try:
            cost, idle = fit_cpu_line([p[0] for p in pairs], [p[1] for p in pairs])
            cpu = {"cpu_s_per_message": float(f"{cost:.4g}"), "idle_cores": round(idle, 4),
                   "max_messages_per_s": round((1 - idle) / cost) if cost > 0 and idle < 1 else None,
                   "max_ranks": max(r["slots"] for r in ok)}
        except ValueError as exc:
            cpu = {"not_fitted": str(exc)}
    valid = [r for r in rows if not r.get("error")]
    top = max(valid, key=lambda r: r["ranks"]) if valid else {}
    goals = {}
    for key, limit in GOALS.items():
        v = top.get(key)
        goals[key] = {"limit": limit, "value": v, "met": None if v is None else v <= limit}
    return {"fits": fits, "cpu": cpu, "goals_at": top.get("ranks"), "goals": goals}


def findings(result: dict[str, Any]) -> list[str]:
    """Sentences on the goals at the largest rank count: met, or missed and what the measurements say
    dominates."""
    a = result.get("analysis") or {}
    rows = [derived(r) for r in result.get("runs", [])]
    out = [f"run at {r['ranks']} ranks not usable: {r['error']}" for r in rows if r.get("error")]
    rows = [r for r in rows if not r.get("error")]
    if not rows:
        return out
    top = max(rows, key=lambda r: r["ranks"])
    n = top["ranks"]
    g = a.get("goals", {})
    d = g.get("detect_exit_s", {})
    if d.get("value") is not None:
        verdict = "met" if d["met"] else "MISSED"
        why = ""
        if not d["met"] and top.get("heartbeat_age_p99_ms") is not None:
            why = (f"; what dominates: the coordinator's loop reads closed connections between inbox batches, and "
                   f"its inbox was {top['heartbeat_age_p99_ms'] / 1e3:.2f} s behind (heartbeat age p99)")
        out.append(f"detection after a process exit at {n} ranks: {d['value']:.3f} s (goal <= 2 s: {verdict}){why}; "
                   f"silence is found {top.get('detect_silence_s')} s after the last heartbeat "
                   f"(heartbeat_timeout_s 10 s plus the inbox backlog, heartbeat age p99 "
                   f"{_fmt((top.get('heartbeat_age_p99_ms') or 0) / 1e3)} s)")
    p = g.get("plan_deliver_s", {})
    if p.get("value") is not None:
        verdict = "met" if p["met"] else "MISSED"
        dom = max((("planning (plan_recovery)", top.get("plan_s") or 0),
                   ("pushing the signed plan into every member's queue", top.get("plan_delivered_s") or 0)),
                  key=lambda x: x[1])
        out.append(f"recovery plan made and pushed to all {n} members: {p['value']:.3f} s (goal <= 1 s: {verdict}); "
                   f"the larger part: {dom[0]} ({dom[1]:.3f} s); before it, the quiesce round took "
                   f"{top.get('quiesce_s')} s (every survivor answering)")
    elif top.get("recovery_error"):
        out.append(f"recovery plan at {n} ranks: not measured ({top['recovery_error']})")
    c = g.get("coordinator_cores", {})
    if c.get("value") is not None:
        verdict = "met" if c["met"] else "MISSED"
        out.append(f"coordinator CPU at {n} ranks: {c['value']:.2f} cores (goal < 1 core: {verdict}) while handling "
                   f"{_fmt(top.get('handled_heartbeats_per_s'))} slot heartbeats/s in "
                   f"{_fmt(top.get('handled_messages_per_s'))} node messages/s (simulators sent "
                   f"{_fmt(top.get('sent_messages_per_s'))}/s of a nominal {_fmt(top.get('nominal_messages_per_s'))}/s, "
                   f"{top.get('slots_per_node', '-')} slots per node) carrying "
                   f"{_fmt(top.get('carried_commits_per_s', top.get('sent_commits_per_s')))} commit reports/s"
                   + ("" if c["met"] else "; what dominates: one store round trip (queue_pop), one JSON decode and "
                      "one HMAC per node message, and per slot entry a dictionary update, in a single Python loop"))
    sent, handled = top.get("sent_heartbeats_per_s"), top.get("handled_heartbeats_per_s")
    if sent and handled is not None and handled < 0.95 * sent:
        out.append(f"at {n} ranks the coordinator did NOT keep up: it handled {handled:,.0f} of the {sent:,.0f} "
                   f"heartbeats/s sent (heartbeat age p50 {_fmt(top.get('heartbeat_age_p50_ms'))} ms) at "
                   f"{_fmt(top.get('coordinator_cores'))} cores: the simulators ran on the same cores, so it did not get a "
                   "whole core; the quiesce round (every survivor answering through the same inbox) took "
                   f"{_fmt(top.get('quiesce_s'))} s")
    if n < 16000:
        out.append(f"the goals are set at 16,000 ranks; the largest usable run here had {n}, so the goals above are "
                   "judged at that size")
    cpu = a.get("cpu") or {}
    if cpu.get("cpu_s_per_message"):
        out.append(f"coordinator CPU per slot heartbeat (its share of the node's message, commit included): "
                   f"{cpu['cpu_s_per_message'] * 1e6:.1f} us (line through the runs, idle {cpu['idle_cores']:.3f} "
                   f"cores): one core serves about {cpu['max_messages_per_s']:,} slot heartbeats/s")
    return out


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def load_sentence(result: dict[str, Any], cpus) -> str:
    """What the machine's 1-minute load average was around the run, and what it means when it exceeds the
    logical CPUs (pure); empty for runs that did not record it."""
    la = result.get("load_avg_1m") or {}
    if la.get("before") is None:
        return ""
    busy = isinstance(cpus, int) and max(la["before"], la.get("after") or 0) > cpus
    return (f"Load average (1 min) {la['before']:g} at the start and {la.get('after', 0):g} at the end"
            + (f", above the {cpus} logical CPUs: other work shared the machine, so every time below is longer "
               "than on a quiet host; compare the sizes with each other (same run), not with other runs. "
               if busy else ". "))


def section_lines(result: dict[str, Any]) -> list[str]:
    """The BENCHMARKS.md section (lines, ending with a blank line)."""
    from phoenix_hpc.bench.control_plane import table

    m = result.get("machine", {})
    a = result.get("analysis", {})
    L = [SECTION_TITLE, "",
         f"Run: {result.get('date')}, {result.get('wall_s')} s wall, `scripts/bench-control-plane "
         f"--ranks {','.join(str(r['ranks']) for r in result.get('runs', []))}`; {m.get('cpu')}, "
         f"{m.get('logical_cpus')} logical CPUs, Python {m.get('python')}, torch {m.get('torch')}. "
         + load_sentence(result, m.get("logical_cpus")) +
         "The real coordinator process (`python -m phoenix_hpc.control.coordinator`, default timings: heartbeat "
         "every 1 s, timeout 10 s) against simulated slots (`phoenix_hpc/bench/ctlsim.py`: many per process, "
         "the real signed messages on the real TCPStore keys and one liveness connection each; N active ranks "
         f"on dp = N, {(result.get('runs') or [{}])[0].get('slots_per_node', 4)} per node, plus 2 spare nodes; "
         "each node sends one `heartbeats` message per interval for its slots, which carries each active "
         "slot's newest commit report, a new step every "
         f"{result['runs'][0]['step_s'] if result.get('runs') else '-'} s). Simulators and coordinator share "
         "this machine's cores, so the simulators' achieved rate is shown next to the nominal one.", "",
         table(result.get("runs", [])), "",
         "*hb age*: a heartbeat's age when its handler runs (coordinator time minus the `sent_at` in the signed "
         "body; worst p99 of the 2 s journal windows). *coord cores*: the coordinator process's CPU time over "
         "wall time in the steady window (all threads, the TCPStore server included). *detect exit*: a spare's "
         "liveness connection closed -> `slots_dead`; *detect silence*: a spare stops heartbeating -> "
         "`slots_dead`. *quiesce*: `recovery_start` -> `recovery_plan` after an active rank exited; *plan*: "
         "`plan_recovery`; *plan pushed*: plan journalled -> the signed `recover` in every member's queue; "
         "*read by all*: -> the last simulated member read it (a simulated slot reads its queue when its "
         "doorbell rings, as a real one does; the simulators' own CPU share is in this figure). *register*: "
         "the longest time a simulator process waited from its first `register` request to its last answer "
         "(every request sent at once; the coordinator journals each with one `fsync` per batch of messages; "
         "the run directory is on disk, like a job's).", ""]
    fits = a.get("fits", {})
    if fits:
        L += ["Scaling laws (`phoenix_hpc.model.fit.fit_scaling`, the code of `phoenix model fit`: constant, "
              "linear, log and power laws ranked by AIC; "
              f"{len({r['ranks'] for r in result.get('runs', []) if not r.get('error')})} sizes are a thin basis, "
              "so every law's value at 100k is listed):", "",
              "| figure | best law | parameters | R^2 | at 100k ranks [95 % PI] | other laws at 100k |",
              "| --- | --- | --- | --- | --- | --- |"]
        for key, f in fits.items():
            if "not_fitted" in f:
                L.append(f"| {f['what']} ({f['unit']}) | not fitted: {f['not_fitted']} | | | | |")
                continue
            others = ", ".join(f"{k} {_fmt(v)}" for k, v in f["all_laws_at_100k"].items() if k != f["law"])
            params = ", ".join(f"{k}={v:.4g}" for k, v in f["params"].items())
            L.append(f"| {f['what']} ({f['unit']}) | {f['law']}: {f['formula']} | {params} | {_fmt(f['r2'])} | "
                     f"{_fmt(f['at_100k'])} [{_fmt(f['at_100k_low'])}, {_fmt(f['at_100k_high'])}] | {others} |")
        L.append("")
    for line in findings(result):
        L.append(f"- {line}")
    cpu = a.get("cpu") or {}
    if cpu.get("cpu_s_per_message"):
        L += ["", f"`phoenix submit` judges a job's heartbeat load by these numbers "
                  f"(`phoenix_hpc/control/capacity_table.py`, written by this run): exit 2 when the heartbeats "
                  f"alone would need a whole core ({cpu['max_messages_per_s']:,} slot heartbeats/s), a warning above half "
                  "a core or beyond the simulated rank counts."]
    return L + [""]


def capacity_table_source(result: dict[str, Any]) -> str:
    """The text of ``phoenix_hpc/control/capacity_table.py`` for a result with a fitted CPU line; its
    ``source`` cites the run, the BENCHMARKS.md section by its heading and the kept record.

    Raises:
        ValueError: the result has no fitted CPU line.
    """
    from phoenix_hpc.bench.report import CONTROL_PLANE_RECORD

    cpu = (result.get("analysis") or {}).get("cpu") or {}
    if not cpu.get("cpu_s_per_message"):
        raise ValueError("no coordinator CPU line was fitted; the capacity table is left as it is")
    m = result.get("machine", {})
    ranks = ",".join(str(r["ranks"]) for r in result.get("runs", []))
    table = {"cpu_s_per_message": cpu["cpu_s_per_message"], "idle_cores": cpu["idle_cores"],
             "max_ranks": cpu["max_ranks"],
             "source": f"control-plane benchmark of {result.get('date')} (scripts/bench-control-plane --ranks "
                       f"{ranks}; {m.get('cpu')}, {m.get('logical_cpus')} logical CPUs; commit "
                       f"{result.get('commit', 'not recorded')}): BENCHMARKS.md \"{SECTION_TITLE.lstrip('# ')}\", "
                       f"record {CONTROL_PLANE_RECORD}"}
    return ('"""The coordinator\'s measured message capacity (generated by ``scripts/bench-control-plane '
            '--update-benchmarks``; do not edit by hand).\n\n'
            'Read by :mod:`phoenix_hpc.control.capacity`; ``source`` names the run the numbers come from.\n"""\n\n'
            f"MEASURED = {json.dumps(table, indent=4)}\n")


def update_benchmarks(folder: Path, result: dict[str, Any], table: Path | None = None) -> None:
    """:func:`phoenix_hpc.bench.report.keep_record`: keep ``result`` as ``folder``/:data:`phoenix_hpc.bench.report.CONTROL_PLANE_RECORD` (read by every later
    report, whatever folder a full run writes to) and under ``control_plane`` in ``folder/BENCHMARKS.json``,
    re-render ``folder/BENCHMARKS.md`` from that JSON (the other sections' numbers unchanged, the GPU reports
    kept now; every section's code checked against the repository's HEAD now), and write the capacity table, which cites this section
    (``table``, default the package's ``phoenix_hpc/control/capacity_table.py``). A folder without
    BENCHMARKS.json gets one holding this section alone."""
    from phoenix_hpc.bench import report

    report.keep_record(folder, "control_plane", result)
    try:
        src = capacity_table_source(result)
    except ValueError:
        return
    report._atomic_text(Path(table) if table else repo / "phoenix_hpc" / "control" / "capacity_table.py", src)
