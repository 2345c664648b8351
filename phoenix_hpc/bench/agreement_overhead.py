"""Per-step cost of replica agreement: the same protected job with the check on and off, in one run
(``python -m phoenix_hpc.bench.agreement_overhead [--update-benchmarks DIR]``; ``scripts/bench-agreement``).

One ``mpirun`` of :mod:`phoenix_hpc.bench.overhead_rank` over ``--ranks`` local ranks (real MPI, real gloo, the
torch engine on CPU), one case whose blocks are all protected and alternate in ABBA order between replica
agreement on (``check-on``: the copy thread's parameter digest, its pair in the commit fence, the commit
records' digests) and off (``check-off``: ``resilience.replica_agreement`` false, what the rank then does),
inside the same processes, so that the drift of a shared machine hits both. What differs between the two is
all the check costs a rank; the coordinator's comparison is not in this run (measured alone by
:mod:`phoenix_hpc.bench.agreement_cost`).

Cleaning as in section 1 (:mod:`phoenix_hpc.bench.overhead`): the job's step time is the slowest rank's; the
warm-up steps and the first step of every block are dropped; the slowest ``trim`` of each mode is trimmed.
:func:`analyze` (pure) gives the ratio of the mean step times on / off with a 95 % percentile-bootstrap CI,
the ratio of the medians, the per-pair ratios of the ABBA pairs' means (their spread: mean, standard
deviation, min, max) and the protection path's CPU time per step with the check on and off.

The result is kept as ``DIR/benchmarks/agreement_overhead.json`` (:data:`phoenix_hpc.bench.report.AGREEMENT_RECORD`)
and shown in section 1 of ``DIR/BENCHMARKS.md``, re-rendered from ``DIR/BENCHMARKS.json`` (the other
sections unchanged). It prints numbers; it is not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from phoenix_hpc.bench import stats as S
from phoenix_hpc.bench.overhead import job_series
from phoenix_hpc.errors import BenchError, ConfigError

ON, OFF = "check-on", "check-off"


def pair_ratios(steps: Sequence[dict], keep: Sequence[int]) -> list[float]:
    """Per ABBA pair (blocks ``2r`` and ``2r + 1``), mean of its kept check-on steps / mean of its kept
    check-off steps (pure; ``steps``: ``{"mode", "block", "v"}``). Pairs missing a side are left out."""
    by: dict[int, dict[str, list[float]]] = {}
    for i in keep:
        s = steps[i]
        if s["mode"] in (ON, OFF):
            by.setdefault(int(s["block"]) // 2, {}).setdefault(s["mode"], []).append(float(s["v"]))
    return [statistics.fmean(p[ON]) / statistics.fmean(p[OFF]) for _, p in sorted(by.items())
            if p.get(ON) and p.get(OFF)]


def protection_cpu_ms(ranks: Sequence[dict]) -> dict[str, float | None]:
    """Median over ranks of each rank's median CPU time of the protection path per step (ms; every
    category of the protector's accounting, the first step of every block dropped), per mode (pure)."""
    out: dict[str, float | None] = {}
    for mode in (ON, OFF):
        per_rank = []
        for r in ranks:
            steps = [sum(x.values()) for b in r["blocks"] if b["mode"] == mode
                     for x in (b.get("stats") or {}).get("cpu_ns_per_step", [])[1:]]
            if steps:
                per_rank.append(statistics.median(steps) / 1e6)
        out[mode] = round(statistics.median(per_rank), 4) if per_rank else None
    return out


def analyze(ranks: Sequence[dict], trim: float = 0.05) -> dict:
    """The check's per-step cost from the rank files of one agreement case (pure).

    Raises BenchError when a mode has no kept step or the ranks recorded different numbers of steps."""
    steps = job_series(ranks, "step_ms")
    keep = S.kept_steps(steps)
    on = [steps[i]["v"] for i in keep if steps[i]["mode"] == ON]
    off = [steps[i]["v"] for i in keep if steps[i]["mode"] == OFF]
    if not on or not off:
        raise BenchError(f"agreement case: kept steps with the check on {len(on)}, off {len(off)}: need both")
    t_on, t_off = S.trim_slowest(on, trim), S.trim_slowest(off, trim)
    pairs = pair_ratios(steps, keep)
    cpu = protection_cpu_ms(ranks)
    d2h = {m: round(statistics.fmean(b["stats"]["d2h_mean_s"] for r in ranks for b in r["blocks"]
                                     if b["mode"] == m) * 1e3, 3) for m in (ON, OFF)}
    return {
        "steps_on": len(t_on), "steps_off": len(t_off), "trim": trim,
        "step_ms_on": S.summarize(t_on).as_dict(), "step_ms_off": S.summarize(t_off).as_dict(),
        "mean_ratio": S.mean_ratio(t_on, t_off).as_dict(), "median_ratio": S.median_ratio(t_on, t_off).as_dict(),
        "pair_ratios": [round(x, 4) for x in pairs],
        "pair_ratio_mean": round(statistics.fmean(pairs), 4) if pairs else None,
        "pair_ratio_stdev": round(statistics.stdev(pairs), 4) if len(pairs) > 1 else None,
        "protection_cpu_ms_per_step": {"on": cpu[ON], "off": cpu[OFF]},
        "d2h_ms_mean": {"on": d2h[ON], "off": d2h[OFF]},
        "raw": {"on_ms": on, "off_ms": off},
    }


