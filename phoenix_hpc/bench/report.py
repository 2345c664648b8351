"""Report writers of the benchmarks: ``BENCHMARKS.json`` (every raw number), ``BENCHMARKS.md`` (tables)
and one PNG per section under ``benchmarks/`` (matplotlib, Agg backend, written atomically).

:func:`render_markdown` is pure (results dict -> text); :func:`write_all` writes the files, each to a
temporary name first and renamed, so a crash never leaves a half-written report.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

from phoenix_hpc.bench import provenance
from phoenix_hpc.bench.cpu_demand import demand_sentence
from phoenix_hpc.control.events import TIMED_PHASES

PLOT_DIR = "benchmarks"
PHOENIX_PHASES = TIMED_PHASES
BASELINE_PHASES = ("detect", "teardown", "relaunch", "init", "load", "replay")


def _atomic_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def _f(x, nd: int = 2, unit: str = "") -> str:
    if x is None:
        return "n/a"
    if isinstance(x, (int, float)):
        return f"{x:.{nd}f}{unit}"
    return str(x)


def _mib(b) -> str:
    return "n/a" if b is None else f"{b / 2**20:.2f}"


def _count(v) -> str:
    """A median count (may be x.5), or "n/a": not recorded (runs before it was) or no engine thread."""
    return "n/a" if v is None else f"{v:g}"


def _by_k(d) -> list:
    """Items of a dict keyed by K (strings once read back from JSON) in numeric order."""
    return sorted((d or {}).items(), key=lambda kv: int(kv[0]))


def _errors(items) -> list[str]:
    return [f"`{i.get('name', '?')}`: {i['error']}" for i in items if isinstance(i, dict) and "error" in i]


def unattributed(h: dict) -> float:
    """Seconds of a hot swap's journal total not covered by its five phases (pure)."""
    return h["total_s"] - sum(h["phases"].get(p, 0.0) for p in PHOENIX_PHASES)


#: section 1's note on replica agreement's cost (docs/design.md section 6, *Cost*) while no run of
#: ``python -m phoenix_hpc.bench.agreement_overhead`` is kept (:data:`AGREEMENT_RECORD`)
AGREEMENT_COST = ("Replica agreement (docs/design.md section 6) is not measured on its own in this run (`scripts/bench-agreement`"
                  " measures it with resilience.replica_agreement on and off and keeps its run for this page): from"
                  " commit `f889c53` on it is part of every protected step, so the on/off ratios of a run from then on "
                  "include it. Its work per commit is one XXH3-64 over the parameter tensors' checksums the D2H copy "
                  "computes anyway, 16 bytes more per (pp, tp) stage in the commit fence's all-reduce (from commit "
                  "`370340f` on; not measured), at most 1.8 KB more per commit report, and the coordinator's "
                  "comparison; measured "
                  "alone, those are microseconds per step (design section 6, *Cost*), below what the step time's spread"
                  " here resolves.")


def _trim_percent(ag: dict) -> str:
    """The share of each mode's slowest steps the agreement run trimmed (its ``--trim``), in words."""
    trim = (ag.get("analysis") or {}).get("trim")
    return f"{100 * trim:g} %" if isinstance(trim, (int, float)) else "a share (not recorded)"


def agreement_lines(r: dict, provenance_lines) -> list[str]:
    """Section 1's part on replica agreement (pure; ``provenance_lines(key)``: the lines saying which commit
    section ``key`` measured and whether its code changed since): the kept run of :mod:`phoenix_hpc.bench.agreement_overhead` (the step time with the check
    on and off in one run), or :data:`AGREEMENT_COST` when none is kept."""
    from phoenix_hpc.bench.agreement_overhead import summary_lines

    ag = r.get("agreement_overhead")
    if not isinstance(ag, dict) or "analysis" not in ag:
        return [AGREEMENT_COST]
    L = ["### Replica agreement on and off", ""] + list(provenance_lines("agreement_overhead"))
    L += [f"Measured by its own command on {ag.get('date')}: `{ag.get('command')}` (commit `{ag.get('commit')}`, "
          f"{ag.get('wall_s')} s). {ag.get('ranks')} ranks started by `mpirun` on this host (dp = {ag.get('ranks')}, "
          f"k = 1, model {ag.get('size')}, {ag.get('params', 0) / 1e6:.2f} M parameters, sequence length "
          f"{ag.get('seq_length')}, global batch {ag.get('global_batch')}, checksum {ag.get('checksum')}); every "
          f"block protected, replica agreement on and off (`resilience.replica_agreement`) alternating in "
          f"{ag.get('rounds')} ABBA pairs of {ag.get('block_steps')}-step blocks inside the same processes; "
          f"cleaning as above (first step of every block dropped, slowest {_trim_percent(ag)} of each mode trimmed, the job's "
          "step time the slowest rank's); ratio of means with a 95 % bootstrap CI. The coordinator's comparison "
          "is not in it (measured alone: docs/design.md section 6, *Cost*).", ""]
    L += [f"- {x}" for x in summary_lines(ag)]
    return L + [""]


def thread_nice_sentence(cases: list[dict]) -> str:
    """What ``resilience.thread_nice`` the protected blocks ran with (pure): one value for every case, the
    values per case, or that the run did not record it (runs before it was recorded)."""
    vals = {c["name"]: c.get("thread_nice") for c in cases}
    if any(v is None for v in vals.values()):
        return "The background threads' nice increment (`resilience.thread_nice`) was not recorded in this run."
    if len(set(vals.values())) == 1:
        v = next(iter(vals.values()))
        return (f"The copy and H2H threads ran with `resilience.thread_nice: {v}`"
                + (" (the default: the training thread's priority)." if v == 0 else "."))
    return "`resilience.thread_nice` per case: " + ", ".join(f"{n} {v}" for n, v in vals.items()) + "."


def quiesce_findings(trials: list[dict]) -> list[str]:
    """Sentences on hot swaps whose quiesce took most of the total (pure)."""
    slow = [h for h in trials if (h.get("marks") or {}).get("quiesce_s") is not None
            and h["marks"]["quiesce_s"] > 0.5 * h["total_s"]]
    if not slow:
        return []
    blocked = [h for h in slow if h["marks"].get("collective_timeout_in_quiesce")]
    each = ", ".join(f"{h['name']}: {h['marks']['quiesce_s']:.1f} of {h['total_s']:.1f} s" for h in slow)
    out = [f"- In {len(slow)} of {len(trials)} hot swaps the quiesce took more than half of the total ({each})."]
    if blocked:
        out.append(f"  In {len(blocked)} of them a survivor reported a collective timeout during the quiesce: it was "
                   "blocked in a gloo collective with the dead rank and answered only when "
                   "`resilience.collective_timeout_s` (30 s in these jobs) expired. That wait, not detection, "
                   "communicator rebuild or restore, dominates these hot swaps.")
    return out


