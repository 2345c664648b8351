"""Host memory stays flat across many recoveries, on the real local Slurm cluster.

One job (the tiny GPT of test_hotswap.py with ``hidden_size`` 128, so that one generation's host buffers, about
10 MiB per rank, stand above the allocator's noise; dp=2, one slot per node, torch engine on gloo, k=1, no
spare) trains ``WARM_STEPS`` steps (the allocators' arenas reach their working size over the first thousand or
so), then runs ``FREE_S`` seconds without a fault, then takes ``FAULTS`` transient faults (``phoenix
inject-fault --kind transient``: a local recovery, every process alive), on logical ranks 0 and 1 in turn and in
the phases forward, h2h and optimizer in turn. The resident set size of both ranks (``VmRSS`` of
``/proc/PID/status``, proc(5), the median of three reads; the local cluster's nodes are this host, the PIDs
come from the journal's registrations) is read every 2 s of the fault-free stretch and after each recovery
(``recovery_done``) and a short settling time.

The first recovery may pay for one-time allocations of the recovery path (modules it imports, the first
recovery's buffers); every later one must leave nothing behind: per rank, the RSS trend over the recoveries
from the first on (least-squares slope, per second) may exceed the fault-free stretch's trend by at most
``PER_RECOVERY`` per recovery. Before, each local recovery left 3.5-4.7 MiB per rank (freed MPI requests
pinning the old generation's host buffers, a heap grown by each generation's buffers) and the first one about
20 MiB (the previous generation's protector, freed only by the cyclic garbage collector).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from phoenix_hpc.cli.main import cli

from test_hotswap import CONFIG, Job  # noqa: F401 -- the Job class (fixtures: tests/e2e/conftest.py)

pytestmark = pytest.mark.cluster

FAULTS = 9  # recoveries: the first (one-time set-up) and 8 measured
PER_RECOVERY = 1 << 20  # bytes per rank and recovery beyond the fault-free trend
WARM_STEPS = 1500  # fault-free steps before any measurement
FREE_S = 15.0  # the fault-free stretch measured
PHASES = ("forward", "h2h", "optimizer")
SETTLE_S = 2.0  # after recovery_done: the new generation's first commit fence has released the old copies


def _rss1(pid: int) -> int:
    """``VmRSS`` (proc(5), kB) of ``pid``, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def _sample(pids: dict[int, int]) -> tuple[float, list[int]]:
    """``(time.monotonic(), [RSS of logical rank 0, of 1])``, each the median of three reads 0.2 s apart."""
    reads = []
    for _ in range(3):
        reads.append([_rss1(pids[r]) for r in (0, 1)])
        time.sleep(0.2)
    return time.monotonic(), [sorted(x[r] for x in reads)[1] for r in (0, 1)]


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares slope of ``ys`` over ``xs`` and its standard error (from the residuals, n - 2 degrees of
    freedom)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    res = sum((y - my - b * (x - mx)) ** 2 for x, y in zip(xs, ys))
    return b, math.sqrt(res / (n - 2) / sxx)


def test_rss_is_flat_across_repeated_local_recoveries(env, data, tmp_path):  # noqa: F811
    cfg = json.loads(json.dumps(CONFIG))
    cfg["model"]["hidden_size"] = 128
    cfg["training"]["steps"] = 100_000  # cancelled once the faults are done
    cfg["resources"].update(spares=0, time_limit="00:10:00")
    job = Job(env, tmp_path, data, "memory", cfg)
    free: list[tuple[float, list[int]]] = []  # the fault-free stretch: (time, RSS per rank)
    samples: list[tuple[float, list[int]]] = []  # after each recovery
    try:
        job.node_of(1)
        pids = {e["logical_rank"]: e["pid"] for e in job.events("registered") if e["role"] == "active"}
        assert sorted(pids) == [0, 1], job.events("registered")
        deadline = time.monotonic() + 240
        while job.step(1) < WARM_STEPS:
            assert time.monotonic() < deadline, f"the job did not reach step {WARM_STEPS}: {job.step(1)}"
            time.sleep(0.5)
        end = time.monotonic() + FREE_S
        while time.monotonic() < end:
            free.append(_sample(pids))
            time.sleep(1.4)
        for i in range(FAULTS):
            r = CliRunner().invoke(cli, ["inject-fault", str(job.run_dir), "--kind", "transient", "--rank",
                                         str(i % 2), "--phase", PHASES[i % 3], "--json"], env=job.env)
            assert r.exit_code == 0, r.output
            deadline = time.monotonic() + 90
            while len(job.events("recovery_done")) < i + 1:
                assert time.monotonic() < deadline, f"recovery {i + 1} did not finish: {job.events()[-5:]}"
                time.sleep(0.2)
            time.sleep(SETTLE_S)
            samples.append(_sample(pids))
    finally:
        job.cancel()
    done = job.events("recovery_done")
    assert len(done) == FAULTS and all(d["action"] == "local_recovery" for d in done), done
    mib = [[round(v / 2**20, 1) for v in s] for _, s in samples]
    gap_s = (samples[-1][0] - samples[0][0]) / (len(samples) - 1)  # seconds per recovery
    first = [(samples[0][1][r] - free[-1][1][r]) / 2**20 for r in (0, 1)]
    excess = []
    for r in (0, 1):
        free_rate, _ = _fit([t for t, _ in free], [s[r] for _, s in free])  # bytes per second
        rate, se = _fit([t for t, _ in samples], [s[r] for _, s in samples])
        # bytes per recovery beyond the fault-free trend, and the noise of that estimate (2 standard errors)
        excess.append(((rate - max(0.0, free_rate)) * gap_s, 2 * se * gap_s))
        print(f"rank {r}: fault-free {free_rate * gap_s / 2**20:+.2f} MiB per {gap_s:.1f} s, with recoveries "
              f"{rate * gap_s / 2**20:+.2f} MiB per recovery, excess {excess[r][0] / 2**20:+.2f} MiB per recovery "
              f"(noise {excess[r][1] / 2**20:.2f}); first recovery {first[r]:+.1f} MiB; after each recovery (MiB) "
              f"{[m[r] for m in mib]}")
    assert all(e <= PER_RECOVERY + noise for e, noise in excess), (excess, mib)
