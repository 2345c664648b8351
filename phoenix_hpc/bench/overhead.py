"""Sections 1 (per-step overhead) and 4 (host memory) of the benchmarks.

One batch job on the local cluster (4 nodes, one slot each) runs one srun step of
:mod:`phoenix_hpc.bench.overhead_rank` over every 4-rank case: protection on and off interleaved in ABBA
blocks inside the same processes, then two memory cases (dp=4, k=1 and k=2); a second job of 2 nodes runs
the 2-rank cases the same way (its ranks not bound to cores, then each bound to one). :func:`analyze_case` and
:func:`analyze_memory` are pure functions of the rank files.

Cleaning of the step times (the published method, :mod:`phoenix_hpc.bench.stats`): the job's time of a
step is the slowest rank's; the ``warmup`` unprotected steps at the start of a case are dropped; the first
step of every block is dropped too (an on block's first step writes freshly allocated buffers and starts
the runtime's threads; the same is dropped from off blocks for symmetry); then the slowest ``trim`` of each
mode is trimmed and the ratio of the medians is taken with a bootstrap CI.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from phoenix_hpc.bench import jobs
from phoenix_hpc.bench import stats as S
from phoenix_hpc.bench.cpu_demand import analyze_demand
from phoenix_hpc.errors import BenchError


@dataclass(frozen=True)
class Case:
    """One overhead/memory case: model ``size``, pipeline depth ``pp`` over ``ranks`` ranks (one per node),
    ``k`` replicas."""

    name: str
    size: str
    pp: int
    k: int = 1
    warmup: int = 10
    block_steps: int = 10
    rounds: int = 4
    memory: bool = False
    pinned: bool = False  # "GPU-like": compute on one core, the protection threads on the others
    ranks: int = 4
    bound: bool = False  # every rank's process bound to one core (bench/overhead_rank.bound_cpu)
    seq_length: int | None = None  # None: the size's (jobs.MODEL_SIZES)
    global_batch: int = 8
    micro_batch: int = 2

    @property
    def grid(self) -> str:
        return f"pp={self.pp} x dp={self.ranks // self.pp}"

    @property
    def seq(self) -> int:
        """The sequence length the case trains with."""
        return jobs.MODEL_SIZES[self.size]["seq_length"] if self.seq_length is None else self.seq_length


def plan_cases(quick: bool) -> list[Case]:
    """Cases of sections 1 and 4. Full: sizes S and M x grids dp=4 and pp=2 x dp=2 (k=1), 3 ABBA rounds
    of 8-step blocks; plus memory cases M, dp=4, k=1 and k=2 (run first); the pinned GPU-like case of the
    larger size; and, in a job of its own, the larger size on 2 ranks (dp=2, k=1, sequence length 256,
    global batch 24), unbound and bound. Quick: size S only, 2 rounds of 6-step blocks, memory cases on
    size S."""
    rounds, block = (2, 6) if quick else (3, 8)
    msize = "S" if quick else "M"
    sizes = ("S",) if quick else ("S", "M")
    cases = [Case(f"mem-{msize}-k{k}", msize, 1, k, 2, 4, 1, memory=True) for k in (1, 2)]
    cases += [Case(f"{size}-pp{pp}", size, pp, 1, 10, block, rounds) for size in sizes for pp in (1, 2)]
    # GPU-like: every rank's training thread on the first allowed core, the protection
    # threads (phoenix-copy, phoenix-h2h) on the others, as on a GPU node where compute is off the host cores
    cases.append(Case(f"{sizes[-1]}-pp1-pinned", sizes[-1], 1, 1, 10, block, rounds, pinned=True))
    # 2 ranks on the 2-core host with the model and batch of scripts/bench-overhead (which runs one process
    # per mode): M at sequence length 256, a global batch of 24
    if not quick:
        for bound in (False, True):  # unbound as the local cluster starts ranks (no task binding), then one core each
            cases.append(Case(f"{sizes[-1]}-dp2" + ("-bound" if bound else ""), sizes[-1], 1, 1, 10, block, rounds,
                              ranks=2, bound=bound, seq_length=256, global_batch=24, micro_batch=12))
    return cases


def target_ratio(case: "Case | dict") -> float:
    """The overhead target of a case: 1.02 for the pinned GPU-like case and for 2 ranks, 1.15 for 4 ranks
    sharing the cores with their protection threads."""
    get = case.get if isinstance(case, dict) else lambda k, d=None: getattr(case, k, d)
    return 1.02 if get("pinned") or get("ranks", 4) == 2 else 1.15


def write_cases(cases: Sequence[Case], folder: Path, data_path: str) -> list[Path]:
    paths = []
    for i, c in enumerate(cases):
        cfg = jobs.job_config(name=f"bench-{c.name}", size=c.size, pp=c.pp, nodes=c.ranks, spares=0, steps=100000,
                              data_path=data_path, resilience={"k": c.k}, seq_length=c.seq_length,
                              global_batch=c.global_batch, micro_batch=c.micro_batch)
        p = jobs.write_yaml(folder / f"case{i}.yaml", cfg)
        p.with_suffix(".bench.json").write_text(json.dumps(
            {"name": c.name, "warmup": c.warmup, "block_steps": c.block_steps, "rounds": c.rounds,
             "memory": c.memory, "pinned": c.pinned, "bound": c.bound}))
        paths.append(p)
    return paths


def run(client, work: Path, data_path: str, quick: bool, log=print) -> dict:
    """Run the overhead/memory jobs (one per rank count, the 4-rank one first); returns ``{"cases": [...],
    "memory": {...}, "job_id", "job_ids", "wall_s"}`` (cases in :func:`plan_cases` order).

    Raises BenchError when a job fails or a rank file is missing (the job's output file is named)."""
    import time

    from phoenix_hpc.profiles import load_profile
    from phoenix_hpc.slurm.render import environment_lines

    folder = work / "overhead"
    # the ranks' environment of a job on the local cluster (its site profile), as phoenix submit renders it
    env_lines = "".join(f"{ln}\n" for ln in environment_lines(load_profile("local")))
    out = folder / "out"
    out.mkdir(parents=True, exist_ok=True)
    cases = plan_cases(quick)
    paths = write_cases(cases, folder, data_path)
    t0 = time.time()
    job_ids, t1 = [], t0
    files: dict[int, tuple[Path, Path]] = {}  # case index -> (its rank files' prefix, its job's output file)
    for n in sorted({c.ranks for c in cases}, reverse=True):
        mine = [i for i, c in enumerate(cases) if c.ranks == n]
        tag = "overhead" if n == 4 else f"overhead-{n}ranks"
        job_out = out / f"{n}ranks"
        job_out.mkdir(exist_ok=True)
        # overhead_rank numbers the cases of its own job from 0
        files.update({i: (job_out / f"case{j}", folder / f"{tag}.out") for j, i in enumerate(mine)})
        body = (env_lines + f"srun --mpi=pmix --nodes={n} --ntasks-per-node=1 {sys.executable} -m phoenix_hpc.bench.overhead_rank "
                + " ".join(str(x) for x in [job_out, *(paths[i] for i in mine)]) + "\n")
        job_id = jobs.submit_batch(client, folder / f"{tag}.sbatch", body, nodes=n, name=f"bench-{tag}")
        log(f"[bench] overhead/memory: job {job_id}, {len(mine)} cases on {n} ranks")
        state, t1 = jobs.wait_job_end(client, job_id, timeout_s=900)
        if state not in (None, "COMPLETED"):
            raise BenchError(f"overhead job {job_id} ended {state}; see {folder / (tag + '.out')}")
        job_ids.append(job_id)
    results, memory = [], {}
    for i, c in enumerate(cases):
        ranks = []
        for r in range(c.ranks):
            f = Path(f"{files[i][0]}.rank{r}.json")
            if not f.exists():
                raise BenchError(f"overhead case {c.name}: {f} missing; see {files[i][1]}")
            ranks.append(json.loads(f.read_text()))
        if c.memory:
            memory[f"k{c.k}"] = analyze_memory(ranks, c)
        else:
            results.append(analyze_case(ranks, c))
    return {"job_id": job_ids[0], "job_ids": job_ids, "wall_s": round(t1 - t0, 1), "cases": results,
            "memory": memory}


def job_series(ranks: Sequence[dict], key: str) -> list[dict]:
    """Per step of the case: mode, block and the slowest rank's ``key`` (the job's step time is the slowest
    rank's). Raises BenchError when the ranks recorded different numbers of steps. Pure."""
    n = {len(r["steps"]) for r in ranks}
    if len(n) != 1:
        raise BenchError(f"ranks recorded different numbers of steps: {sorted(n)}")
    out = []
    for i in range(n.pop()):
        s0 = ranks[0]["steps"][i]
        out.append({"mode": s0["mode"], "block": s0["block"], "v": max(r["steps"][i][key] for r in ranks)})
    return out


def analyze_case(ranks: Sequence[dict], case: Case, trim: float = 0.05) -> dict:
    """Per-step overhead of one case from its rank files (pure)."""
    steps = job_series(ranks, "step_ms")
    waits = job_series(ranks, "wait_ms")
    keep = S.kept_steps(steps)
    on = [steps[i]["v"] for i in keep if steps[i]["mode"] == "on"]
    off = [steps[i]["v"] for i in keep if steps[i]["mode"] == "off"]
    wait = [waits[i]["v"] for i in keep if waits[i]["mode"] == "on"]
    t_on, t_off = S.trim_slowest(on, trim), S.trim_slowest(off, trim)
    ratio = S.median_ratio(t_on, t_off)
    blocks = [b for r in ranks for b in r["blocks"] if b["mode"] == "on"]
    d2h = statistics.fmean(b["stats"]["d2h_mean_s"] for b in blocks) * 1e3
    h2h = statistics.fmean(b["stats"]["h2h_mean_s"] for b in blocks) * 1e3
    on_s, off_s = S.summarize(t_on), S.summarize(t_off)
    cpu = analyze_cpu(ranks)
    return {
        "name": case.name, "size": case.size, "params": jobs.model_params(case.size, seq_length=case.seq),
        "grid": case.grid, "k": case.k, "pinned": case.pinned, "ranks": case.ranks, "bound": case.bound,
        "seq_length": case.seq, "global_batch": case.global_batch, "target": target_ratio(case), "thread_nice": ranks[0].get("thread_nice"),
        "steps_on": len(t_on), "steps_off": len(t_off), "warmup": case.warmup, "trim": trim,
        "step_ms_on": on_s.as_dict(), "step_ms_off": off_s.as_dict(),
        "ratio": ratio.as_dict(), "exposed_wait_ms": S.summarize(wait).as_dict(),
        "d2h_ms_mean": round(d2h, 2), "h2h_ms_mean": round(h2h, 2),
        "snapshot_bytes": ranks[0]["snapshot_bytes"], "host_buffer_bytes": ranks[0]["host_buffer_bytes"],
        "cpu": cpu,
        "demand": analyze_demand(ranks, sum(p["cpu_ms_total_per_step"] for p in cpu["ranks"]) if cpu["ranks"] else None),
        "raw": {"on_ms": on, "off_ms": off, "wait_ms": wait},
    }


def analyze_cpu(ranks: Sequence[dict]) -> dict:
    """CPU cost of the protection path per protected byte (pure), from the rank files of one case.

    Per rank: the protector's CPU nanoseconds per step and category (copy, checksum, mpi, bookkeeping;
    :mod:`phoenix_hpc.runtime.cpu_account`), the first step of every on block dropped, median over the
    steps, divided by the rank's *protected bytes* (its snapshot); next to it the *limit*: what the bytes
    of one step cost at this machine's measured memcpy and checksum speed (same run, same rank) --
    memcpy x (snapshot + replica bytes sent + replica bytes received: one copy each, the least a
    transport can do) + checksum x (snapshot + replica bytes received: each byte checksummed once where
    it lands). ``ratio`` = total / limit. ``h2h_wakeups_per_step``: median rounds of the H2H engine's thread
    per step (None in runs before it was recorded, or when the training thread drove the engine)."""
    per_rank = []
    for r in ranks:
        steps, wakeups = [], []
        for b in r["blocks"]:
            if b["mode"] == "on" and b["stats"].get("cpu_ns_per_step"):
                steps += b["stats"]["cpu_ns_per_step"][1:]
                wakeups += [w for w in b["stats"].get("wakeups_per_step", [])[1:] if w is not None]
        if not steps:
            continue
        st = next(b["stats"] for b in r["blocks"] if b["mode"] == "on")
        snap, sent, recv = st["snapshot_bytes"], st["sent_bytes"], st["received_bytes"]
        tp = r["throughput_ns_per_byte"]
        med = {k: statistics.median(s[k] for s in steps) for k in ("copy", "checksum", "mpi", "bookkeeping")}
        total = statistics.median(sum(s.values()) for s in steps)
        limit = tp["memcpy"] * (snap + sent + recv) + tp[r["checksum"]] * (snap + recv)
        per_rank.append({
            "rank": r["rank"], "steps": len(steps), "protected_bytes": snap, "sent_bytes": sent,
            "received_bytes": recv, "cpu_ms_per_step": {k: round(v / 1e6, 3) for k, v in med.items()},
            "cpu_ms_total_per_step": round(total / 1e6, 3),
            "ns_per_byte": {k: round(v / snap, 4) for k, v in med.items()},
            "ns_per_byte_total": round(total / snap, 4),
            "limit_ms_per_step": round(limit / 1e6, 3), "limit_ns_per_byte": round(limit / snap, 4),
            "ratio": round(total / limit, 2) if limit else None,
            "memcpy_ns_per_byte": round(tp["memcpy"], 4), "checksum_ns_per_byte": round(tp[r["checksum"]], 4),
            "checksum": r["checksum"],
            **mpi_floor(tp.get("mpi"), sent + recv, snap, med["mpi"]),
            "h2h_wakeups_per_step": statistics.median(wakeups) if wakeups else None,
        })
    return {"ranks": per_rank,
            "ratio_median": statistics.median(p["ratio"] for p in per_rank) if per_rank else None}


def mpi_floor(ns_per_byte_moved: float | None, moved_bytes: int, protected_bytes: int, mpi_ns: float) -> dict:
    """The bare transport's cost for the replica bytes one rank moves per step (pure): ``mpi_floor_ns_per_byte``
    per protected byte (the MPI ring's CPU ns per byte moved, :func:`phoenix_hpc.bench.throughput.measure_mpi`,
    x bytes sent and received / protected bytes) and ``mpi_over_floor`` = the measured MPI category / that
    floor. Empty when the run did not measure the transport (runs before it, or one rank) or the rank moved
    no replica bytes."""
    floor = (ns_per_byte_moved or 0.0) * moved_bytes
    if not floor or not protected_bytes:
        return {}
    return {"mpi_floor_ns_per_byte": round(floor / protected_bytes, 4),
            "mpi_over_floor": round(mpi_ns / floor, 2)}


def analyze_memory(ranks: Sequence[dict], case: Case) -> dict:
    """Host memory per rank of a memory case (pure), against the design's ``2 x snapshot + 2k x optimizer
    shard`` and the runtime's own plan. ``measured_bytes`` is the RSS given back when the protector of the
    first on block is freed (RSS at the block's end minus RSS after close + ``malloc_trim``); also reported:
    the RSS growth over that on block and over the next off block (the control: training alone), and the
    resident bytes of the runtime's buffers (mincore)."""
    per_rank = []
    for r in ranks:
        on = [b for b in r["blocks"] if b["mode"] == "on"]
        off = [b for b in r["blocks"] if b["mode"] == "off"]
        released = on[0]["rss_after_bytes"] - on[0]["rss_after_close_bytes"]
        growth = on[0]["rss_after_bytes"] - on[0]["rss_before_bytes"]
        control = off[0]["rss_after_bytes"] - off[0]["rss_before_bytes"] if off else None
        expected = S.expected_host_bytes(r["snapshot_bytes"], r["optimizer_shard_bytes"], case.k)
        measured = released
        per_rank.append({"rank": r["rank"], "measured_bytes": measured, "rss_growth_on_block_bytes": growth,
                         "rss_growth_off_block_bytes": control,
                         "buffers_resident_bytes": on[0]["buffers_resident_bytes"],
                         "expected_bytes": expected, "planned_bytes": r["host_buffer_bytes"],
                         "snapshot_bytes": r["snapshot_bytes"], "optimizer_shard_bytes": r["optimizer_shard_bytes"],
                         "held_replica_bytes": r["held_replica_bytes"],
                         "ratio": measured / expected if expected else None})
    return {"name": case.name, "size": case.size, "k": case.k, "grid": case.grid,
            "exact_rss": all(r.get("exact_rss") for r in ranks), "ranks": per_rank,
            "ratio_median": statistics.median(p["ratio"] for p in per_rank),
            "planned_over_expected": statistics.median(p["planned_bytes"] / p["expected_bytes"] for p in per_rank)}
