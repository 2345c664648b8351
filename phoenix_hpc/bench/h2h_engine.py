"""The H2H engine alone: its thread's CPU time per byte moved against the bare transport's floor, its wake-ups
per step, and what one sleep and wake-up of a thread costs on this host (docs/design.md section 3).

Run under MPI with 2 or more ranks (``scripts/bench-h2h-engine`` does): every rank replicates ``--mib`` MiB
to the next rank every ``--step-s`` seconds (a ring, as k=1 replication), with ``--compute`` filling the
step: ``sleep`` (nothing else running) or ``busy`` (the training thread multiplies matrices, sharing the
cores). The holder acknowledges each replica as soon as it has arrived (no checksum: only the engine is
measured). Prints numbers; it is not a test.
"""

from __future__ import annotations

import argparse
import math
import statistics
import threading
import time


def wake_cost_us(seconds: float, n: int) -> dict[str, float]:
    """Thread CPU microseconds per timed sleep and wake-up of the calling thread: ``time.sleep(seconds)``
    and ``threading.Condition().wait(seconds)`` (nothing notifies it), each the mean of ``n``."""
    cv = threading.Condition()

    def mean(fn) -> float:
        t0 = time.thread_time_ns()
        for _ in range(n):
            fn()
        return (time.thread_time_ns() - t0) / n / 1e3

    def cv_wait():
        with cv:
            cv.wait(timeout=seconds)

    return {"sleep": mean(lambda: time.sleep(seconds)), "condition_wait": mean(cv_wait)}


def _compute(seconds: float, busy: bool) -> None:
    if not busy:
        time.sleep(seconds)
        return
    import torch

    a = torch.randn(256, 256)
    t = time.monotonic()
    while time.monotonic() - t < seconds:
        a = (a @ a).tanh_()


