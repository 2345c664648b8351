"""Exact fault injection on the real local Slurm cluster: a request lands exactly, or is refused, or is
reported missed; never accepted and then silently dropped.

One job (a tiny GPT, dp=2, one slot per node, torch engine on gloo, k=1) trains many short steps. The
test reads the live step of logical rank 1 from its own step log (``ranks/rank1.steps.jsonl``, written
after every step, so it is the newest finished step, ahead of anything the coordinator knows) and runs
``phoenix inject-fault --rank 1 --at-step LIVE+d --phase forward --kind transient`` for d = 0, 1, 2, 3, 4,
... 20 times. ``d = 0`` names a step the target has already started, so it must be refused; for larger
``d`` the target decides by where it is when the request arrives. Every outcome is checked against the
journal and the landing records: exit 0 means landed at exactly that step and phase; exit 2 means refused
(journal ``inject_refused``, nothing armed, no landing); exit 1 means missed (journal ``inject_missed``).
A transient fault is a local recovery without the spare, so the job goes on after each landing and ends
with ``job_done``.

The same job bounds host memory across repeated recoveries: the resident set size of both ranks
(``VmRSS`` of ``/proc/PID/status``; the local cluster's nodes are this host, the PIDs come from the
journal's registrations) is read after each request; from the ``RSS_WARMUP``-th landed recovery on (the
first ones pay for one-time set-up, and the allocators' arenas grow to their working size over the job's
first thousand or so steps), it may grow by at most ``RSS_PER_RECOVERY`` per landed recovery on average.
How many of the 20 land depends on the machine's speed, so further requests with a margin of
``RSS_MARGIN`` steps follow until ``RSS_LANDINGS`` have landed (each checked like the others). Each recovery
builds a new generation's protector; the previous generation's buffers hold the copies of the recoverable
step until the new generation's first commit fence and are released there (docs/design.md section 6), so
memory does not accumulate.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from phoenix_hpc.cli.main import cli
from phoenix_hpc.faults.trigger import read_fired

from test_hotswap import CONFIG, Job  # noqa: F401 -- the Job class (fixtures: tests/e2e/conftest.py)

pytestmark = pytest.mark.cluster

REQUESTS = 20
RSS_PER_RECOVERY = 2 << 20  # bytes, both ranks together, averaged over the landed recoveries
RSS_WARMUP = 3  # landed recoveries before the memory baseline
RSS_LANDINGS = 8  # landed recoveries in all: the memory bound is measured over the 5 after the baseline
RSS_MARGIN = 8  # steps ahead of the live step for the requests that only serve the memory bound
STEPS = 2000  # long enough for 20 requests and their recoveries; the job is cancelled once they are done


def _rss_bytes(pids: list[int]) -> int:
    """Total ``VmRSS`` (proc(5), kB) of ``pids``, in bytes."""
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total


def _live_step(job: Job, logical: int) -> int:
    """The newest step the rank finished, from its own step log."""
    return job.step(logical)


def test_requests_at_the_targets_live_step_land_exactly_or_are_refused(env, data, tmp_path):  # noqa: F811
    cfg = json.loads(json.dumps(CONFIG))
    cfg["training"]["steps"] = STEPS
    cfg["resources"]["time_limit"] = "00:10:00"
    job = Job(env, tmp_path, data, "exact", cfg)
    results = []
    rss = []  # (landed so far, total RSS of the active ranks)
    try:
        _ = job.node_of(1)
        pids = [e["pid"] for e in job.events("registered") if e["role"] == "active"]
        assert len(pids) == 2, job.events("registered")
        deadline = time.monotonic() + 120
        while _live_step(job, 1) < 3:
            assert time.monotonic() < deadline, "rank 1 did not train"
            time.sleep(0.2)
        def request(d: int) -> None:
            """One transient request at the live step + ``d``; its outcome, then both ranks' RSS."""
            live = _live_step(job, 1)
            r = CliRunner().invoke(cli, ["inject-fault", str(job.run_dir), "--kind", "transient", "--rank", "1",
                                         "--at-step", str(live + d), "--phase", "forward", "--json"], env=job.env)
            results.append((live + d, live, r.exit_code, r.stdout, r.output))
            assert r.exit_code in (0, 1, 2), r.output
            time.sleep(0.3)
            rss.append((sum(1 for x in results if x[2] == 0), _rss_bytes(pids)))

        for i in range(REQUESTS):
            request(i % 5)
        deadline = time.monotonic() + 240
        while sum(1 for x in results if x[2] == 0) < RSS_LANDINGS:
            assert time.monotonic() < deadline, f"only {sum(1 for x in results if x[2] == 0)} requests landed"
            request(RSS_MARGIN)
    finally:
        job.cancel()
    journal = job.events()
    fired = read_fired(job.run_dir)
    forwarded = {e["request_id"]: e for e in journal if e["event"] == "inject_forwarded"}
    armed = {e["request_id"]: e for e in journal if e["event"] == "inject_armed"}
    refused = {e["request_id"]: e for e in journal if e["event"] == "inject_refused"}
    missed = {e["request_id"]: e for e in journal if e["event"] == "inject_missed"}
    landed = {f["request_id"]: f for f in fired}
    counts = {"landed": 0, "refused": 0, "missed": 0}
    for at, live, code, stdout, output in results:
        if code == 0:
            out = json.loads(stdout)
            rid = out["request_id"]
            assert out["state"] == "landed" and out["landed"] == [{"world_rank": 1, "step": at,
                                                                    "phase": "forward_backward"}], output
            assert landed[rid]["step"] == at and landed[rid]["phase"] == "forward_backward"
            assert rid in armed and rid not in refused and rid not in missed
            counts["landed"] += 1
        elif code == 2:
            assert "nothing was injected" in output or "is already done" in output, output
            if at == live:
                assert "already" in output, output  # the target had started (or done) that step
            counts["refused"] += 1
        else:
            assert "armed but did not land" in output, output
            counts["missed"] += 1
    # zero silent misses: every request the coordinator forwarded was refused, or armed and then landed or
    # reported missed; a landing record exists exactly for the armed requests that landed
    for rid in forwarded:
        assert (rid in refused) != (rid in armed), (rid, forwarded[rid])
        if rid in armed:
            assert (rid in landed) != (rid in missed), rid
    assert set(landed) <= set(armed)
    assert counts["landed"] + counts["refused"] + counts["missed"] == len(results)
    assert counts["refused"] >= REQUESTS // 5  # every d = 0 request
    print(f"{len(results)} requests ({REQUESTS} at the live step + 0..4, the rest + {RSS_MARGIN}): {counts}")
    # host memory flat across recoveries: from the sample after landing RSS_WARMUP to the last one
    start = next(i for i, (n, _) in enumerate(rss) if n >= RSS_WARMUP)
    n = rss[-1][0] - rss[start][0]
    grown = rss[-1][1] - rss[start][1]
    print(f"RSS of both ranks: {rss[start][1] / 2**20:.1f} MiB after landing {RSS_WARMUP}, {rss[-1][1] / 2**20:.1f} MiB after "
          f"landing {rss[-1][0]}: {grown / 2**20:+.1f} MiB over {n} recoveries; samples (landed, MiB) "
          f"{[(k, round(v / 2**20, 1)) for k, v in rss]}")
    assert n >= 5, rss
    assert grown <= n * RSS_PER_RECOVERY, (grown, n, rss)
