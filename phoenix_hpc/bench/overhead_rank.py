"""One rank of the overhead and memory benchmark: ``python -m phoenix_hpc.bench.overhead_rank OUT CFG...``.

Started by the benchmark's batch job as one srun step over the active ranks (real Slurm, real MPI, real
gloo). For each job config CFG (one *case*: a model size, a grid and k) the rank builds generation ``g``
(= the case's index) on the MPI-rendezvoused store, builds the engine, and trains:

1. ``warmup`` steps without protection (dropped by the statistics);
2. blocks of ``block_steps`` steps in ABBA order (:func:`phoenix_hpc.bench.stats.interleaved_order`):
   an *on* block creates a :class:`~phoenix_hpc.runtime.protector.Protector` (collective), trains with it
   and closes it; an *off* block trains with ``protector=None`` -- the loop then makes no call besides the
   three engine calls (docs/design.md section 4), exactly as with ``resilience.enabled: false``. A case
   whose ``CFG.bench.json`` says ``"compare": "agreement"`` protects every block, with replica agreement on
   (mode ``check-on``) and off (``check-off``, ``replica_agreement=False``) in place of on and off
   (:mod:`phoenix_hpc.bench.agreement_overhead`).

Interleaving inside one process, rather than one process per mode as ``scripts/bench-overhead`` does,
keeps the process start-up (tens of seconds on a 2-core machine) out of the run and exposes both modes to
the same drift of a shared machine.

Memory, per on block: the bytes of the runtime's host buffers that are resident in RAM at the end of the
block (mincore(2) over their pages: allocated *and* written). Per block: resident set size (psutil's ``memory_info().rss``, the kernel's RSS counter that ``VmRSS`` of proc(5) shows) just before the block
(before ``Protector.create`` for an on block) and at its end (every ping-pong buffer has been written by
then: a block has at least 2 steps), plus the protector's own accounting (``MemoryPlan``). Cases marked
``memory`` (run first) set the mmap threshold to 64 KiB (:func:`fix_mmap_threshold`), so that the buffers
get fresh pages and the RSS deltas show them; the other cases set it to 32 MiB, glibc's upper bound of
its own dynamic threshold on 64-bit, i.e. what a long-running process ends up with.

Per case, before training, each rank measures this machine's memcpy and checksum CPU cost per byte
(:func:`phoenix_hpc.bench.throughput.measure`, 16 MiB, best of 3); each on block's ``stats`` carry the
protector's CPU nanoseconds per step and category (:mod:`phoenix_hpc.runtime.cpu_account`).

Writes ``OUT/case{i}.rank{r}.json``: ``{case, rank, coord, grid, k, checksum, throughput_ns_per_byte,
steps: [{mode, block, step_ms, wait_ms}], blocks: [{mode, rss_before_bytes, rss_after_bytes, stats}], optimizer_shard_bytes,
param_shard_bytes, snapshot_bytes, replica_bytes, host_buffer_bytes}``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
from pathlib import Path


def rss_bytes() -> int:
    """Resident set size of this process in bytes (psutil ``Process().memory_info().rss``: on Linux the
    resident pages of proc(5) ``/proc/self/statm`` times the page size, the counter ``VmRSS`` shows)."""
    import psutil

    return int(psutil.Process().memory_info().rss)


M_MMAP_THRESHOLD = -3  # mallopt(3) parameter number in glibc's malloc.h


def fix_mmap_threshold(threshold_bytes: int = 1 << 16) -> bool:
    """Make glibc serve every allocation of ``threshold_bytes`` or more with its own ``mmap`` (mallopt(3),
    ``M_MMAP_THRESHOLD``; setting it also turns off glibc's dynamic threshold). Without it, buffers of a
    few MiB are carved out of heap memory that earlier temporaries already made resident, and an RSS delta
    no longer shows them. Returns False where mallopt is unavailable (not glibc)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(M_MMAP_THRESHOLD, int(threshold_bytes)))
    except (OSError, AttributeError):
        return False


