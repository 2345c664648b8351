"""Where the added step time of a protected step goes on shared cores (section 1 of the benchmarks).

On a host whose cores the ranks share (the 2-core benchmark machine: 4 ranks, their runtime threads,
gloo's and MPI's threads), a step's wall time times the machine's cores is spent as CPU time by someone or
left idle. Every rank reads, once per step on its training thread (``bench/overhead_rank.StepClocks``),
its training thread's CPU time, its whole process's CPU time and the machine's idle, interrupt and steal
time (proc(5) ``/proc/stat``). Per step of the case, summed over ranks::

    cores x wall = training threads + ranks' other threads + interrupts + steal + idle + outside

where *outside* is what is left: processes that are not ranks (Slurm's step daemons, the MPI launcher's
helpers), plus the skew between the ranks' step windows. It can be negative: besides the skew, a kernel
built without ``IRQ_TIME_ACCOUNTING`` counts soft-interrupt work done in a thread's context (the loopback
TCP receive path) both in that thread's clock and in ``/proc/stat``'s softirq time, and steal time without
paravirtual steal accounting is in the threads' clocks too. The difference of each term between protected
(on) and unprotected (off) steps says where the added wall time went: the runtime's threads (counted in
the ranks' other threads; their own accounting, :mod:`phoenix_hpc.runtime.cpu_account`, is shown beside
it), the training threads (the runtime's two calls per step on it, and compute that runs slower while the
copies share caches and memory bandwidth with it), the kernel's interrupt work (the loopback TCP receive
path of the replicas), or nothing at all (idle time that grew: waiting).

:func:`analyze_demand` is a pure function of the rank files.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from phoenix_hpc.bench.stats import kept_steps

#: the per-step fields a rank file must hold for the analysis (runs before they were recorded lack them)
FIELDS = ("train_cpu_ms", "proc_cpu_ms", "idle_ms", "irq_ms", "steal_ms")
TERMS = ("train", "other", "irq", "steal", "idle", "outside")


def thread_group(name: str) -> str:
    """The group of a thread name of ``bench/overhead_rank.thread_cpu_ms`` (pure): ``runtime`` (the
    runtime's ``phoenix-*`` threads), ``gloo`` (torch's gloo threads: its TCP loop and work run-loop),
    ``training`` (``MainThread``) or ``other``."""
    base = name.split("#", 1)[0]
    if base.startswith("phoenix-"):
        return "runtime"
    if "gloo" in base:
        return "gloo"
    return "training" if base == "MainThread" else "other"


def thread_groups(ranks: Sequence[dict]) -> dict | None:
    """CPU time per step of each :func:`thread_group`, summed over ranks, for ``off`` and ``on`` (pure):
    the mean over a mode's blocks of each thread's CPU time per step after the block's first step
    (``thread_cpu_ms_per_step`` of ``bench/overhead_rank``). None for runs that did not record it."""
    out: dict = {}
    for mode in ("off", "on"):
        total: dict[str, float] = {}
        for r in ranks:
            blocks = [b for b in r.get("blocks", []) if b["mode"] == mode]
            if not blocks or any("thread_cpu_ms_per_step" not in b for b in blocks):
                return None
            for b in blocks:
                for name, ms in b["thread_cpu_ms_per_step"].items():
                    g = thread_group(name)
                    total[g] = total.get(g, 0.0) + ms / len(blocks)
        out[mode] = {g: round(total.get(g, 0.0), 2) for g in ("training", "runtime", "gloo", "other")}
    out["delta"] = {g: round(out["on"][g] - out["off"][g], 2) for g in out["on"]}
    return out


def analyze_demand(ranks: Sequence[dict], protector_ms: float | None = None) -> dict | None:
    """The CPU time of one case's steps by who spent it (pure), in core-milliseconds per step (means over
    the kept steps of each mode; :func:`phoenix_hpc.bench.stats.kept_steps`).

    ``ranks``: the case's rank files (``bench/overhead_rank``), each with ``cores`` and per step the
    :data:`FIELDS`; the machine counters are rank 0's (they are machine-wide, read at rank 0's step
    boundaries, so rank 0's own step time is the wall time they cover). ``protector_ms``: the runtime's own
    CPU accounting per step summed over ranks (``analyze_cpu``), shown beside the other threads' term.

    Returns None when a rank file lacks the fields or a mode has no kept step. Otherwise ``{"cores",
    "steps": {"on", "off"}, "on": {...}, "off": {...}, "delta": {...}, "protector_ms"}`` where each of
    ``on``/``off`` holds ``wall_ms`` (rank 0's step time), ``capacity`` (cores x wall) and the
    :data:`TERMS`, and ``delta`` = on - off of each.
    """
    if not ranks or any("cores" not in r or any(f not in s for s in r["steps"] for f in FIELDS) for r in ranks):
        return None
    n = {len(r["steps"]) for r in ranks}
    if len(n) != 1:
        return None
    r0 = ranks[0]
    cores = int(r0["cores"])
    kept = kept_steps(r0["steps"])
    out: dict = {"cores": cores, "steps": {}, "protector_ms": None if protector_ms is None else round(protector_ms, 2)}
    for mode in ("off", "on"):
        idx = [i for i in kept if r0["steps"][i]["mode"] == mode]
        if not idx:
            return None
        rows = []
        for i in idx:
            m = r0["steps"][i]
            train = sum(r["steps"][i]["train_cpu_ms"] for r in ranks)
            other = sum(r["steps"][i]["proc_cpu_ms"] - r["steps"][i]["train_cpu_ms"] for r in ranks)
            capacity = cores * m["step_ms"]
            row = {"wall_ms": m["step_ms"], "capacity": capacity, "train": train, "other": other,
                   "irq": m["irq_ms"], "steal": m["steal_ms"], "idle": m["idle_ms"]}
            row["outside"] = capacity - sum(row[t] for t in TERMS if t != "outside")
            rows.append(row)
        out["steps"][mode] = len(rows)
        out[mode] = {k: round(statistics.fmean(r[k] for r in rows), 2) for k in rows[0]}
    out["delta"] = {k: round(out["on"][k] - out["off"][k], 2) for k in out["on"]}
    out["threads"] = thread_groups(ranks)
    return out


def demand_sentence(d: dict | None) -> str | None:
    """What the added step time was spent on, in core-ms per step, largest first (pure); None without a
    decomposition or when the protected steps were not slower."""
    if not d or d["delta"]["capacity"] <= 0:
        return None
    dl = d["delta"]
    names = {"train": "training threads", "other": "the ranks' other threads", "irq": "interrupts",
             "steal": "steal", "idle": "idle", "outside": "outside the ranks"}
    parts = []
    ranked = sorted(((dl[t], t) for t in TERMS), reverse=True)
    for v, t in ranked:
        if abs(v) < 0.5:
            continue
        extra = ""
        if t == "other" and d.get("threads"):
            g = d["threads"]["delta"]
            extra = f" (the runtime's threads {g['runtime']:+.0f}, gloo's {g['gloo']:+.0f})"
        elif t == "other" and d.get("protector_ms") is not None:
            extra = f" (the runtime's own accounting {d['protector_ms']:.0f})"
        parts.append(f"{names[t]} {v:+.0f}{extra}")
    busy = 1 - d["off"]["idle"] / d["off"]["capacity"] if d["off"]["capacity"] else 0.0
    head = ("waiting (the cores idled more)" if ranked[0][1] == "idle"
            else "CPU time (the cores were busy with more work)")
    return (f"{head}; {dl['wall_ms']:.1f} ms more per step (mean of rank 0's kept steps) on {d['cores']} cores "
            f"{busy:.0%} busy without protection: {dl['capacity']:.0f} core-ms, spent as "
            + (", ".join(parts) or "nothing measurable") + " core-ms")
