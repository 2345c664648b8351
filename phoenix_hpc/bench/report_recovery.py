"""Section 2 of BENCHMARKS.md: every recovery scheme against the hot swap (text of
:func:`phoenix_hpc.bench.run.section_recovery`'s results; pure)."""

from __future__ import annotations

from phoenix_hpc.bench.baselines import BASELINES, DEFAULT_KS, PAPER_STEP_S, PHASES, computed_cost

DESCRIPTION = {
    "requeue": "checkpoint-restart: the job is cancelled on detection and submitted again",
    "in-job": "checkpoint-restart in the job: the srun step is ended and a new one started in the same allocation",
    "in-process": "in-process restart: processes stay, groups are rebuilt, every rank loads the checkpoint",
    "hot-swap": "PHOENIX hot swap from the memory replicas",
}


def _k_sorted(d: dict) -> list:
    return sorted(d.items(), key=lambda kv: int(kv[0]))


def model_command(comp: dict, k: str, mttf_s: float = 3600.0) -> str | None:
    """The ``phoenix model efficiency`` command that takes each baseline's measured restart time at K =
    ``k`` (``restart_s``: the mean over the trials of each one's disruption without its replay; the model adds
    the replay itself) and the hot swap's. A mean total minus a median replay is no restart time: with
    trials that replayed 2 and 87 steps it can come out negative."""
    hs = comp.get("hot-swap", {})
    if hs.get("restart_s") is None:
        return None
    hs_s = hs["restart_s"]
    parts = []
    for n in BASELINES:
        row = comp.get(n, {}).get(k)
        if row and row.get("restart_s") is not None:
            parts.append(f"--baseline {n}={row['restart_s']:.2f}")
    if not parts:
        return None
    return (f"phoenix model efficiency --mttf-s {mttf_s:g} --step-s {PAPER_STEP_S:g} --ckpt-every {k} "
            f"--hotswap-s {hs_s:.2f} " + " ".join(parts))