def dominant_cost(case: dict) -> str:
    """One sentence on what makes protection cost time in a case (pure): the exposed wait (copies not
    hidden by compute) or the background copy threads slowing compute (CPU contention)."""
    on, off = case["step_ms_on"]["median"], case["step_ms_off"]["median"]
    extra = on - off
    wait = case["exposed_wait_ms"]["median"]
    if extra <= 0:
        return "no measurable cost"
    share = wait / extra if extra > 0 else 0.0
    if share >= 0.5:
        return (f"the exposed wait ({wait:.1f} ms of {extra:.1f} ms extra per step): the copies do not fit in "
                "the compute window")
    spent = demand_sentence(case.get("demand"))
    if spent:
        return f"{spent} (exposed wait {wait:.2f} ms per step; table below)"
    return (f"compute slowed by the background copies, not waiting (exposed wait {wait:.2f} ms of {extra:.1f} ms "
            f"extra per step; D2H+CRC {case['d2h_ms_mean']:.0f} ms and H2H {case['h2h_ms_mean']:.0f} ms of "
            "background work per step share the CPU cores with the ranks' compute)")


def demand_lines(cases: list[dict], a) -> None:
    """Section 1's table of where the added step time went (``bench/cpu_demand.py``); nothing for runs
    that did not record the per-step clocks."""
    rows = [(c, c["demand"]) for c in cases if c.get("demand")]
    if not rows:
        return
    a("Where the added step time went: every rank reads, once per step, its training thread's CPU time, its "
      "process's CPU time and the machine's idle, interrupt and steal time (`/proc/stat`); per step, summed "
      "over ranks, cores x wall = training threads + the ranks' other threads (the runtime's copy and H2H "
      "threads, gloo's and MPI's) + interrupts + steal + idle + outside the ranks (what is left: Slurm's step "
      "daemons, MPI's helpers, the skew of the ranks' step windows; negative where the kernel counts soft "
      "interrupts both in a thread's clock and in `/proc/stat`). Means over rank 0's kept steps (wall: rank "
      "0's step time; the ratios above are medians of the slowest rank's), core-ms per step, off -> on "
      "(change). The other threads are split by name (each thread's own CPU clock, per step after a block's first, from "
      "`/proc/self/task`): the runtime's `phoenix-copy` and `phoenix-h2h`, "
      "and gloo's TCP loop and run-loop, which carry the gradients' all-reduce. The runtime's own accounting "
      "(section below: its threads' work and its two calls on the training thread, a median over steps per "
      "rank, summed over ranks) reads below the runtime threads' clocks, which are means: the steps' CPU "
      "time is skewed by a few costly ones. A training thread's change beyond the runtime's two calls is its "
      "compute running slower beside the copies (caches, memory bandwidth).")
    a("")
    a("| case | cores | wall ms | training threads | ranks' other threads | of them: runtime's threads / gloo's "
      "threads | runtime's own (sum of per-rank medians) | interrupts + steal | outside the ranks | idle |")
    a("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")

    def cell(d: dict, *keys: str) -> str:
        off, on = (sum(d[m][k] for k in keys) for m in ("off", "on"))
        return f"{off:.0f} -> {on:.0f} ({on - off:+.0f})"

    for c, d in rows:
        th = d.get("threads")
        split = (f"{cell(th, 'runtime')} / {cell(th, 'gloo')}" if th else "n/a")
        a(f"| {c['name']} | {d['cores']} | {cell(d, 'wall_ms')} | {cell(d, 'train')} | {cell(d, 'other')} | {split} | "
          f"{_f(d.get('protector_ms'), 0)} | {cell(d, 'irq', 'steal')} | {cell(d, 'outside')} | {cell(d, 'idle')} |")
    a("")


#: The killed slot's resident memory and the part of it in transparent huge pages, MiB (medians over trials).
BY_SIZE_MIB = ("slot_rss_mib", "slot_huge_mib")
#: Facts of a row of ``recovery_by_size`` that are not a part's seconds (its table leaves them out): the model's
#: parameters, the trials, each trial's total minus its replay (with and without its detection), and
#: :data:`BY_SIZE_MIB`.
BY_SIZE_FACTS = ("params", "trials", "core_s", "recovery_s") + BY_SIZE_MIB


def by_size_lines(bs: dict | None) -> list[str]:
    """Section 3's per-part view of what grows with the model (:mod:`phoenix_hpc.bench.by_size`: section
    ``by_size`` of ``scripts/bench.sh`` or ``scripts/measure-recovery-by-size.py``, kept in ``BENCHMARKS.json``
    under ``recovery_by_size``); a line saying why when it was not measured or failed."""
    if not bs:
        return []
    if not bs.get("rows"):
        why = bs.get("unavailable") or (f"failed: {' '.join(str(bs['error']).split())[:300]}" if bs.get("error") else "")
        return [f"What grows with the model, per recovery part: **not measured ({why})**.", ""] if why else []
    rows = bs["rows"]
    sizes = sorted(rows, key=lambda k: rows[k].get("params", 0))  # smaller model first (JSON sorts the keys)
    n = {s: rows[s].get("trials", 1) for s in sizes}
    if set(n.values()) == {1}:
        jobs = "one job per model, the same fault; per part the largest time any member reports"
    else:
        jobs = (f"{' and '.join(str(v) for v in n.values())} jobs per model, run interleaved, the same fault; per part "
                "the median over the jobs of the largest time any member reports")
    commit = str(bs.get("commit"))
    commit = commit[:12] + ("+dirty" if commit.endswith("+dirty") else "")  # uncommitted changes stay visible
    out = [f"What grows with the model, per recovery part (run {bs.get('date')}, commit `{commit}`, "
           f"`{bs.get('command')}`; {jobs}, `recoveries[].detail` of the ranks' summaries; phases from the "
           "journal):",
           ""]
    out.append("| part (s) | " + " | ".join(f"{s} ({rows[s]['params'] / 1e6:.2f} M)" for s in sizes)
               + (" | ratio |" if len(sizes) == 2 else " |"))
    out.append("| --- |" + " --- |" * (len(sizes) + (1 if len(sizes) == 2 else 0)))
    keys = sorted({k for v in rows.values() for k in v if k not in BY_SIZE_FACTS})
    for k in keys:
        vals = [rows[s].get(k) for s in sizes]
        ratio = (f" {vals[1] / vals[0]:.2f} |" if len(vals) == 2 and vals[0] and vals[1] is not None else
                 (" - |" if len(sizes) == 2 else ""))
        out.append(f"| {k} | " + " | ".join("-" if v is None else f"{v:.3f}" for v in vals) + " |" + ratio)
    out.append("")
    for line in bs.get("findings") or []:
        out.append(line)
    out.append("")
    return out


def thp_phrase(machine: dict) -> str:
    """The huge-page facts of a run's machine record (pure): the kernel's THP mode and the
    ``THP_MEM_ALLOC_ENABLE`` the jobs inherited; empty for runs that did not record them."""
    if "thp_mode" not in machine:
        return ""
    env, field = machine.get("thp_mem_alloc_enable"), machine.get("torch_huge_pages")
    return (f"; kernel THP mode {machine.get('thp_mode') or 'unknown'}, the local profile's "
            f"launcher.torch_huge_pages {'unknown' if field is None else str(bool(field)).lower()}, "
            f"THP_MEM_ALLOC_ENABLE in the submitting environment {'unset' if env is None else repr(env)}")


