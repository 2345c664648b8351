"""The control-plane benchmark end to end at CI size: the real coordinator process against 200 simulated
slots (scripts/bench-control-plane). It must run and print every number; no timing is asserted (speed
targets live in BENCHMARKS.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_control_plane_bench_runs_end_to_end_and_prints_numbers(tmp_path):
    out = tmp_path / "ctl.json"
    proc = subprocess.run([str(REPO / "scripts" / "bench-control-plane"), "--ranks", "200", "--steady-s", "3",
                           "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    (run,) = res["runs"]
    assert run["ranks"] == 200 and run["slots"] == 216 and run["nodes"] == 27
    # every figure was measured (a number, not missing), and the recovery reached every member
    for key in ("sent_heartbeats_per_s", "handled_heartbeats_per_s", "sent_messages_per_s", "handled_messages_per_s", "heartbeat_age_p50_ms",
                "heartbeat_age_p99_ms", "coordinator_cores", "detect_exit_s", "detect_silence_s",
                "detect_active_exit_s", "quiesce_s", "plan_s", "plan_delivered_s", "plan_read_by_all_s", "register_s",
                "sim_start_s"):
        assert isinstance(run.get(key), (int, float)), (key, run)
    assert run["plan_read_by"] == 200
    # a node's 8 slots heartbeat in one message: the coordinator handles 8 slot heartbeats per message
    assert run["handled_heartbeats_per_s"] > 6 * run["handled_messages_per_s"] > 0, run
    assert run["detect_silence_s"] > 10.0  # found by the heartbeat timeout (10 s), not earlier
    # the table is printed with the run's row
    assert "| ranks |" in proc.stdout and "| 200 |" in proc.stdout