def render(rec: dict) -> list[str]:
    """The section's Markdown lines (results with a ``comparison``)."""
    L: list[str] = []
    a = L.append
    comp = rec["comparison"]
    n_tr = rec.get("trials")
    a("The same job (model S, pp=2 x dp=2, 4 active nodes and one spare node), the same fault (the node of the "
      "last active rank is killed: slurmd, step daemons and tasks SIGKILLed, after rank 0 finished the fault step) "
      f"and the same machine, for every scheme; {n_tr} trial(s) per scheme and checkpoint interval K, run "
      "interleaved. The schemes:")
    a("")
    for n in rec.get("schemes", []):
        a(f"- **{n}**: {DESCRIPTION.get(n, n)}")
    a("")
    ks_run = [int(k) for k in rec.get("ks", DEFAULT_KS)]
    missing = [k for k in DEFAULT_KS if k not in ks_run]
    if missing:
        a(f"**Reduced run:** measured at K = {', '.join(map(str, ks_run))} only; K = "
          f"{', '.join(map(str, missing))} (`--ks 10,50,100`) were not run this time (every trial is a real job of "
          "one to two minutes on this shared 2-core host). Below, the cost at those K is *computed* from the "
          "measured phases without replay, which do not depend on K.")
        a("")
    a("The baselines write a DCP checkpoint every K steps, restore the newest and **really replay** the lost "
      "steps (the fault step is drawn in [K+1, 2K], so the steps lost are uniform on 1..K and the checkpoint of step K is complete); the hot swap does not "
      "depend on K. Phases (seconds): *detect* fault -> first journal record of it; *teardown* -> the old "
      "processes are gone (requeue: scancel until Slurm shows the job ended; in-job: the step ended and the next "
      "nodes chosen; in-process and hot swap: survivors abandoning the step and answering the quiesce, and the "
      "plan); *relaunch* -> every active rank of the new job/step registered (0 where no process starts); "
      "*init* -> ranks start loading (groups, engine; in-process and hot swap: the journal's reconfigure); "
      "*load* the checkpoint load (hot swap: parameters and optimizer shards from peers and replicas); "
      "*replay* the steps trained again. Medians of the phases; *total* mean [min, max] over the trials; the "
      "ratio is mean disruption / mean hot-swap disruption with a 95 % percentile-bootstrap interval "
      "(2000 resamples of each side; with 3 trials it is wide).")
    a("")
    a("| scheme | K | trials | " + " | ".join(PHASES) + " | steps replayed | total s, mean [min, max] | "
      "ratio to hot swap [95 % CI] |")
    a("| --- | --- | --- | " + " | ".join("---" for _ in PHASES) + " | --- | --- | --- |")
    hs = comp.get("hot-swap", {})
    if hs.get("total_s"):
        t = hs["total_s"]
        a(f"| hot-swap | - | {hs['n']} | " + " | ".join(f"{hs['phases_median'][p]:.2f}" for p in PHASES)
          + f" | {hs['steps_replayed_mean']:.1f} (mean) | **{t['mean']:.2f}** [{t['min']:.2f}, {t['max']:.2f}] | 1 |")
    for n in BASELINES:
        for k, row in _k_sorted(comp.get(n, {})):
            if not row.get("total_s"):
                a(f"| {n} | {k} | 0 | " + " | ".join("-" for _ in PHASES) + " | - | not measured | - |")
                continue
            t, q = row["total_s"], row.get("ratio")
            a(f"| {n} | {k} | {row['n']} | " + " | ".join(f"{row['phases_median'][p]:.2f}" for p in PHASES)
              + f" | {', '.join(str(x) for x in row['steps_replayed'])} | **{t['mean']:.2f}** [{t['min']:.2f}, "
              f"{t['max']:.2f}] | " + (f"**{q['value']:.1f}x** [{q['lo']:.1f}, {q['hi']:.1f}]" if q else "-") + " |")
    a("")
    step_s = comp.get("step_s", PAPER_STEP_S)
    a(f"*Computed, not measured*: the disruption per fault at the paper's {step_s:g} s steps (docs/design.md "
      "section 1) = the measured phases without replay + the expected steps lost x "
      f"{step_s:g} s ((K - 1) / 2 for the baselines, Eq. 2; for the hot swap its measured mean replayed steps plus "
      "half the step in flight, E[phi] = 0.5 of Eq. 5, as `phoenix model efficiency` counts them):")
    a("")
    a("| scheme | K | computed s per fault | computed ratio to hot swap |")
    a("| --- | --- | --- | --- |")
    if hs.get("computed_at_step_s") is not None:
        a(f"| hot-swap | - | {hs['computed_at_step_s']:.1f} | 1 |")
    for n in BASELINES:
        rows = _k_sorted(comp.get(n, {}))
        for k, row in rows:
            if row.get("computed_at_step_s") is not None:
                a(f"| {n} | {k} | {row['computed_at_step_s']:.1f} | {row['computed_ratio']:.1f}x |")
        measured = [(k, row) for k, row in rows if row.get("phases_median")]
        if measured and hs.get("computed_at_step_s"):
            k0, row0 = measured[0]
            for k in missing:
                c = computed_cost(row0["phases_median"], k, step_s)
                a(f"| {n} | {k} (phases of K={k0}) | {c:.1f} | {c / hs['computed_at_step_s']:.1f}x |")
    a("")
    ks = sorted({k for n in BASELINES for k in comp.get(n, {})}, key=int)
    cmds = [c for c in (model_command(comp, k) for k in ks) if c]
    if cmds:
        a("Each baseline's measured restart time (mean disruption without replay) in the cost model of "
          "`phoenix model efficiency` (which adds the replay at the given step time):")
        a("")
        a("```")
        for c in cmds:
            a(c)
        a("```")
        a("")
    a("Every trial (seconds):")
    a("")
    a("| trial | fault step | checkpoint step | steps replayed | " + " | ".join(PHASES) + " | total |")
    a("| --- | --- | --- | --- | " + " | ".join("---" for _ in PHASES) + " | --- |")
    trials = [h for h in rec.get("hotswap", [])] + [t for n in BASELINES
                                                    for _, ts in _k_sorted(rec.get("baselines", {}).get(n, {}))
                                                    for t in ts]
    errors = []
    for t in trials:
        if "total_s" not in t:
            errors.append(f"{t.get('name')}: {' '.join(str(t.get('error')).split())[:300]}")
            continue
        a(f"| {t['name']} | {t.get('fault_step')} | {t.get('checkpoint_step', t.get('recoverable_step'))} | "
          f"{t.get('steps_replayed')} | " + " | ".join(f"{t['phases'][p]:.2f}" for p in PHASES)
          + f" | {t['total_s']:.2f} |")
    a("")
    for e in errors:
        a(f"- failed trial: {e}")
    if errors:
        a("")
    return L