def trim_heap() -> None:
    """Give free heap memory back to the kernel (glibc ``malloc_trim(0)``, malloc_trim(3)), so that memory
    freed by an earlier case does not hide new allocations from an RSS delta. No-op where unavailable."""
    import ctypes

    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def resident_bytes(tensors) -> int:
    """Bytes of the given host tensors' memory that are resident in RAM, asked from the kernel with
    mincore(2) over the pages each tensor spans (a page shared by two tensors counts once per tensor;
    the buffers are MiB-sized, so this is below one page per buffer). Tensors must be contiguous CPU
    tensors. Raises OSError when mincore fails."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for t in tensors:
        n = t.numel() * t.element_size()
        if n == 0:
            continue
        start = t.data_ptr() // page * page
        end = -(-(t.data_ptr() + n) // page) * page
        pages = (end - start) // page
        vec = (ctypes.c_ubyte * pages)()
        if libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(end - start), vec) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        total += sum(1 for v in vec if v & 1) * page
    return total


def buffer_tensors(prot) -> list:
    """Every host buffer of a protector: the local ping-pong pair and the pairs of the replicas it holds."""
    out = list(prot.buffers.local.bufs)
    for pair in prot.buffers.held.values():
        out += list(pair.bufs)
    return out


def _nbytes(pairs) -> int:
    return sum(t.numel() * t.element_size() for _, t in pairs)


def machine_cpu_ms(times=None) -> dict[str, float]:
    """Milliseconds all CPUs of this machine spent, since boot and summed over CPUs, ``idle`` (idle and
    iowait), ``irq`` (hard and soft interrupts: where the kernel's loopback TCP receive path runs) and
    ``steal`` (taken by the hypervisor), from ``times``: psutil's ``cpu_times()`` (default; seconds, on
    Linux the ``cpu`` line of proc(5) ``/proc/stat`` in USER_HZ ticks / CLK_TCK).

    Raises:
        RuntimeError: ``times`` lacks one of those fields (psutil gives ``iowait``, ``irq``, ``softirq``
            and ``steal`` on Linux only).
    """
    import psutil

    t = psutil.cpu_times() if times is None else times
    try:
        return {"idle": (t.idle + t.iowait) * 1e3, "irq": (t.irq + t.softirq) * 1e3, "steal": t.steal * 1e3}
    except AttributeError as exc:
        raise RuntimeError(f"the machine's CPU times lack a field this benchmark reads: {exc}") from None


class StepClocks:
    """CPU clocks read once per step by the training thread (its ``on_step`` callback), as differences
    since the previous step: ``train_cpu_ms`` the training thread's own CPU time
    (``time.thread_time_ns``, the runtime's calls on it included), ``proc_cpu_ms`` every thread of this
    process (``time.process_time_ns``: the runtime's threads, gloo's and MPI's threads, torch's), and the
    whole machine's ``idle_ms``, ``irq_ms`` and ``steal_ms`` (:func:`machine_cpu_ms`, 10 ms ticks: use
    sums or means over many steps, not medians). Milliseconds."""

    def __init__(self) -> None:
        import time

        self._time = time
        self._last = self._read()

    def _read(self) -> dict[str, float]:
        m = machine_cpu_ms()
        return {"train_cpu_ms": self._time.thread_time_ns() / 1e6, "proc_cpu_ms": self._time.process_time_ns() / 1e6,
                "idle_ms": m["idle"], "irq_ms": m["irq"], "steal_ms": m["steal"]}

    def lap(self) -> dict:
        now = self._read()
        out = {k: now[k] - self._last[k] for k in now}
        self._last = now
        return out


def thread_cpu_ms(task_dir: str = "/proc/self/task") -> dict[str, float]:
    """CPU time (ms) of every live thread of this process (ids: psutil ``Process().threads()``), by name:
    the Python name of a thread started by ``threading`` (e.g. ``phoenix-copy``, ``phoenix-h2h``,
    ``MainThread``), otherwise the kernel's ``comm`` of the thread (proc(5) ``task_dir/TID/comm``, read by
    hand: psutil gives a thread's id and CPU times, not its name), ``#TID`` appended so that threads of one
    name stay apart. Each is read from the thread's own CPU clock, the one ``clock_getcpuclockid(3)`` and
    ``time.thread_time_ns`` use (nanoseconds; psutil's per-thread times are USER_HZ ticks, 10 ms): Linux
    encodes the clock of thread TID as ``(~TID << 3) | 6`` (per-thread, scheduler clock; the kernel's
    ``MAKE_THREAD_CPUCLOCK``). A thread that ends meanwhile is left out."""
    import threading
    import time

    import psutil

    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    out = {}
    for tid in (t.id for t in psutil.Process().threads()):
        try:
            ns = time.clock_gettime_ns(((~int(tid)) << 3) | 6)
            with open(f"{task_dir}/{tid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        out[f"{names.get(int(tid), comm)}#{tid}"] = ns / 1e6
    return out


def pin_plan(allowed: list[int]) -> tuple[set[int], set[int]]:
    """The GPU-like pinning (pure): the training thread on the first allowed CPU, the protection threads
    on the rest. Raises BenchError with fewer than 2 allowed CPUs (there is nothing to separate)."""
    from phoenix_hpc.errors import BenchError

    if len(allowed) < 2:
        raise BenchError(f"pinned case needs at least 2 allowed CPUs, this rank has {allowed}")
    return {allowed[0]}, set(allowed[1:])


def bound_cpu(allowed: list[int], rank: int) -> int:
    """The one CPU a rank's whole process is bound to in a ``bound`` case (pure): ``allowed[rank mod
    len(allowed)]``, as ``srun --cpu-bind=cores`` or Open MPI's ``mpirun`` (its default for 2 ranks) bind
    one rank per core. Raises BenchError with no allowed CPU."""
    from phoenix_hpc.errors import BenchError

    if not allowed:
        raise BenchError("bound case: this rank has no allowed CPU")
    return sorted(allowed)[rank % len(allowed)]


def set_process_affinity(cpus: set[int]) -> int:
    """Set the CPU affinity of every thread of this process (psutil ``Process().threads()``; gloo's and
    MPI's threads included; threads started later inherit their creator's); returns how many threads were
    set. A thread that ended meanwhile is skipped."""
    import psutil

    n = 0
    for tid in (t.id for t in psutil.Process().threads()):
        try:
            os.sched_setaffinity(int(tid), cpus)
            n += 1
        except ProcessLookupError:
            continue
    return n


def pin_protection_threads(cpus: set[int]) -> list[str]:
    """Pin this process's runtime threads (names starting ``phoenix-``) to ``cpus`` (Linux thread ids via
    ``sched_setaffinity``); returns the names pinned."""
    import threading

    done = []
    for t in threading.enumerate():
        if t.name.startswith("phoenix-") and t.native_id is not None:
            os.sched_setaffinity(t.native_id, cpus)
            done.append(t.name)
    return done


def run_case(index: int, cfg_path: str, out: Path, comm, store) -> None:
    import torch
    import torch.distributed as dist

    from phoenix_hpc.bench.stats import interleaved_order
    from phoenix_hpc.config.load import load_job_config
    from phoenix_hpc.engines.factory import create_engine
    from phoenix_hpc.launch.groups import init_generation, resolve_grid
    from phoenix_hpc.launch.loop import train
    from phoenix_hpc.runtime.protector import Protector
    from phoenix_hpc.topology import generation_placement

    from phoenix_hpc.bench.throughput import measure, measure_mpi

    cfg = load_job_config(cfg_path)
    extra = json.loads(Path(cfg_path).with_suffix(".bench.json").read_text())
    # this machine's physical limit, measured in the same run by every rank (CPU time of one thread)
    throughput = measure(16 << 20, 3)
    # and the bare MPI transport's floor for the bytes the H2H moves (collective; same chunking)
    throughput["mpi"] = measure_mpi(comm, 16 << 20, cfg.resilience.chunk_bytes, 3)
    exact_rss = fix_mmap_threshold(1 << 16 if extra.get("memory") else 32 << 20)
    rank, size = comm.Get_rank(), comm.Get_size()
    p, res = cfg.parallelism, cfg.resilience
    grid = resolve_grid(p.tp, p.pp, p.dp, size)
    groups, coord = init_generation(store, index, rank, grid, "gloo", res.collective_timeout_s)
    engine = create_engine(cfg, coord, groups, torch.device("cpu"))
    tokens = cfg.training.global_batch_size * cfg.model.seq_length
    steps: list[dict] = []
    blocks: list[dict] = []

    def record(mode: str, block: int, threads: dict | None = None):
        """The ``on_step`` of a block; ``threads`` (if given) gets every thread's CPU time at the end of the
        block's first step (``thread_cpu_ms``), the step the statistics drop."""
        clock = StepClocks()

        def on_step(rec) -> None:
            steps.append({"mode": mode, "block": block, "step": rec.step, "step_ms": rec.step_time_ms,
                          "wait_ms": rec.exposed_wait_ms, **clock.lap()})
            if threads is not None and not threads:
                threads.update(thread_cpu_ms())
        return on_step

    def threads_since(th0: dict) -> dict:
        """CPU ms per thread since ``th0`` over the block's steps after its first (threads started later
        count from 0)."""
        n = max(1, extra["block_steps"] - 1)
        return {k: round((v - th0.get(k, 0.0)) / n, 3) for k, v in thread_cpu_ms().items()}

    pin = pin_plan(sorted(os.sched_getaffinity(0))) if extra.get("pinned") else None
    allowed = os.sched_getaffinity(0)
    bound = bound_cpu(sorted(allowed), rank) if extra.get("bound") else None
    if bound is not None:
        set_process_affinity({bound})
    if pin is not None:
        os.sched_setaffinity(0, pin[0])  # the calling (training) thread only; threads it starts inherit it
    train(engine, engine.step + extra["warmup"], tokens, on_step=record("warmup", -1))
    # every slot is its own failure domain here (one host): the node level is the process
    placement = generation_placement((grid.tp, grid.pp, grid.dp), res.k, [f"slot{r}" for r in range(size)])
    plan = None
    # a case comparing replica agreement (bench/agreement_overhead.py): both kinds of block are protected,
    # with the check on ("check-on") and off ("check-off": resilience.replica_agreement false)
    agreement = extra.get("compare") == "agreement"
    for b, on in enumerate(interleaved_order(extra["rounds"])):
        until = engine.step + extra["block_steps"]
        mode = ("check-on" if on else "check-off") if agreement else "on"
        if on or agreement:
            gc.collect()
            trim_heap()
            before = rss_bytes()
            prot = Protector.create(engine=engine, comm=comm, placement=placement, logical_rank=rank,
                                    grid={"tp": grid.tp, "pp": grid.pp, "dp": grid.dp}, generation=index,
                                    chunk_bytes=res.chunk_bytes, log=None, checksum=res.checksum,
                                    thread_nice=res.thread_nice, checksum_threads=res.checksum_threads,
                                    d2h_copy_chunk_bytes=res.d2h_copy_chunk_bytes,
                                    d2h_copy_coalesce=res.d2h_copy_coalesce,
                                    replica_agreement=on if agreement else res.replica_agreement)
            if pin is not None:
                pin_protection_threads(pin[1])
            th0: dict = {}
            train(engine, until, tokens, protector=prot, on_step=record(mode, b, th0))
            per_thread = threads_since(th0)
            after = rss_bytes()
            resident = resident_bytes(buffer_tensors(prot))
            plan = prot.memory_plan
            blocks.append({"mode": mode, "block": b, "rss_before_bytes": before, "rss_after_bytes": after,
                           "buffers_resident_bytes": resident, "stats": prot.stats(),
                           "thread_cpu_ms_per_step": per_thread})
            prot.close()
            del prot
            gc.collect()
            trim_heap()
            blocks[-1]["rss_after_close_bytes"] = rss_bytes()
        else:
            gc.collect()
            trim_heap()
            before = rss_bytes()
            th0 = {}
            train(engine, until, tokens, protector=None, on_step=record("off", b, th0))
            blocks.append({"mode": "off", "block": b, "rss_before_bytes": before, "rss_after_bytes": rss_bytes(),
                           "thread_cpu_ms_per_step": threads_since(th0)})
    if pin is not None:
        os.sched_setaffinity(0, allowed)
    if bound is not None:
        set_process_affinity(allowed)
    opt, par = engine.optimizer_shard(), engine.param_shard()
    result = {
        "pinned": {"compute_cpus": sorted(pin[0]), "protection_cpus": sorted(pin[1])} if pin else None,
        "bound_cpu": bound,
        "case": index, "name": extra["name"], "rank": rank, "k": res.k, "memory": bool(extra.get("memory")),
        "exact_rss": exact_rss, "checksum": res.checksum, "thread_nice": res.thread_nice, "cores": os.cpu_count(),
        "throughput_ns_per_byte": throughput,
        "coord": {"pp": coord.pp, "dp": coord.dp, "tp": coord.tp},
        "grid": {"tp": grid.tp, "pp": grid.pp, "dp": grid.dp},
        "steps": steps, "blocks": blocks,
        "optimizer_shard_bytes": _nbytes(opt), "param_shard_bytes": _nbytes(par),
        "snapshot_bytes": plan.snapshot_bytes if plan else None,
        "held_replica_bytes": [b for _, b in plan.held] if plan else [],
        "host_buffer_bytes": plan.total_bytes if plan else None,
    }
    tmp = out / f".case{index}.rank{rank}.json.tmp"
    tmp.write_text(json.dumps(result))
    os.replace(tmp, out / f"case{index}.rank{rank}.json")
    dist.barrier(group=groups.world)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="phoenix-bench-overhead-rank")
    ap.add_argument("out", help="folder for case{i}.rank{r}.json")
    ap.add_argument("configs", nargs="+", help="job configs, one per case (each with CFG.bench.json beside it)")
    a = ap.parse_args(argv)

    import mpi4py

    mpi4py.rc.finalize = False
    from mpi4py import MPI

    import torch

    from phoenix_hpc.launch.rendezvous import mpi_store_rendezvous

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 1))
    from phoenix_hpc.config.load import load_job_config
    from phoenix_hpc.launch.execute import import_runtime
    from phoenix_hpc.launch.heap import freeze_long_lived

    comm = MPI.COMM_WORLD
    store = mpi_store_rendezvous(comm, True, 120.0)
    out = Path(a.out)
    import_runtime(load_job_config(a.configs[0]))  # as a training slot does before it builds anything
    freeze_long_lived()  # (launch/heap.py): later collections traverse only what the cases build
    for i, cfg in enumerate(a.configs):
        run_case(i, cfg, out, comm, store)
        if comm.Get_rank() == 0:
            print(f"[bench] case {i} done: {cfg}", flush=True)
    comm.Barrier()
    MPI.Finalize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