def run(nbytes: int, steps: int, step_s: float, busy: bool, chunk_bytes: int,
        idle_sleep_s: float, busy_sleep_s: float) -> dict | None:
    """Replicate ``nbytes`` around the ring ``steps`` times; returns rank 0's gathered results (None on the
    other ranks). ``idle_sleep_s``/``busy_sleep_s``: the engine's longest sleep while a transfer is in flight
    and its sleep after a round that moved something (seconds). Collective over ``MPI.COMM_WORLD``."""
    import numpy as np
    import torch
    from mpi4py import MPI

    from phoenix_hpc.bench.throughput import measure_mpi
    from phoenix_hpc.runtime import h2h
    from phoenix_hpc.runtime.buffers import PingPong
    from phoenix_hpc.runtime.cpu_account import CpuAccount

    world = MPI.COMM_WORLD
    comm = world.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    floor = measure_mpi(comm, 16 << 20, chunk_bytes, 3)
    pp = PingPong((torch.zeros(nbytes, dtype=torch.uint8), torch.zeros(nbytes, dtype=torch.uint8)), "held")
    spec = h2h.HeldSpec("bench", left, nbytes, pp)
    cpu = CpuAccount()
    box: dict = {}

    def on_received(spec_, idx, step):
        pp.commit(idx, step)
        box["engine"].send_ack(spec_, step, h2h.ACK_OK, 0)

    tags = h2h.make_tag_plan(len(h2h.chunk_ranges(nbytes, chunk_bytes)), h2h.tag_ub(comm))
    eng = box["engine"] = h2h.H2HEngine(comm, [right], [spec], 0, chunk_bytes, tags, on_received, cpu=cpu,
                                        idle_sleep_s=idle_sleep_s, busy_sleep_s=busy_sleep_s)
    eng.start(threaded=True)
    src = np.random.default_rng(rank).integers(0, 256, nbytes, dtype=np.uint8)
    comm.Barrier()
    mpi0, wake0, t0 = cpu.totals()["mpi"], eng.wakeups, time.monotonic()
    for s in range(steps):
        eng.expect(s)  # as the protector does when a snapshot starts
        eng.send_replica(s, src)
        _compute(step_s, busy)
        if not eng.wait(lambda s=s: right in eng.acks.get(s, {}), 60.0):
            raise SystemExit(f"rank {rank}: step {s} not acknowledged within 60 s ({eng.describe()})")
    wall = time.monotonic() - t0
    mpi_ns, wakeups = cpu.totals()["mpi"] - mpi0, eng.wakeups - wake0
    latency_ms = statistics.median(eng.send_s.values()) * 1e3
    eng.stop()
    comm.Free()
    mine = {"rank": rank, "engine_ns_per_byte_moved": mpi_ns / (steps * 2 * nbytes), "floor_ns_per_byte_moved": floor,
            "engine_ms_per_step": mpi_ns / steps / 1e6, "wakeups_per_step": wakeups / steps,
            "replication_ms_median": latency_ms, "step_ms": wall / steps * 1e3}
    rows = world.gather(mine, root=0)
    return {"ranks": rows} if rank == 0 else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bench-h2h-engine", description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=float, default=10.0, help="replica size per rank, MiB (default 10)")
    ap.add_argument("--steps", type=int, default=20, help="replications per rank (default 20)")
    ap.add_argument("--step-s", type=float, default=0.1, help="seconds per step (default 0.1)")
    ap.add_argument("--compute", choices=["sleep", "busy"], default="busy")
    ap.add_argument("--chunk-bytes", type=int, default=4 << 20)
    from phoenix_hpc.runtime.h2h import BUSY_SLEEP_S, IDLE_SLEEP_S

    ap.add_argument("--idle-sleep-ms", type=float, default=IDLE_SLEEP_S * 1e3,
                    help=f"the engine's longest sleep while a transfer is in flight, ms (default {IDLE_SLEEP_S * 1e3:g})")
    ap.add_argument("--busy-sleep-us", type=float, default=BUSY_SLEEP_S * 1e6,
                    help=f"the engine's sleep after a round that moved something, us (default {BUSY_SLEEP_S * 1e6:g})")
    ap.add_argument("--check-args", action="store_true", help=argparse.SUPPRESS)  # the script's check before mpirun
    a = ap.parse_args(argv)
    checks = (("--mib", a.mib, math.isfinite(a.mib) and 1 <= a.mib * 2**20 <= 2**40, "from 1 byte to 1 TiB"),
              ("--steps", a.steps, a.steps >= 1, "an integer >= 1"),
              ("--step-s", a.step_s, math.isfinite(a.step_s) and 0 <= a.step_s <= 3600, "from 0 to 3600 seconds"),
              ("--chunk-bytes", a.chunk_bytes, a.chunk_bytes >= 1, "an integer >= 1"),
              ("--idle-sleep-ms", a.idle_sleep_ms, math.isfinite(a.idle_sleep_ms) and 0.01 <= a.idle_sleep_ms <= 1000,
               "from 0.01 to 1000 ms"),
              ("--busy-sleep-us", a.busy_sleep_us, math.isfinite(a.busy_sleep_us) and 1 <= a.busy_sleep_us <= 1e6
               and a.busy_sleep_us <= a.idle_sleep_ms * 1e3,
               f"from 1 us to --idle-sleep-ms ({a.idle_sleep_ms:g} ms): the engine doubles it up to that cap"))
    for name, v, ok, allowed in checks:
        if not ok:  # one line, exit 2 (argparse's own errors, e.g. a value that is not a number, add its usage)
            ap.exit(2, f"bench-h2h-engine: {name} must be {allowed}, got {v}\n")
    if a.check_args:
        return 0
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_size() < 2:
        ap.error("run it under MPI with 2 or more ranks (scripts/bench-h2h-engine)")
    busy_s, idle_s = a.busy_sleep_us / 1e6, a.idle_sleep_ms / 1e3
    # each mean over about 0.2-0.4 s of sleeping (2000 and 200 sleeps at the defaults), at least one sleep
    wake = (wake_cost_us(busy_s, max(1, min(2000, int(0.2 / busy_s)))),
            wake_cost_us(idle_s, max(1, min(200, int(0.4 / idle_s)))))
    out = run(int(a.mib * 2**20), a.steps, a.step_s, a.compute == "busy", a.chunk_bytes, idle_s, busy_s)
    if out is None:
        return 0
    b, i = f"{a.busy_sleep_us:g} us", f"{a.idle_sleep_ms:g} ms"
    print(f"wake-up cost (thread CPU us per timed sleep, rank 0): sleep({b}) {wake[0]['sleep']:.1f}, "
          f"Condition.wait({b}) {wake[0]['condition_wait']:.1f}, sleep({i}) {wake[1]['sleep']:.1f}, "
          f"Condition.wait({i}) {wake[1]['condition_wait']:.1f}")
    print(f"{a.mib:g} MiB per rank and step, step {a.step_s * 1e3:.0f} ms ({a.compute}), {a.steps} steps; "
          f"engine sleeps {b} after progress, up to {i} while a transfer is in flight")
    print("rank | engine ns/B moved | floor ns/B moved | engine / floor | engine ms/step | wake-ups/step | "
          "replication ms (median) | step ms")
    for r in out["ranks"]:
        f = r["floor_ns_per_byte_moved"]
        e = r["engine_ns_per_byte_moved"]
        print(f"{r['rank']} | {e:.3f} | {f:.3f} | {e / f:.2f} | "
              f"{r['engine_ms_per_step']:.2f} | {r['wakeups_per_step']:.1f} | {r['replication_ms_median']:.1f} | "
              f"{r['step_ms']:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