def render_markdown(r: dict) -> str:
    m = r.get("machine", {})
    L: list[str] = []
    a = L.append
    a("# Benchmarks")
    a("")
    a(f"Run: **{r.get('mode')}** mode (`scripts/bench.sh{' --quick' if r.get('mode') == 'quick' else ''}`), "
      f"{r.get('date')}, commit `{r.get('commit')}`, {r.get('wall_s', 0):.0f} s wall.  ")
    if r.get("kept_sections"):
        a("Sections not run this time, kept from an earlier run (each says which): "
          + ", ".join(f"{x} ({(r.get(x) or {}).get('kept_from')})" for x in r["kept_sections"]) + ".  ")
    if r.get("dirty_files"):
        a(f"Files that differed from that commit during the run: {', '.join(f'`{x}`' for x in r['dirty_files'])}.  ")
    prov = r.get("provenance")
    L.extend(provenance.header_lines(prov))

    def section_provenance(key: str) -> list[str]:  # the commit a section measured, a warning if its code changed
        return provenance.lines(((prov or {}).get("sections") or {}).get(key), (prov or {}).get("checked_at"))

    def measured(key: str) -> None:
        L.extend(section_provenance(key))
    a(f"Machine: {m.get('cpu')}, {m.get('logical_cpus')} logical CPUs, {m.get('mem_gib')} GiB, {m.get('gpu')}; "
      f"{m.get('slurm')}; {m.get('mpi')}; Python {m.get('python')}, torch {m.get('torch')}; local Slurm cluster "
      f"of {m.get('cluster_nodes')} nodes on this one host (one slot per node)" + thp_phrase(m) + ".  ")
    a("Every number below was measured in this run on the local cluster with real Slurm jobs, srun, Open MPI "
      "and gloo; raw values are in `BENCHMARKS.json`. All ranks share the machine's cores, so absolute times "
      "are those of an oversubscribed CPU host: compare the ratios, which are taken inside one run.")
    a("")
    a("| key | value |")
    a("| --- | --- |")
    a(f"| overhead_ratio (median over cases of median step time on / off) | {_f(r.get('overhead_ratio'), 3)} |")
    a(f"| exposed_wait_ms (median) | {_f(r.get('exposed_wait_ms'), 3)} |")
    a(f"| hotswap_s (median total, fault -> past the replayed steps) | {_f(r.get('hotswap_s'))} |")
    a(f"| detect_s | {_f(r.get('detect_s'))} |")
    ck = r.get("ckpt_restart_s") or {}
    a(f"| ckpt_restart_s | {', '.join(f'K={k}: {v:.2f}' for k, v in _by_k(ck)) or 'n/a'} |")
    a(f"| disruption_ratio (checkpoint-restart K=100 / hot swap) | {_f(r.get('disruption_ratio'))} |")
    for n, by_k in sorted((r.get("disruption_ratios") or {}).items()):  # as BENCHMARKS.json keeps them
        a(f"| disruption ratio {n} / hot swap [95 % CI] | " + ", ".join(
            f"K={k}: {q['value']:.1f} [{q['lo']:.1f}, {q['hi']:.1f}]" for k, q in _by_k(by_k)) + " |")
    a(f"| host_mem_ratio (measured / expected, k=1) | {_f(r.get('host_mem_ratio'), 3)} |")
    a("")

    # 1. overhead
    a("## 1. Per-step overhead of protection")
    a("")
    ov = r.get("overhead") or {}
    if ov.get("kept_from"):
        a(f"(This section is from the run of {ov['kept_from']}.)")
        a("")
    measured("overhead")
    if "error" in ov or not ov.get("cases"):
        a(f"Not measured: {ov.get('error', 'section not run')}")
        if r.get("agreement_overhead"):
            a("")
            L.extend(agreement_lines(r, section_provenance))
    else:
        c0 = ov["cases"][0]
        two = [c["name"] for c in ov["cases"] if c.get("ranks", 4) == 2]
        a(f"One batch job, 4 nodes x 1 rank, one srun step"
          + (f" (and one of 2 nodes for {', '.join(two)})" if two else "")
          + "; per case protection on and off alternate in ABBA "
          f"blocks inside the same processes (k=1). Cleaning: {c0['warmup']} unprotected warm-up steps dropped, "
          f"the first step of every block dropped, slowest {c0['trim']:.0%} of each mode trimmed; the job's step "
          "time is the slowest rank's; ratio of medians with a 95 % bootstrap CI (2000 resamples). Interleaving "
          "inside one process keeps the process start (tens of seconds here) out of the comparison; "
          "`scripts/bench-overhead` measures the same with one process per mode. "
          + thread_nice_sentence(ov["cases"]))
        a("")
        a("| case | params | grid | steps on/off | off ms (median, IQR) | on ms (median, IQR) | ratio [95 % CI] | "
          "exposed wait ms (median, p75) | D2H+CRC ms/step | H2H ms/step |")
        a("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for c in ov["cases"]:
            q = c["ratio"]
            a(f"| {c['name']} | {c['params'] / 1e6:.2f} M | {c['grid']} | {c['steps_on']}/{c['steps_off']} | "
              f"{c['step_ms_off']['median']:.1f} ({c['step_ms_off']['iqr']:.1f}) | "
              f"{c['step_ms_on']['median']:.1f} ({c['step_ms_on']['iqr']:.1f}) | "
              f"{q['value']:.3f} [{q['lo']:.3f}, {q['hi']:.3f}] | {c['exposed_wait_ms']['median']:.2f} "
              f"({c['exposed_wait_ms']['q75']:.2f}) | {c['d2h_ms_mean']:.1f} | {c['h2h_ms_mean']:.1f} |")
        a("")
        for c in ov["cases"]:
            v, hi = c["ratio"]["value"], c["ratio"]["hi"]
            t = c.get("target", 1.05)
            verdict = "meets" if hi <= t else ("misses (the interval reaches above)" if v <= t else "misses")
            label = case_label(c)
            a(f"- {c['name']}{label}: ratio {v:.3f} [{c['ratio']['lo']:.3f}, {hi:.3f}] {verdict} the {t:.2f} target" +
              ("" if hi <= t else f"; what dominates: {dominant_cost(c)}."))
        a("")
        demand_lines(ov["cases"], a)
        a("CPU time of the protection path per step and rank (thread CPU time of every runtime thread, "
          "`time.thread_time_ns`; median over the on steps), per protected byte (the rank's snapshot), split "
          "into copy (D2H), checksum (owner's seal and holder's verification), MPI progress/polling (the H2H "
          "engine's thread) and bookkeeping (everything else, the training thread's calls included). The "
          "limit is what the same bytes cost at this machine's memcpy and checksum speed, measured by every "
          "rank in the same run: memcpy x (snapshot + replica sent + replica received) + checksum x "
          "(snapshot + replica received). The MPI floor is what the bare transport costs for the same replica "
          "bytes: a ring exchange of 16 MiB in the runtime's chunks between the same ranks, in the same run "
          "(`bench/throughput.measure_mpi`, CPU ns per byte sent + received), x the rank's bytes sent and "
          "received; MPI / floor above 1 is the H2H engine's own cost (polling, bookkeeping of requests). "
          "H2H wake-ups: the engine thread's rounds per step (median), each one a sleep and wake-up that costs "
          "CPU time whether or not bytes moved; while nothing is in flight or expected the thread sleeps until "
          "the next command (`runtime/h2h.py`).")
        a("")
        a("| case | rank | checksum | protected MiB | copy | checksum | MPI | bookkeeping | total ns/B "
          "(ms/step) | limit ns/B (memcpy, checksum ns/B) | total / limit | MPI floor ns/B (MPI / floor) | "
          "H2H wake-ups/step |")
        a("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for c in ov["cases"]:
            for p in (c.get("cpu") or {}).get("ranks", []):
                n = p["ns_per_byte"]
                floor = (f"{p['mpi_floor_ns_per_byte']:.3f} ({p['mpi_over_floor']:.2f})"
                         if p.get("mpi_over_floor") is not None  # results of older runs may hold null
                         else "not measured")
                a(f"| {c['name']} | {p['rank']} | {p['checksum']} | {_mib(p['protected_bytes'])} | "
                  f"{n['copy']:.3f} | {n['checksum']:.3f} | {n['mpi']:.3f} | {n['bookkeeping']:.3f} | "
                  f"{p['ns_per_byte_total']:.3f} ({p['cpu_ms_total_per_step']:.1f}) | "
                  f"{p['limit_ns_per_byte']:.3f} ({p['memcpy_ns_per_byte']:.3f}, {p['checksum_ns_per_byte']:.3f}) | "
                  f"{p['ratio']:.2f} | {floor} | {_count(p.get('h2h_wakeups_per_step'))} |")
        a("")
        L.extend(agreement_lines(r, section_provenance))
        a("")
        a(f"![overhead]({PLOT_DIR}/overhead.png)")
    a("")

    # 2. recovery
    rec = r.get("recovery") or {}
    if rec.get("comparison"):
        from phoenix_hpc.bench import report_recovery

        a("## 2. Hot swap against requeue, in-job and in-process restart")
        a("")
        if rec.get("kept_from"):
            a(f"(This section is from the run of {rec['kept_from']}.)")
            a("")
        measured("recovery")
        L += report_recovery.render(rec)
        a(f"![recovery]({PLOT_DIR}/recovery.png)")
        a("")
    else:
        a("## 2. Hot swap against checkpoint-restart")
        a("")
        measured("recovery")
    if rec.get("comparison"):
        pass
    elif not rec:
        a("Not measured: section not run.")
    else:
        a("The same job (model S, pp=2 x dp=2, 4 active nodes) and the same fault: the node of the last active "
          "rank is killed (slurmd, step daemons and tasks SIGKILLed) after rank 0 finished the fault step. "
          "PHOENIX has one spare node in the job; checkpoint-restart writes a DCP checkpoint every K steps, the "
          "job is cancelled on detection and submitted again, restores the newest checkpoint and **really "
          "replays** the lost steps (replay time = the sum of the relaunched job's measured step times). "
          "The fault step is random (seeded) in [K+1, 2K], so the lost steps are uniform on 1..K.")
        a("")
        hs = [h for h in rec.get("hotswap", []) if "total_s" in h]
        if rec.get("hotswap_unavailable"):
            a(f"PHOENIX hot swap: **not measured (hot swap unavailable: {rec['hotswap_unavailable']})**.")
        if rec.get("baseline_unavailable"):
            a(f"Checkpoint-restart: **not measured ({rec['baseline_unavailable']})**.")
        a("")
        if hs:
            a("PHOENIX hot swap (phases from the coordinator's journal, seconds):")
            a("")
            a("| trial | fault step | steps replayed | " + " | ".join(PHOENIX_PHASES)
              + " | total - sum of phases | of which quiesce | total |")
            a("| --- | --- | --- | " + " | ".join("---" for _ in PHOENIX_PHASES) + " | --- | --- | --- |")
            for h in hs:
                a(f"| {h['name']} | {h['fault_step']} | {h.get('steps_replayed')} | "
                  + " | ".join(f"{h['phases'][p]:.2f}" for p in PHOENIX_PHASES)
                  + f" | {unattributed(h):.2f} | {_f((h.get('marks') or {}).get('quiesce_s'))} | **{h['total_s']:.2f}** |")
            a("")
            a("*total - sum of phases*: the journal's total (fault -> members past the replayed steps) minus its five "
              "phases; positive where time falls between phases, negative where phases overlap (members restore "
              "parameters and optimizer shards concurrently). *of which quiesce*: `recovery_start` -> "
              "`recovery_plan` in the journal (survivors stopping and answering).")
            for line in quiesce_findings(hs):
                a(line)
            a("")
        base = {k: b for k, b in _by_k(rec.get("baseline")) if "total_s" in b}
        if base:
            a("Checkpoint-restart (seconds):")
            a("")
            a("| K | fault step | checkpoint step | steps replayed | " + " | ".join(BASELINE_PHASES) + " | total |")
            a("| --- | --- | --- | --- | " + " | ".join("---" for _ in BASELINE_PHASES) + " | --- |")
            for k, b in base.items():
                a(f"| {k} | {b['fault_step']} | {b['checkpoint_step']} | {b['steps_replayed']} | "
                  + " | ".join(f"{b['phases'][p]:.2f}" for p in BASELINE_PHASES) + f" | **{b['total_s']:.2f}** |")
        a("")
        errs = _errors(rec.get("hotswap", [])) + [f"K={k}: {v['error']}" for k, v in _by_k(rec.get("baseline"))
                                                   if "error" in v]
        for e in errs:
            a(f"- failed trial: {' '.join(e.split())}")
        hs_med = statistics.median(h["total_s"] for h in hs) if hs else None
        for k, b in _by_k(rec.get("baseline")):
            if "total_s" in b:
                steps = b.get("replay_step_ms_median")
                exp = b["expected_replay_steps"]
                line = (f"- K={k}: disruption {b['total_s']:.1f} s with {b['steps_replayed']} steps replayed "
                        f"(expected on average {(exp):.1f} steps"
                        + (f" = {exp * steps / 1e3:.1f} s at the measured {steps:.0f} ms/step" if steps else "") + ")")
                if hs_med:
                    line += f"; ratio to the hot swap's {hs_med:.1f} s: **{b['total_s'] / hs_med:.1f}x**"
                a(line)
        if any("total_s" in b for b in (rec.get("baseline") or {}).values()):
            a("")
            a("Reading the phases: the baseline's *detect* is the first journal record after the kill (usually a "
              "survivor's collective error, reported at once); PHOENIX's *detect* runs from the dead slots' last "
              "sign of life to the decision. Here the killed tasks' liveness connections close at once (kind "
              "process_exit); a node that vanishes without closing its connections (power loss) is found only by "
              "the heartbeat timeout (3 s here), as a collective error alone could be transient. Steps on this machine take tens of "
              "milliseconds, so the baseline's replay is small here; it grows with the step time: *computed, not "
              "measured*, at the 20 s steps of docs/design.md section 1 the average replay alone would be "
              + ", ".join(f"K={k}: {b['expected_replay_steps'] * 20:.0f} s" for k, b in _by_k(rec.get('baseline'))
                          if "total_s" in b) + ".")
        a("")
        a(f"![recovery]({PLOT_DIR}/recovery.png)")
    a("")

    # 3. scaling
    a("## 3. Hot-swap scaling")
    a("")
    sc = r.get("scaling") or {}
    if sc.get("kept_from"):
        a(f"(This section is from the run of {sc['kept_from']}.)")
        a("")
    measured("scaling")
    if not sc:
        a("Not measured: section not run.")
    elif sc.get("unavailable"):
        a(f"**Not measured ({sc['unavailable']})**.")
    else:
        a("The same fault as in section 2 (last active node killed), pp=1, dp = number of active slots, one spare "
          "node; hot-swap phases from the journal.")
        a("")
        for title, key in (("by number of active slots (model S)", "by_slots"), ("by model size (4 active slots)", "by_size")):
            a(f"{title}:")
            a("")
            a("| run | slots | params | " + " | ".join(PHOENIX_PHASES) + " | total - sum of phases | of which quiesce | total s |")
            a("| --- | --- | --- | " + " | ".join("---" for _ in PHOENIX_PHASES) + " | --- | --- | --- |")
            for h in sc.get(key, []):
                if "total_s" not in h:
                    a(f"| {h.get('name', '?')} | failed: {' '.join(str(h.get('error', '?')).split())[:200]} | | | | | | | | | |")
                    continue
                a(f"| {h['name']} | {h['nodes']} | {h['params'] / 1e6:.2f} M | "
                  + " | ".join(f"{h['phases'][p]:.2f}" for p in PHOENIX_PHASES)
                  + f" | {unattributed(h):.2f} | {_f((h.get('marks') or {}).get('quiesce_s'))} | {h['total_s']:.2f} |")
            a("")
        uniq = {h["name"]: h for k in ("by_slots", "by_size") for h in sc.get(k, []) if "total_s" in h}
        for line in quiesce_findings(list(uniq.values())):
            a(line)
        a("")
        fit = sc.get("fit") or {}
        if "result" in fit:
            fr = fit["result"]
            best = next((x for x in fr.get("laws", []) if x.get("law") == fr.get("best")), {})
            a(f"`phoenix model fit --csv {fit['csv']}` (gpus = active slots, seconds = hot-swap total): best law "
              f"**{fr.get('best')}** ({best.get('formula')}, params {json.dumps(best.get('params'))}, "
              f"R^2 {_f(best.get('r2'), 3)}); extrapolated: "
              + ", ".join(f"{p['gpus']} GPUs -> {p['seconds']:.0f} s [{p['low']:.0f}, {p['high']:.0f}]"
                          for p in best.get("predictions", [])) + ". A handful of points on one host is a weak basis "
              "for extrapolation; the numbers show the method, not a prediction for a real machine.")
        elif fit:
            a(f"Fit: {fit.get('error') or fit.get('text')}")
        a("")
        a(f"![scaling]({PLOT_DIR}/scaling.png)")
    a("")
    if (r.get("recovery_by_size") or {}).get("rows"):
        measured("recovery_by_size")
    L.extend(by_size_lines(r.get("recovery_by_size")))

    # 4. memory
    a("## 4. Host memory per rank")
    a("")
    measured("overhead")
    mem = ov.get("memory") if isinstance(ov, dict) else None
    if not mem:
        a("Not measured: " + (ov.get("error", "section not run") if isinstance(ov, dict) else "section not run"))
    else:
        a("Cases of the overhead job (dp=4, one rank per node), k=1 and k=2. Expected = 2 x snapshot + 2k x "
          "optimizer shard (docs/design.md section 4). Measured = the RSS given back when the runtime is "
          "freed (RSS at the end of a protected block minus RSS after close + malloc_trim; glibc mmap "
          "threshold fixed at 64 KiB so the buffers get their own pages). Also shown: the resident bytes of "
          "the runtime's buffers (mincore), the runtime's own plan, and the RSS growth over a protected block "
          "and over an unprotected one (training alone). Medians over the 4 ranks, MiB.")
        a("")
        a("| k | snapshot | optimizer shard | expected | planned by runtime | buffers resident | measured (RSS freed) | "
          "RSS growth on / off block | measured / expected |")
        a("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for key, mk in sorted(mem.items()):
            rk = mk["ranks"]
            med = lambda f: statistics.median(x[f] for x in rk if x.get(f) is not None)  # noqa: E731
            a(f"| {mk['k']} | {_mib(med('snapshot_bytes'))} | {_mib(med('optimizer_shard_bytes'))} | "
              f"{_mib(med('expected_bytes'))} | {_mib(med('planned_bytes'))} | {_mib(med('buffers_resident_bytes'))} | "
              f"{_mib(med('measured_bytes'))} | {_mib(med('rss_growth_on_block_bytes'))} / "
              f"{_mib(med('rss_growth_off_block_bytes'))} | {mk['ratio_median']:.3f} |")
        a("")
        a("The runtime plans slightly more than the formula: every replica carries a 64-byte header and a "
          "per-tensor index with CRC-32s besides the optimizer shard.")
        a("")
        a(f"![memory]({PLOT_DIR}/memory.png)")
    a("")
    if r.get("control_plane"):  # measured apart (scripts/bench-control-plane), kept across full runs
        from phoenix_hpc.bench.control_plane_report import section_lines

        cp = section_lines(r["control_plane"])
        L.extend(cp[:2])  # the heading, then the commit it measured
        measured("control_plane")
        L.extend(cp[2:])
    L.extend(gpu_section(r.get("gpu_reports")))
    L.extend(provenance.gpu_lines(prov, [x for x in r.get("gpu_reports") or [] if x.get("mode") == "gpu"]))
    a("## Reproduce")
    a("")
    a("```\nscripts/bench.sh            # full run (about 20-35 min on 2 cores)\nscripts/bench.sh --quick    "
      "# under 3 min: overhead and memory on model S, one hot swap\nphoenix bench [--quick]     # the same "
      "from the CLI (after scripts/setup.sh)\nscripts/bench-control-plane --update-benchmarks .  # section 5 (CPU "
      "only, minutes), kept in benchmarks/control_plane.json\n.venv/bin/python -m phoenix_hpc.bench.report refresh  "
      "# every section's code checked against HEAD again\n"
      "scripts/bench-h2h-engine    # the H2H engine alone: CPU per byte moved, wake-ups per step (seconds)\n"
      "scripts/check-many-nodes    # 8 active + 4 spare nodes, gpt-small's timings, 2 node losses: same final "
      "hash\nscripts/bench.sh --sections by_size  # section 3's what grows with the model alone (about 6 min)\n.venv/bin/python -m phoenix_hpc.bench.exit_time  # a killed process's exit by its memory, with and "
      "without huge pages (about a minute)\n```")
    a("")
    return "\n".join(L)


#: Where BENCHMARKS.md's GPU section reads the kept GPU reports from (relative to the repository): every
#: ``*.json`` there is one ``gpu-report.json`` of ``scripts/gpu-check.sh`` (a run may cover only some checks,
#: ``--only``); the section shows each item's result from the newest run that has it. A ``NAME.note`` beside
#: ``NAME.json`` is shown under that run (what the run was made with, when the code has changed since); a
#: ``NAME.withdrawn`` (its text: why) marks a run of code that is no longer the project's (a change taken out
#: again): the run is listed, its items are not shown.
GPU_REPORT_DIR = "benchmarks/gpu"
_KEY_NUMBERS = ("ratio", "ratio_ci95", "off_ms_median", "exposed_wait_ms_median", "d2h_gbs", "host_link_limit_gbs",
                "host_link", "raw_pinned_copy_gbs", "checksum_gbs", "crc32_gbs", "checksum_threads",
                "checksum_gbs_threads", "d2h_crc_ms_mean", "contention_copy_only_ms_median",
                "contention_alone_ms_median", "contention_checksum_only_ms_median",
                "contention_one_copy_only_ms_median", "contention_chunked_copy_only_ms_median", "abort_ms",
                "abort_ms_by_api", "abort_ms_torch_monitoring",
                "again_create_ms",
                "params_cast_to_dtype", "rss_growth_over_expected", "teardown_ms", "rebuild_and_load_ms")


def load_gpu_reports(folder: Path) -> list[dict]:
    """The GPU-mode reports kept in ``folder`` (:data:`GPU_REPORT_DIR`), newest ``started`` first, each with
    its ``file`` name and, where a ``.note`` file sits beside it, its ``note`` (whitespace collapsed), where a
    ``.withdrawn`` one does, ``withdrawn`` (its text); dry runs and files that are not reports are left out.
    Empty when the folder is missing."""
    reps = []
    for f in sorted(Path(folder).glob("*.json")) if Path(folder).is_dir() else []:
        try:
            r = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(r, dict) and r.get("mode") == "gpu" and "checks" in r:
            note, gone = f.with_suffix(".note"), f.with_suffix(".withdrawn")
            extra = {"note": " ".join(note.read_text().split())} if note.is_file() else {}
            if gone.is_file():
                extra["withdrawn"] = " ".join(gone.read_text().split()) or "a change taken out again"
            reps.append({**r, "file": f.name, **extra})
    return sorted(reps, key=lambda r: str(r.get("started")), reverse=True)


def gpu_section(gpu_reports: list[dict] | dict | None) -> list[str]:
    """The GPU section of BENCHMARKS.md (lines) from the kept reports of ``scripts/gpu-check.sh`` (format:
    :mod:`phoenix_hpc.gpucheck.report`; a list, newest first, or one report): each run's device, versions
    and verdicts, then every item's status and key numbers from the newest run that has it, or a plain
    statement that no GPU check has run yet."""
    L = ["## GPU (one-GPU check)", ""]
    reps = [gpu_reports] if isinstance(gpu_reports, dict) else list(gpu_reports or [])
    reps = [r for r in reps if r.get("mode") == "gpu"]
    if not reps:
        return L + [
            "**No GPU check has run yet**: no GPU was available where this project has been run, so the Megatron "
            "engine, the CUDA D2H path and NCCL groups have never executed, and every number above comes from "
            "CPU ranks. `scripts/gpu-check.sh OUT_DIR` runs every check on one CUDA GPU in under 8 minutes "
            f"(after `scripts/gpu-wheels.sh` where the package index is reachable); copy `OUT_DIR/gpu-report.json` "
            f"into `{GPU_REPORT_DIR}/`, and the next `scripts/bench.sh` shows it here.", ""]
    L += ["GPU check runs kept (newest first; each item below is from the newest run that has it, runs of "
          "withdrawn code left out):", ""]
    for i, r in enumerate(reps, 1):
        v, d, s = r["versions"], r["device"], r["summary"]
        names = [c["check"] for c in r["checks"]]
        commit = (r.get("code") or {}).get("commit") or "not recorded"
        L.append(f"{i}. {r['started']}, commit {commit}, {d.get('name')}, torch {v.get('torch')}, CUDA {v.get('cuda')}, "
                 f"driver {v.get('driver')}, megatron-core {v.get('megatron_core')}; checks {', '.join(names)}: "
                 f"{s['passed']} passed, {s['failed']} failed, {s['skipped']} skipped ({r['wall_s']} s)"
                 + (f"; `{GPU_REPORT_DIR}/{r['file']}`" if r.get("file") else ""))
        if r.get("withdrawn"):
            L.append(f"   Withdrawn (its items are not shown below): {r['withdrawn']}")
        if r.get("note"):
            L.append(f"   Note: {r['note']}")
    L += ["", "| item | run | status | key numbers | reason |", "| --- | --- | --- | --- | --- |"]
    seen: set[str] = set()
    for i, r in enumerate(reps, 1):
        if r.get("withdrawn"):
            continue
        for c in r["checks"]:
            for it in c["items"]:
                if it["name"] in seen:
                    continue
                seen.add(it["name"])
                nums = ", ".join(f"{k} {fmt_number(it['numbers'][k])}" for k in _KEY_NUMBERS if k in it["numbers"])
                L.append(f"| {it['name']} | {i} | {it['status']} | {nums} | {it['reason'].replace('|', '/')} |")
    return L + [""]


def case_label(c: dict) -> str:
    """How the ranks of an overhead case share the host's cores, for its verdict line."""
    if c.get("pinned"):
        return " (GPU-like: every rank's training thread pinned to one core, the protection threads to the others)"
    if c.get("ranks", 4) == 2:
        how = ("each process bound to one core as `srun --cpu-bind=cores` binds it, its protection threads "
               "sharing that core" if c.get("bound") else "not bound to cores, sharing them with their protection threads")
        return (f" (2 ranks on the 2-core host, {how}; sequence length {c.get('seq_length')}, global batch "
                f"{c.get('global_batch')}: the model and batch of `scripts/bench-overhead`)")
    return " (4 ranks sharing the cores with their protection threads)"


def fmt_number(v) -> str:
    """A number for a report table: floats to 4 significant digits, lists element-wise, others as str."""
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(fmt_number(x) for x in v) + "]"
    return str(v)


def _plots(r: dict, folder: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    written = []

    def save(fig, name):
        tmp = folder / f".{name}.tmp{os.getpid()}.png"
        fig.tight_layout()
        fig.savefig(tmp, dpi=110)
        plt.close(fig)
        os.replace(tmp, folder / name)
        written.append(name)

    ov = r.get("overhead") or {}
    cases = ov.get("cases") or []
    if cases:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
        names = [c["name"] for c in cases]
        vals = [c["ratio"]["value"] for c in cases]
        err = [[v - c["ratio"]["lo"] for v, c in zip(vals, cases)], [c["ratio"]["hi"] - v for v, c in zip(vals, cases)]]
        ax1.bar(names, vals, yerr=err, capsize=4, color="#4c72b0")
        ax1.axhline(1.0, color="k", lw=0.8)
        ax1.axhline(1.05, color="r", ls="--", lw=0.8, label="target 1.05")
        ax1.set_ylabel("step time on / off (median, 95 % CI)")
        ax1.legend()
        ax1.set_title("1. per-step overhead")
        data = [c["raw"]["off_ms"] for c in cases] + [c["raw"]["on_ms"] for c in cases]
        pos = list(range(1, 2 * len(cases), 2)) + list(range(2, 2 * len(cases) + 1, 2))
        ax2.boxplot(data, positions=pos, widths=0.7)
        ax2.set_xticks([i + 0.5 for i in range(1, 2 * len(cases), 2)], names)
        ax2.set_ylabel("step time, ms (off | on)")
        ax2.set_title("step times (left off, right on)")
        save(fig, "overhead.png")
    mem = ov.get("memory") or {}
    if mem:
        fig, ax = plt.subplots(figsize=(6, 3.8))
        keys = sorted(mem)
        series = (("expected_bytes", "expected 2S+2kO"), ("planned_bytes", "runtime plan"),
                  ("buffers_resident_bytes", "buffers resident"), ("measured_bytes", "measured (RSS freed)"))
        w = 0.2
        for i, (f, label) in enumerate(series):
            ys = [statistics.median(x[f] for x in mem[k]["ranks"]) / 2**20 for k in keys]
            ax.bar([j + i * w for j in range(len(keys))], ys, w, label=label)
        ax.set_xticks([j + 1.5 * w for j in range(len(keys))], [f"k={mem[k]['k']}" for k in keys])
        ax.set_ylabel("MiB per rank")
        ax.set_title("4. host memory per rank")
        ax.legend(fontsize=8)
        save(fig, "memory.png")
    rec = r.get("recovery") or {}
    bars = []
    for h in ([] if rec.get("comparison") else rec.get("hotswap", [])):
        if "total_s" in h:
            d = {p: h["phases"][p] for p in PHOENIX_PHASES}
            d["between phases (mostly quiesce)"] = max(0.0, unattributed(h))
            bars.append((f"PHOENIX\n{h['name']}", d))
    for k, b in _by_k(rec.get("baseline")):
        if "total_s" in b:
            bars.append((f"ckpt-restart\nK={k}", dict(b["phases"])))
    comp = rec.get("comparison") or {}
    if comp:
        from phoenix_hpc.bench.baselines import BASELINES

        bars = []
        if (comp.get("hot-swap") or {}).get("phases_median"):
            bars.append(("hot-swap", dict(comp["hot-swap"]["phases_median"])))
        for n in BASELINES:
            for k, row in _by_k(comp.get(n) or {}):
                if row.get("phases_median"):
                    bars.append((f"{n}\nK={k}", dict(row["phases_median"])))
    if bars:
        fig, ax = plt.subplots(figsize=(8, 4))
        phases = list(dict.fromkeys([p for _, d in bars for p in d]))
        cmap = plt.get_cmap("tab10")
        for i, (label, d) in enumerate(bars):
            bottom = 0.0
            for j, p in enumerate(phases):
                v = d.get(p, 0.0)
                ax.bar(i, v, bottom=bottom, color=cmap(j), label=p if i == 0 or p not in d else None)
                bottom += v
        handles, labels = ax.get_legend_handles_labels()
        uniq = dict(zip(labels, handles))
        ax.legend(uniq.values(), uniq.keys(), fontsize=8)
        ax.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=8)
        ax.set_ylabel("seconds per fault")
        ax.set_title("2. disruption per node loss, by phase")
        save(fig, "recovery.png")
    sc = r.get("scaling") or {}
    pts = [h for h in sc.get("by_slots", []) if "total_s" in h]
    szs = [h for h in sc.get("by_size", []) if "total_s" in h]
    if pts or szs:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
        for ax, data, xkey, xlabel in ((ax1, pts, "nodes", "active slots"), (ax2, szs, "params", "parameters")):
            data = sorted(data, key=lambda h: h[xkey])
            xs = [h[xkey] for h in data]
            ax.plot(xs, [h["total_s"] for h in data], "k-o", label="total")
            for p in PHOENIX_PHASES:
                ax.plot(xs, [h["phases"][p] for h in data], "--.", label=p)
            ax.set_xlabel(xlabel)
            ax.set_ylabel("seconds")
        ax2.set_xscale("log")
        ax1.set_title("3. hot swap vs slots (model S)")
        ax2.set_title("3. hot swap vs model size (4 slots)")
        ax1.legend(fontsize=8)
        save(fig, "scaling.png")
    return written


def scrub_paths(obj, replacements: dict[str, str]):
    """``obj`` with every string's occurrences of each key replaced by its value (pure; longest key first),
    so that a committed report names no folder of the machine it ran on."""
    keys = sorted((k for k in replacements if k), key=len, reverse=True)
    if isinstance(obj, str):
        for k in keys:
            obj = obj.replace(k, replacements[k])
        return obj
    if isinstance(obj, dict):
        return {scrub_paths(k, replacements): scrub_paths(v, replacements) for k, v in obj.items()}
    if isinstance(obj, list):
        return [scrub_paths(v, replacements) for v in obj]
    return obj


def write_all(results: dict, out: Path, replacements: dict[str, str] | None = None) -> None:
    """Write ``out/BENCHMARKS.json``, ``out/BENCHMARKS.md`` and ``out/benchmarks/*.png``; strings are first
    passed through :func:`scrub_paths` with ``replacements`` (e.g. the work folder -> ``<work>``)."""
    out = Path(out)
    old = out / "BENCHMARKS.json"
    for key in (*KEPT_RECORDS, "recovery_by_size"):  # measured by commands of their own
        if key in results or not old.exists():
            continue
        try:
            prev = json.loads(old.read_text()).get(key)
        except (OSError, ValueError, AttributeError):
            prev = None
        if prev:
            results = {**results, key: prev}
    results = scrub_paths(results, replacements or {})
    _plots(results, out / PLOT_DIR)
    _atomic_text(out / "BENCHMARKS.json", json.dumps(results, indent=1, sort_keys=True, default=str) + "\n")
    _atomic_text(out / "BENCHMARKS.md", render_markdown(results))


def with_gpu_reports(data: dict, repo: Path) -> dict:
    """``data`` (a BENCHMARKS.json's content) with ``gpu_reports`` read now from ``repo``/:data:`GPU_REPORT_DIR`
    (and the single ``gpu_report`` of earlier versions dropped); changes ``data`` in place and returns it."""
    data.pop("gpu_report", None)
    data["gpu_reports"] = load_gpu_reports(Path(repo) / GPU_REPORT_DIR)
    return data


def refresh_gpu_section(folder: Path, repo: Path) -> int:
    """Re-render ``folder/BENCHMARKS.md`` and ``.json`` with the GPU reports kept now under
    ``repo``/:data:`GPU_REPORT_DIR`; every other section is re-rendered unchanged from the same JSON (no
    benchmark runs). Returns how many reports it shows.

    Raises FileNotFoundError when ``folder`` has no BENCHMARKS.json (nothing to re-render)."""
    js = Path(folder) / "BENCHMARKS.json"
    data = with_gpu_reports(json.loads(js.read_text()), repo)
    _atomic_text(js, json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")
    _atomic_text(Path(folder) / "BENCHMARKS.md", render_markdown(data))
    return len(data["gpu_reports"])


#: The control-plane benchmark's record (``scripts/bench-control-plane --update-benchmarks DIR`` writes
#: ``DIR/benchmarks/control_plane.json``), a file of its own as the GPU reports are, so that every report
#: written later carries section 5, whatever folder a full run writes to; ``BENCHMARKS.json`` holds a copy
#: under ``control_plane``.
CONTROL_PLANE_RECORD = "benchmarks/control_plane.json"


#: The replica agreement on/off run's record (``python -m phoenix_hpc.bench.agreement_overhead
#: --update-benchmarks DIR`` writes ``DIR/benchmarks/agreement_overhead.json``), kept like the control plane's;
#: ``BENCHMARKS.json`` holds a copy under ``agreement_overhead``, shown in section 1.
AGREEMENT_RECORD = "benchmarks/agreement_overhead.json"

#: The sections measured by commands of their own whose results are kept as files: key in BENCHMARKS.json ->
#: the record's path under the report's folder (:func:`keep_record` writes them, :func:`with_kept_records` reads).
KEPT_RECORDS = {"control_plane": CONTROL_PLANE_RECORD, "agreement_overhead": AGREEMENT_RECORD}


def with_kept_records(data: dict, repo: Path) -> dict:
    """``data`` (a BENCHMARKS.json's content) with ``control_plane`` read from ``repo``/:data:`CONTROL_PLANE_RECORD`
    and ``agreement_overhead`` from ``repo``/:data:`AGREEMENT_RECORD` where those files exist (else as it was);
    changes ``data`` in place and returns it.

    Raises ValueError naming the record when it is not JSON: a kept record is never silently dropped."""
    for key, name in KEPT_RECORDS.items():
        rec = Path(repo) / name
        if rec.is_file():
            data[key] = _read_json(rec)
    return data


def keep_record(folder: Path, key: str, result: dict) -> dict:
    """Keep ``result`` (a benchmark command's, ``key`` one of :data:`KEPT_RECORDS`) as ``folder``/its record
    and under ``key`` in ``folder/BENCHMARKS.json``, and re-render ``folder/BENCHMARKS.md`` from that JSON
    (the other sections' numbers unchanged, the GPU reports kept now, every section's code checked against
    the repository's HEAD now). A folder without BENCHMARKS.json gets one holding this record alone.
    Returns the JSON's content as written.

    Raises ValueError naming ``folder/BENCHMARKS.json`` when it is not JSON (nothing is written then)."""
    repo = Path(__file__).resolve().parents[2]
    folder = Path(folder)
    js = folder / "BENCHMARKS.json"
    data = _read_json(js) if js.exists() else {}
    _atomic_text(folder / KEPT_RECORDS[key], json.dumps(result, indent=1, sort_keys=True) + "\n")
    data[key] = result
    with_provenance(with_gpu_reports(data, repo), repo)
    text = json.dumps(data, indent=1, sort_keys=True, default=str) + "\n"
    _atomic_text(js, text)
    # rendered from the JSON as written (keys sorted), so that a later re-render gives the same page
    written = json.loads(text)
    _atomic_text(folder / "BENCHMARKS.md", render_markdown(written))
    return written


def output_error(json_path: str | None, update_dir: str | None) -> str | None:
    """Why a benchmark command's ``--json FILE`` or ``--update-benchmarks DIR`` could not be written, checked
    before its run so that a long run's result is not lost at the end (``error: FIELD: ...``, the field, the
    value and what is allowed), or None when both can be. ``FILE``: its folder must exist and it must not be
    a folder; ``DIR``: a folder (or not there yet) whose ``BENCHMARKS.json``, where there is one, is a JSON
    object (:func:`keep_record` adds the record to it). Reads only."""
    if json_path is not None:
        p = Path(json_path)
        if p.is_dir() or not p.parent.is_dir():
            return (f"--json: {json_path!r} is not allowed; expected a file in an existing folder "
                    f"({'it is a folder' if p.is_dir() else f'no folder {str(p.parent)!r}'})")
    if update_dir is not None:
        d = Path(update_dir)
        if d.exists() and not d.is_dir():
            return f"--update-benchmarks: {update_dir!r} is not allowed; expected a folder (it is a file)"
        js = d / "BENCHMARKS.json"
        if js.exists():
            try:
                data = _read_json(js)
            except (ValueError, OSError) as exc:
                return f"--update-benchmarks: {update_dir!r} is not allowed: {exc}"
            if not isinstance(data, dict):
                return (f"--update-benchmarks: {update_dir!r} is not allowed: {js} holds a JSON "
                        f"{type(data).__name__}; expected an object")
    return None


def _read_json(path: Path):
    """The JSON content of ``path``. Raises ValueError naming ``path`` when it is not JSON."""
    try:
        return json.loads(Path(path).read_text())
    except ValueError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None


def with_provenance(data: dict, repo: Path) -> dict:
    """``data`` with ``provenance``: the commit every section measured and what changed since in the code it
    measures, checked now against ``repo``'s HEAD (:func:`phoenix_hpc.bench.provenance.check`)."""
    data["provenance"] = provenance.check(data, Path(repo))
    return data


def refresh(folder: Path, repo: Path) -> dict:
    """Re-render ``folder/BENCHMARKS.md`` and ``.json`` (no benchmark runs) with the GPU reports and the
    control-plane record kept now in ``repo`` and every section's code checked against ``repo``'s HEAD now
    (:func:`with_provenance`). Returns the provenance.

    Raises FileNotFoundError when ``folder`` has no BENCHMARKS.json (nothing to re-render), ValueError naming
    the file when it or the control-plane record is not JSON."""
    js = Path(folder) / "BENCHMARKS.json"
    data = with_provenance(with_kept_records(with_gpu_reports(_read_json(js), repo), repo), repo)
    _atomic_text(js, json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")
    _atomic_text(Path(folder) / "BENCHMARKS.md", render_markdown(data))
    return data["provenance"]


def main(argv: list[str] | None = None) -> int:
    """``python -m phoenix_hpc.bench.report refresh-gpu [DIR]``: :func:`refresh_gpu_section` of DIR (default:
    the repository), after a GPU report was copied into :data:`GPU_REPORT_DIR`; ``refresh [DIR]``:
    :func:`refresh` (the kept records too, and every section's code checked against HEAD now). Exit 2 on
    other arguments."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in ("refresh-gpu", "refresh") or len(args) > 2:
        print("usage: python -m phoenix_hpc.bench.report {refresh-gpu,refresh} [DIR]", file=sys.stderr)
        return 2
    repo = Path(__file__).resolve().parents[2]
    folder = Path(args[1]) if len(args) == 2 else repo
    if not (folder / "BENCHMARKS.json").is_file():
        print(f"{args[0]}: {folder}: no BENCHMARKS.json to re-render (run scripts/bench.sh first)", file=sys.stderr)
        return 2
    if args[0] == "refresh":
        try:
            prov = refresh(folder, repo)
        except ValueError as exc:
            print(f"refresh: {exc}", file=sys.stderr)
            return 2
        stale = sorted(k for k, e in {**prov["sections"], **prov["gpu_reports"]}.items()
                       if e.get("changed_files") or "unknown" in e)
        print(f"[bench] {folder / 'BENCHMARKS.md'} re-rendered; code checked against {prov['checked_at']}: "
              + (f"changed since measured: {', '.join(stale)}" if stale else "every section's code unchanged"))
        return 0
    n = refresh_gpu_section(folder, repo)
    print(f"[bench] GPU section re-rendered from {n} kept report(s) in {GPU_REPORT_DIR}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
