"""Real ranks under srun on the local Slurm cluster, attached to a real coordinator process: registration
(active + standby), heartbeats, done reports -> ``job_done`` whose final hash combines the ranks' state
hashes, standby told to stop, the coordinator exits by itself."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time

import pytest
import yaml

from phoenix_hpc.control import protocol as P
from phoenix_hpc.control.journal import read_journal
from phoenix_hpc.data.prepare import prepare_dataset, stdlib_dir

pytestmark = pytest.mark.cluster


def test_ranks_register_heartbeat_and_finish_through_the_coordinator(slurm_env, tmp_path):
    data = tmp_path / "data" / "stdlib"
    prepare_dataset(stdlib_dir(), data, max_bytes=300_000)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump({
        "name": "coord-e2e", "engine": "torch",
        "model": {"layers": 2, "hidden_size": 32, "heads": 2, "vocab_size": 256, "seq_length": 32},
        "parallelism": {"tp": 1, "pp": 1},
        "training": {"steps": 4, "micro_batch_size": 2, "global_batch_size": 4, "seed": 3},
        "data": {"path": str(data)},
        "resilience": {"heartbeat_interval_s": 0.5, "heartbeat_timeout_s": 5.0, "collective_timeout_s": 20.0},
        "resources": {"nodes": 2, "spares": 1},
    }))
    coord = subprocess.Popen([sys.executable, "-m", "phoenix_hpc.control.coordinator", "--run-dir", str(run_dir),
                              "--host", "127.0.0.1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (run_dir / P.COORDINATOR_FILE).exists():
            assert coord.poll() is None and time.monotonic() < deadline, coord.stdout.read() if coord.poll() else "slow"
            time.sleep(0.1)
        proc = subprocess.run(
            ["srun", "-N", "3", "--ntasks-per-node=1", "--mpi=pmix", "--no-kill", "--kill-on-bad-exit=0", "-t", "5",
             sys.executable, "-m", "phoenix_hpc.launch.rank", "--run-dir", str(run_dir)],
            env=slurm_env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert coord.wait(60) == 0
    finally:
        if coord.poll() is None:
            coord.send_signal(signal.SIGTERM)
            coord.wait(30)
    reg = read_journal(run_dir, "registered")
    assert sorted((e["world_rank"], e["role"]) for e in reg) == [(0, "active"), (1, "active"), (2, "standby")]
    done = read_journal(run_dir, "job_done")[0]
    hashes = [json.loads((run_dir / "ranks" / f"rank{r}.json").read_text())["state_hash"] for r in (0, 1)]
    assert done["rank_hashes"] == hashes and done["step"] == 4 and done["steps_agree"]
    assert done["final_hash"] == hashlib.sha256("".join(hashes).encode()).hexdigest()
    assert not read_journal(run_dir, "fault") and not read_journal(run_dir, "slots_dead")
    assert not [e for e in read_journal(run_dir, "rejected")], read_journal(run_dir, "rejected")
