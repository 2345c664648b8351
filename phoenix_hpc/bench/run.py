"""Run every benchmark section on a running local cluster and write the report.

``python -m phoenix_hpc.bench.run --cluster-dir DIR --work-dir DIR --out-dir DIR [--quick] [--sections ...]``
(``scripts/bench.sh`` starts the cluster, calls this and stops the cluster.)

Sections (numbering of the report): 1 overhead and 4 memory (one job, :mod:`.overhead`), 2 hot swap
against checkpoint-restart and 3 hot-swap scaling (:mod:`.recovery`), with what grows with the model size
(``by_size``, :mod:`.by_size`; kept in BENCHMARKS.json as ``recovery_by_size``). A section that cannot run records
why (``"not measured: ..."``) instead of numbers; nothing is estimated in place of a measurement.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import random
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from phoenix_hpc.bench import jobs
from phoenix_hpc.bench import stats as S
from phoenix_hpc.errors import BenchError

SECTIONS = ("overhead", "recovery", "scaling", "by_size")
#: The key of BENCHMARKS.json each section's results are kept under.
SECTION_KEYS = {"overhead": "overhead", "recovery": "recovery", "scaling": "scaling", "by_size": "recovery_by_size"}


@dataclass
class Context:
    """What every trial needs: the cluster, a Slurm client pointed at it, folders, killed nodes."""

    cluster: object
    client: object
    env: dict
    work: Path
    data_path: str
    killed: list = field(default_factory=list)
    log: object = print

    def revive(self) -> None:
        """Bring back every node killed so far (waits until each is idle)."""
        from phoenix_hpc.slurm.cluster import load_cluster, revive_node

        while self.killed:
            node = self.killed.pop()
            self.cluster = load_cluster(self.cluster.run_dir)
            revive_node(self.cluster, node, wait_idle_s=60)


def hotswap_available() -> tuple[bool, str]:
    """Whether this build executes hot swaps on the rank side (``phoenix_hpc.launch.execute`` exists and
    the rank entry point uses it)."""
    import importlib.util

    if importlib.util.find_spec("phoenix_hpc.launch.execute") is None:
        return False, "phoenix_hpc.launch.execute does not exist in this build"
    src = Path(importlib.util.find_spec("phoenix_hpc.launch.rank").origin).read_text()
    if "execute" not in src:
        return False, "the rank entry point does not call the hot-swap execution"
    return True, ""


def persist_wired() -> tuple[bool, str]:
    """Whether the rank entry point writes/restores persistent checkpoints (launch/persist)."""
    import importlib.util

    src = Path(importlib.util.find_spec("phoenix_hpc.launch.rank").origin).read_text()
    if "save_if_due" in src and "restore_latest" in src:
        return True, ""
    return False, "the rank entry point does not call launch/persist (no checkpoint-restart in this build)"


def _try(name: str, fn, log):
    t0 = time.time()
    try:
        out = fn()
        log(f"[bench] {name}: done in {time.time() - t0:.0f} s")
        return out
    except BenchError as exc:
        log(f"[bench] {name}: FAILED: {exc}")
        return {"name": name, "error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - one failed trial must not lose the others' numbers
        log(f"[bench] {name}: FAILED: {type(exc).__name__}: {exc}")
        traceback.print_exc()
        return {"name": name, "error": f"{type(exc).__name__}: {exc}"}


def section_recovery(ctx: Context, quick: bool, seed: int, baselines: tuple[str, ...] | None = None,
                     ks: tuple[int, ...] | None = None, trials: int | None = None) -> dict:
    """Section 2: every scheme of :mod:`phoenix_hpc.bench.baselines` on the same job (model S, pp=2 x dp=2,
    4 active nodes, one spare) and the same fault, ``trials`` times per baseline and K (fault step drawn in
    [K+1, 2K]), and the hot swap ``trials`` times; then the comparison (:func:`baselines.summarize`)."""
    from phoenix_hpc.bench import baselines as B
    from phoenix_hpc.bench import recovery as R

    rng = random.Random(seed)
    ks = tuple(ks or B.DEFAULT_KS)
    names = tuple(baselines or B.BASELINES)
    trials = trials or (1 if quick else 3)
    hs_ok, hs_why = hotswap_available()
    ck_ok, ck_why = persist_wired()
    if quick:
        ck_ok, ck_why = False, "not run in --quick mode (a job per trial and interval K)"
    out: dict = {"seed": seed, "grid": "pp=2 x dp=2", "size": "S", "trials": trials, "ks": list(ks),
                 "schemes": list(names) + ["hot-swap"], "hotswap": [], "baselines": {n: {} for n in names},
                 "hotswap_unavailable": None if hs_ok else hs_why, "baseline_unavailable": None if ck_ok else ck_why}
    runners = {"requeue": R.run_baseline, "in-job": R.run_in_job, "in-process": R.run_in_process}
    modes = {"requeue": "checkpoint-restart", "in-job": "checkpoint-restart", "in-process": "phoenix"}
    jobs_in_order = []
    for i in range(trials):  # interleaved: a drift of the shared machine hits every scheme alike
        if hs_ok:
            jobs_in_order.append(("hot-swap", None, R.Trial(f"hotswap-{i}", "phoenix", 4, "S", 2,
                                                            fault_step=10 + rng.randrange(10))))
        if ck_ok:
            for k in ks:
                for n in names:
                    t = R.Trial(f"{n}-K{k}-{i}", modes[n], 4, "S", 2, R.draw_fault_step(rng, k), k, scheme=n)
                    jobs_in_order.append((n, k, t))
    for n, k, t in jobs_in_order:
        if n == "hot-swap":
            out["hotswap"].append(_try(t.name, lambda t=t: R.hot_swap_six_phases(R.run_hotswap(t, ctx)), ctx.log))
        else:
            res = _try(t.name, lambda t=t, n=n: runners[n](t, ctx), ctx.log)
            out["baselines"][n].setdefault(str(k), []).append(res)
    out["comparison"] = B.summarize(out["baselines"], out["hotswap"], seed=seed)
    return out


def section_scaling(ctx: Context, quick: bool, seed: int) -> dict:
    from phoenix_hpc.bench import recovery as R

    ok, why = hotswap_available()
    if not ok:
        return {"unavailable": f"hot swap unavailable: {why}", "by_slots": [], "by_size": []}
    if quick:
        return {"unavailable": "not run in --quick mode (each point is a job of its own)", "by_slots": [], "by_size": []}
    rng = random.Random(seed + 1)
    slots = (2, 4) if quick else (2, 3, 4, 5)  # + 1 spare: the local site allows 6 nodes per job
    sizes = ("S", "M") if quick else ("S", "M", "L")
    out: dict = {"by_slots": [], "by_size": [], "size_at_slots": "S", "slots_at_size": 4}
    for n in slots:
        t = R.Trial(f"scale-n{n}", "phoenix", n, "S", 1, fault_step=8 + rng.randrange(5))
        out["by_slots"].append(_try(t.name, lambda t=t: R.run_hotswap(t, ctx), ctx.log))
    for s in sizes:
        if s == "S" and 4 in slots:
            out["by_size"].append(next(x for x in out["by_slots"] if x.get("nodes") == 4 or x.get("name") == "scale-n4"))
            continue
        t = R.Trial(f"scale-{s}", "phoenix", 4, s, 1, fault_step=8 + rng.randrange(5))
        out["by_size"].append(_try(t.name, lambda t=t: R.run_hotswap(t, ctx), ctx.log))
    return out


def section_by_size(ctx: Context, quick: bool, seed: int, commit: str) -> dict:
    """Section 3's "what grows with the model" (:mod:`.by_size`): models S and L, :data:`.by_size.DEFAULT_TRIALS`
    jobs each, interleaved; not run in ``--quick`` mode. A failed trial ends the section with its error
    (``{"name", "error"}``)."""
    from phoenix_hpc.bench import by_size

    ok, why = hotswap_available()
    if not ok:
        return {"unavailable": f"hot swap unavailable: {why}"}
    if quick:
        return {"unavailable": "not run in --quick mode (each trial is a job of its own)"}

    def measure() -> dict:
        runs = by_size.measure(ctx, by_size.DEFAULT_SIZES, by_size.DEFAULT_TRIALS, seed=seed + 2,
                               on_trial=lambda s, r: ctx.log(f"[bench] by_size {s}: total {r['total_s']:.2f} s"))
        return by_size.section(runs, commit, "scripts/bench.sh (section by_size)")

    return _try("by_size", measure, ctx.log)


def model_fit(points: list[dict], work: Path) -> dict:
    """Feed the slots-scaling points to ``phoenix model fit`` (CSV ``gpus,seconds``); returns its JSON."""
    import subprocess

    good = [p for p in points if "total_s" in p]
    if len(good) < 2:
        return {"error": f"only {len(good)} scaling point(s) measured; the fit needs at least 2"}
    csv = work / "scaling-points.csv"
    csv.write_text("gpus,seconds\n" + "".join(f"{p['nodes']},{p['total_s']}\n" for p in good))
    rows = [{"gpus": p["nodes"], "seconds": p["total_s"]} for p in good]
    proc = subprocess.run([*jobs.PHOENIX_CLI, "model", "fit", "--csv", str(csv), "--json"],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        return {"error": f"phoenix model fit exited {proc.returncode}: {proc.stderr.strip()[:500]}", "csv": csv.name,
                "points": rows}
    try:
        return {"csv": csv.name, "points": rows, "result": json.loads(proc.stdout)}
    except json.JSONDecodeError:
        return {"csv": csv.name, "points": rows, "text": proc.stdout.strip()[:2000]}


def keep_previous_sections(results: dict, previous: Path, ran: list[str]) -> dict:
    """``results`` plus each section of :data:`SECTIONS` this run did not run, taken from the previous
    ``BENCHMARKS.json`` (if it has it) and marked ``kept_from`` ("<date>, commit <commit>"), so that a run of
    one section regenerates the report without losing the others' numbers. ``results["kept_sections"]``
    lists them."""
    try:
        old = json.loads(previous.read_text()) if previous.exists() else {}
    except (OSError, ValueError):
        old = {}
    kept = []
    for name in SECTIONS:
        key = SECTION_KEYS[name]
        if name in ran or not isinstance(old.get(key), dict):
            continue
        sec = dict(old[key])
        sec.setdefault("kept_from", f"{old.get('date')}, commit {old.get('commit')}")
        results[key] = sec
        kept.append(name)
    if kept:
        results["kept_sections"] = kept
    return results


def summarize_top(results: dict) -> dict:
    """The top-level keys of BENCHMARKS.json (pure): overhead_ratio, exposed_wait_ms, hotswap_s, detect_s,
    ckpt_restart_s {K: s}, disruption_ratio, host_mem_ratio."""
    top: dict = {}
    cases = results.get("overhead", {}).get("cases", [])
    if cases:
        top["overhead_ratio"] = statistics.median(c["ratio"]["value"] for c in cases)
        top["exposed_wait_ms"] = statistics.median(c["exposed_wait_ms"]["median"] for c in cases)
    else:
        top["overhead_ratio"] = top["exposed_wait_ms"] = None
    mem = results.get("overhead", {}).get("memory", {})
    top["host_mem_ratio"] = mem["k1"]["ratio_median"] if "k1" in mem else None
    rec = results.get("recovery", {})
    hs = [h for h in rec.get("hotswap", []) if "total_s" in h]
    top["hotswap_s"] = statistics.median(h["total_s"] for h in hs) if hs else None
    top["detect_s"] = statistics.median(h["phases"]["detect"] for h in hs) if hs else None
    comp = rec.get("comparison")
    if comp:  # every baseline, mean over trials per K; ratios of means against the hot swap with 95 % CIs
        top["restart_s"] = {n: {k: v["total_s"]["mean"] for k, v in by_k.items() if v.get("total_s")}
                            for n, by_k in comp.items() if n in rec.get("baselines", {})}
        top["disruption_ratios"] = {n: {k: v["ratio"] for k, v in by_k.items() if v.get("ratio")}
                                    for n, by_k in comp.items() if n in rec.get("baselines", {})}
        top["ckpt_restart_s"] = top["restart_s"].get("requeue", {})
        r100 = top["disruption_ratios"].get("requeue", {}).get("100")
        top["disruption_ratio"] = r100["value"] if r100 else None
        return top
    base = rec.get("baseline", {})
    top["ckpt_restart_s"] = {k: v["total_s"] for k, v in base.items() if "total_s" in v}
    k100 = top["ckpt_restart_s"].get("100")
    top["disruption_ratio"] = S.disruption_ratio(k100, top["hotswap_s"]) if k100 and top["hotswap_s"] else None
    return top


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="phoenix-bench")
    ap.add_argument("--cluster-dir", required=True)
    ap.add_argument("--work-dir", required=True)
    ap.add_argument("--out-dir", required=True, help="where BENCHMARKS.md/.json and the PNGs go")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--baselines", default=None, help="comma-separated subset of requeue,in-job,in-process")
    ap.add_argument("--ks", default=None, help="checkpoint intervals K, comma-separated (default 10,50,100)")
    ap.add_argument("--trials", type=int, default=None, help="trials per scheme and K (default 3; 1 with --quick)")
    a = ap.parse_args(argv)
    sections = [s for s in a.sections.split(",") if s]
    bad = [s for s in sections if s not in SECTIONS]
    if bad:
        print(f"error: --sections: {bad} not in {list(SECTIONS)}", file=sys.stderr)
        return 2
    from phoenix_hpc.bench import baselines as B

    try:
        names = B.parse_baselines(a.baselines) if a.baselines is not None else None
        ks = B.parse_ks(a.ks) if a.ks is not None else None
        trials = B.parse_trials(a.trials) if a.trials is not None else None
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    from phoenix_hpc.bench import report
    from phoenix_hpc.data.prepare import prepare_dataset, stdlib_dir
    from phoenix_hpc.profiles import load_profile
    from phoenix_hpc.slurm.client import SlurmClient
    from phoenix_hpc.slurm.cluster import load_cluster

    t0 = time.time()
    cluster = load_cluster(a.cluster_dir)
    client = SlurmClient(env=cluster.env)
    work = Path(a.work_dir).absolute()
    work.mkdir(parents=True, exist_ok=True)
    data = work / "data" / "stdlib"
    if not Path(str(data) + ".idx").exists():
        prepare_dataset(stdlib_dir(), data, max_bytes=4_000_000)
    ctx = Context(cluster=cluster, client=client, env=cluster.env, work=work, data_path=str(data),
                  log=lambda m: print(m, flush=True))
    repo = Path(__file__).resolve().parents[2]
    results: dict = {
        "mode": "quick" if a.quick else "full",
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": jobs.git_commit(repo),
        "dirty_files": jobs.dirty_files(repo),
        "machine": {**jobs.machine_info(client.slurm_version()), "cluster_nodes": len(cluster.nodes),
                    "torch_huge_pages": load_profile("local").launcher.torch_huge_pages},
        "seed": a.seed,
    }
    try:
        if "overhead" in sections:
            from phoenix_hpc.bench import overhead

            results["overhead"] = _try("overhead+memory", lambda: overhead.run(client, work, str(data), a.quick, ctx.log), ctx.log)
        if "recovery" in sections:
            results["recovery"] = section_recovery(ctx, a.quick, a.seed, names, ks, trials)
        if "scaling" in sections:
            results["scaling"] = section_scaling(ctx, a.quick, a.seed)
            if not results["scaling"].get("unavailable"):
                results["scaling"]["fit"] = model_fit(results["scaling"].get("by_slots", []), work)
        if "by_size" in sections:
            results["recovery_by_size"] = section_by_size(ctx, a.quick, a.seed, results["commit"])
    finally:
        ctx.revive()
    results["wall_s"] = round(time.time() - t0, 1)
    out = Path(a.out_dir).absolute()
    results = keep_previous_sections(results, out / "BENCHMARKS.json", sections)
    results.update(summarize_top(results))
    report.with_gpu_reports(results, repo)  # the kept runs of scripts/gpu-check.sh
    report.with_kept_records(results, repo)  # section 5, kept in the repository whatever --out-dir is
    report.with_provenance(results, repo)  # each section's commit; code changed since a kept section's run
    report.write_all(results, out, {str(work): "<work>", str(repo): "<repo>"})
    print(f"[bench] wrote {out / 'BENCHMARKS.md'} and {out / 'BENCHMARKS.json'} in {results['wall_s']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