def write_case(folder: Path, data_path: str, *, ranks: int, size: str, seq_length: int | None, global_batch: int,
               micro_batch: int, warmup: int, block_steps: int, rounds: int) -> Path:
    """The case's job config and its ``.bench.json`` (``"compare": "agreement"``) in ``folder``."""
    from phoenix_hpc.bench import jobs

    cfg = jobs.job_config(name="bench-agreement", size=size, pp=1, nodes=ranks, spares=0, steps=100000,
                          data_path=data_path, resilience={"k": 1}, seq_length=seq_length,
                          global_batch=global_batch, micro_batch=micro_batch)
    p = jobs.write_yaml(folder / "agreement.yaml", cfg)
    p.with_suffix(".bench.json").write_text(json.dumps(
        {"name": "agreement", "warmup": warmup, "block_steps": block_steps, "rounds": rounds, "memory": False,
         "pinned": False, "bound": False, "compare": "agreement"}))
    return p


def summary_lines(res: dict) -> list[str]:
    """The result in words (pure): what :func:`main` prints and section 1 of BENCHMARKS.md shows."""
    a = res["analysis"]
    m, md = a["mean_ratio"], a["median_ratio"]
    on, off = a["step_ms_on"], a["step_ms_off"]
    load = res.get("load_avg_1m") or {}
    cpu = a["protection_cpu_ms_per_step"]
    pairs = a["pair_ratios"]
    out = [f"step time with replica agreement on / off: mean ratio **{m['value']:.4f}** [95 % CI {m['lo']:.4f}, "
           f"{m['hi']:.4f}] (means {on['mean']:.1f} / {off['mean']:.1f} ms, {a['steps_on']}/{a['steps_off']} steps); "
           f"ratio of medians {md['value']:.4f} [{md['lo']:.4f}, {md['hi']:.4f}]",
           f"per ABBA pair (ratio of the pair's mean step times): {', '.join(f'{x:.4f}' for x in pairs)}"
           + (f"; mean {a['pair_ratio_mean']:.4f}, standard deviation {a['pair_ratio_stdev']:.4f}, spread "
              f"{min(pairs):.4f} .. {max(pairs):.4f}" if len(pairs) > 1 else "")]
    if m["lo"] <= 1.0 <= m["hi"]:
        out.append(f"the 95 % CI of the mean ratio contains 1 (width {100 * (m['hi'] - m['lo']):.1f} % of a step): no "
                   "difference between the check on and off is resolved in this run")
    else:
        out.append(f"the 95 % CI of the mean ratio excludes 1: the step time differed by "
                   f"{100 * (m['value'] - 1):+.1f} % with the check on in this run")
    if cpu.get("on") is not None and cpu.get("off") is not None:
        out.append(f"protection path's CPU time per step and rank (median): on {cpu['on']:.3f} ms, off "
                   f"{cpu['off']:.3f} ms; D2H + checksums + digest per snapshot (mean): on "
                   f"{a['d2h_ms_mean']['on']:.2f} ms, off {a['d2h_ms_mean']['off']:.2f} ms")
    out.append(f"load: 1-minute load average {load.get('before')} before, {load.get('after')} after, on "
               f"{res.get('cores')} logical CPUs shared with other work")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m phoenix_hpc.bench.agreement_overhead",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=2, help="MPI ranks (dp = ranks; default 2)")
    ap.add_argument("--size", default="M", help="model size of bench/jobs.py MODEL_SIZES (default M)")
    ap.add_argument("--seq", type=int, default=256, help="sequence length (default 256)")
    ap.add_argument("--global-batch", type=int, default=24)
    ap.add_argument("--micro-batch", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=4, help="ABBA on/off pairs (default 4)")
    ap.add_argument("--block-steps", type=int, default=10, help="steps per block (default 10)")
    ap.add_argument("--warmup", type=int, default=5, help="unprotected warm-up steps (default 5)")
    ap.add_argument("--trim", type=float, default=0.05, help="fraction of each mode's slowest steps dropped")
    ap.add_argument("--json", dest="json_path", default=None, help="also write the result to this file")
    ap.add_argument("--update-benchmarks", default=None, metavar="DIR",
                    help="keep the result in DIR/benchmarks/agreement_overhead.json and section 1 of DIR/BENCHMARKS.md")
    a = ap.parse_args(argv)
    for name, v, lo in (("--ranks", a.ranks, 2), ("--rounds", a.rounds, 1), ("--block-steps", a.block_steps, 3),
                        ("--warmup", a.warmup, 1), ("--seq", a.seq, 1), ("--global-batch", a.global_batch, 1),
                        ("--micro-batch", a.micro_batch, 1)):
        if v < lo:
            print(f"error: {name}: {v} is not allowed; expected an integer >= {lo}", file=sys.stderr)
            return 2
    if not 0 <= a.trim < 0.5:
        print(f"error: --trim: {a.trim} is not allowed; expected 0 <= trim < 0.5", file=sys.stderr)
        return 2
    from phoenix_hpc.bench import jobs

    if a.size not in jobs.MODEL_SIZES:
        print(f"error: --size: {a.size!r} is not allowed; expected one of {', '.join(jobs.MODEL_SIZES)}", file=sys.stderr)
        return 2
    from phoenix_hpc.bench import report

    bad = report.output_error(a.json_path, a.update_benchmarks)
    if bad:
        print(f"error: {bad}", file=sys.stderr)
        return 2
    from phoenix_hpc.config.load import load_job_config
    from phoenix_hpc.data.prepare import prepare_dataset, stdlib_dir

    repo = Path(__file__).resolve().parents[2]
    command = (f"python -m phoenix_hpc.bench.agreement_overhead --ranks {a.ranks} --size {a.size} --seq {a.seq} "
               f"--global-batch {a.global_batch} --micro-batch {a.micro_batch} --rounds {a.rounds} "
               f"--block-steps {a.block_steps} --warmup {a.warmup} --trim {a.trim:g}")
    measured = {"commit": jobs.git_commit(repo), "dirty_files": jobs.dirty_files(repo), "command": command}
    work = Path(tempfile.mkdtemp(prefix="phx-agreement-"))
    cfg = write_case(work, str(work / "data" / "text"), ranks=a.ranks, size=a.size, seq_length=a.seq,
                     global_batch=a.global_batch, micro_batch=a.micro_batch, warmup=a.warmup,
                     block_steps=a.block_steps, rounds=a.rounds)
    try:  # the ranks load it as a job config: a case the flags make invalid is refused here, not by them
        load_job_config(cfg)
    except ConfigError as exc:
        shutil.rmtree(work, ignore_errors=True)
        print(f"error: --global-batch/--micro-batch/--seq/--ranks make a job config that is not allowed: {exc}",
              file=sys.stderr)
        return 2
    prepare_dataset(stdlib_dir(), work / "data" / "text", max_bytes=4_000_000)
    out = work / "out"
    out.mkdir()
    launch = ["mpirun", "--oversubscribe", "-n", str(a.ranks)] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    load_before = os.getloadavg()
    t0 = time.time()
    p = subprocess.run(launch + [sys.executable, "-m", "phoenix_hpc.bench.overhead_rank", str(out), str(cfg)],
                       env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       text=True)
    wall = time.time() - t0
    if p.returncode != 0:
        print(f"error: the ranks exited {p.returncode}: {p.stderr[-2000:]}", file=sys.stderr)
        return 1
    ranks = [json.loads((out / f"case0.rank{r}.json").read_text()) for r in range(a.ranks)]
    res = {"date": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()), "wall_s": round(wall, 1), **measured,
           "load_avg_1m": {"before": round(load_before[0], 2), "after": round(os.getloadavg()[0], 2)},
           "cores": os.cpu_count(), "ranks": a.ranks, "size": a.size, "params": jobs.model_params(a.size, seq_length=a.seq),
           "seq_length": a.seq, "global_batch": a.global_batch, "rounds": a.rounds, "block_steps": a.block_steps,
           "warmup": a.warmup, "checksum": ranks[0]["checksum"], "analysis": analyze(ranks, a.trim)}
    for line in summary_lines(res):
        print(line.replace("**", ""))
    print(f"({command}; {wall:.0f} s; work folder {work})")
    if a.json_path:
        Path(a.json_path).write_text(json.dumps(res, indent=1) + "\n")
    if a.update_benchmarks:
        report.keep_record(Path(a.update_benchmarks), "agreement_overhead", res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
