"""PHOENIX replication end to end: real ranks started by ``srun --mpi=pmix`` on the local Slurm cluster,
real MPI (H2H), real gloo (training), the real torch engine.

- after every step each shard's committed replica at each holder equals the owner's optimizer shard of
  that step byte for byte (SHA-256 over names + bytes), for dp=4 with k=1 and k=2 and for pp=2 x dp=2;
- host buffers match 2 x snapshot + 2k x replica;
- a corrupted byte in a held replica fails its checksum;
- protection on and off give identical losses and final state hashes;
- a sender SIGKILLed in the middle of an H2H copy leaves its holder's committed replica intact, verifiable
  and one step old;
- bad input (chunk size <= 0, a host without enough memory) fails at start-up on every rank, with nothing
  allocated.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

ASSETS = Path(__file__).parent / "assets"
REPO_ROOT = Path(__file__).resolve().parents[2]
PYTHON = REPO_ROOT / ".venv" / "bin" / "python"
PROG = ASSETS / "replication_prog.py"

CONFIG = """\
name: rep
engine: torch
model: {{layers: 2, hidden_size: 64, heads: 2, vocab_size: 256, seq_length: 32, dtype: float32}}
parallelism: {{tp: 1, pp: {pp}}}
training: {{steps: {steps}, micro_batch_size: 2, global_batch_size: 8, lr: 1.0e-3, min_lr: 1.0e-4,
           lr_schedule: cosine, warmup_steps: 2, seed: 7, log_interval: 1}}
data: {{path: {data}}}
resilience: {{enabled: true, k: 1, placement_levels: [node, switch], heartbeat_interval_s: 1,
             heartbeat_timeout_s: 5, collective_timeout_s: 20, chunk_bytes: 65536}}
resources: {{nodes: 4, spares: 0}}
"""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    from phoenix_hpc.data.prepare import prepare_dataset, stdlib_dir

    d = tmp_path_factory.mktemp("repdata")
    prepare_dataset(stdlib_dir(), d / "tiny", max_bytes=1_000_000)
    return d / "tiny"


def run(slurm_env, tmp: Path, dataset: Path, name: str, *, pp=1, steps=4, nodes=4, args=(), timeout=240):
    work = tmp / name
    work.mkdir()
    cfg = work / "cfg.yaml"
    cfg.write_text(CONFIG.format(pp=pp, steps=steps, data=dataset))
    out = work / "out"
    out.mkdir()
    cmd = ["srun", "-N", str(nodes), "--ntasks-per-node=1", "--mpi=pmix", "--no-kill", "--kill-on-bad-exit=0",
           "-t", "00:05:00", str(PYTHON), str(PROG), str(cfg), str(out), *args]
    proc = subprocess.run(cmd, env=slurm_env, capture_output=True, text=True, timeout=timeout)
    recs = {}
    for f in out.glob("rank*.json"):
        r = json.loads(f.read_text())
        recs[r["rank"]] = r
    return proc, recs


def check_replicas_match_owners(recs: dict, k: int, steps: int) -> None:
    owner_sha = {r["shard"]: r["owner"] for r in recs.values()}
    holders_of: dict[str, int] = {}
    for r in recs.values():
        for shard, per_step in r["held"].items():
            holders_of[shard] = holders_of.get(shard, 0) + 1
            # one record per step 0..steps-1 (S(k-1) committed during step k)
            assert sorted(per_step, key=int) == [str(s) for s in range(steps)], (r["rank"], shard)
            for step, (committed_step, sha) in per_step.items():
                assert committed_step == int(step), (r["rank"], shard, step)
                assert sha == owner_sha[shard][step], f"rank {r['rank']} replica of {shard} step {step} differs"
    assert holders_of == {s: k for s in owner_sha}, holders_of


def check_memory(recs: dict, k: int) -> None:
    rep = {r["shard"]: r["memory"]["replica_bytes"] for r in recs.values()}
    for r in recs.values():
        m = r["memory"]
        assert sorted(m["held"]) == sorted(s for _, h, s in r["placement"] if h == r["rank"])
        assert m["held"] == {s: rep[s] for s in m["held"]}  # holder buffer size = owner's replica size
        assert m["allocated_local"] == [m["snapshot_bytes"]] * 2
        assert m["allocated_total"] == m["plan_total"] == 2 * m["snapshot_bytes"] + 2 * sum(m["held"].values())
        assert m["replica_bytes"] < m["snapshot_bytes"] and m["replica_bytes"] >= m["opt_data_bytes"]
        assert any(f"= {m['plan_total']} bytes" in line for line in r["log"]), r["log"]  # printed at start-up


@pytest.mark.parametrize("pp,k,threaded", [(1, 1, True), (1, 2, True), (2, 1, True), (1, 1, False)],
                         ids=["dp4-k1", "dp4-k2", "pp2xdp2-k1", "dp4-k1-unthreaded"])
def test_committed_replicas_equal_owner_shards_and_on_off_identical(slurm_cluster, slurm_env, tmp_path, dataset, pp, k,
                                                                    threaded):
    """``unthreaded``: the H2H engine driven by the training thread, the mode used when MPI provides only
    MPI_THREAD_FUNNELED (forced here; this MPI provides MULTIPLE)."""
    steps = 4
    proc, on = run(slurm_env, tmp_path, dataset, "on", pp=pp, steps=steps,
                   args=["--protect", "--record", "--corrupt", "--k", str(k)] + ([] if threaded else ["--unthreaded"]))
    assert sorted(on) == [0, 1, 2, 3], proc.stdout + proc.stderr
    for r in on.values():
        assert "error" not in r and "create_error" not in r, r.get("error") or r.get("create_error")
    check_replicas_match_owners(on, k, steps)
    check_memory(on, k)
    assert sum(len(r["corrupt"]) for r in on.values()) == 4 * k  # every replica was corrupted and caught
    for r in on.values():
        # replica placement spans both leaf switches of the local cluster (node, switch levels)
        assert r["thread_level"] == 3 and r["threaded"] == threaded  # srun --mpi=pmix + Open MPI 4.1: MULTIPLE
        assert all("fails its checksum" in v for v in r["corrupt"].values()), r["corrupt"]
        # every corrupted replica, once its byte is put back, verifies again at its committed step
        # (a rank may hold no replica: placement spreads them over switches, not evenly over ranks; the sum
        # above says every one of the 4 k replicas was corrupted)
        assert sorted(r["corrupt_restored"]) == sorted(r["corrupt"]), r
        assert all(want == got for want, got in r["corrupt_restored"].values()), r["corrupt_restored"]
        assert r["local_snapshot"]["step"] == steps and r["local_snapshot"]["opt_sha"] == r["owner"][str(steps)]
        assert r["recoverable_step"] in (steps - 1, steps)
    if k == 2 or not threaded:
        return  # on/off identity is checked with the threaded k=1 runs
    proc, off = run(slurm_env, tmp_path, dataset, "off", pp=pp, steps=steps)
    assert sorted(off) == [0, 1, 2, 3], proc.stdout + proc.stderr
    for rank in range(4):
        assert on[rank]["losses"] == off[rank]["losses"], rank
        assert on[rank]["state_hash"] == off[rank]["state_hash"], rank


def test_killing_a_sender_during_h2h_leaves_holder_committed_replica_intact(slurm_cluster, slurm_env, tmp_path, dataset):
    victim, kill_step, kill_chunk = 1, 3, 3
    proc, recs = run(slurm_env, tmp_path, dataset, "kill", steps=6,
                     args=["--protect", "--record", "--chunk-bytes", "16384", "--commit-timeout-s", "15",
                           "--kill", f"{victim}:{kill_step}:{kill_chunk}"])
    out = proc.stdout + proc.stderr
    assert victim not in recs and sorted(recs) == [0, 2, 3], out
    victim_shard = "opt/pp0/tp0/dp1"
    holders = [r for r in recs.values() if victim_shard in r["after_fault"]]
    assert len(holders) == 1, out
    h = holders[0]
    got = h["after_fault"][victim_shard]
    assert got["verified"], got
    # the victim died sending S(kill_step-1); its newest complete state was S(kill_step-1), the holder's
    # committed copy is S(kill_step-2): intact, verified, one step old, equal to what the victim had then
    assert got["step"] == kill_step - 2
    victim_owner = json.loads((tmp_path / "kill" / "out" / f"owner{victim}.json").read_text())
    # the victim's last commit was S(kill_step-2) (in step kill_step-1); it had computed S(kill_step-1) and died
    # copying it, so the holder's copy is one step behind the victim's newest state
    assert max(int(s) for s in victim_owner) == kill_step - 2
    assert got["sha"] == victim_owner[str(kill_step - 2)]  # byte for byte the victim's shard of that step
    # every surviving shard's replica also still verifies
    for r in recs.values():
        assert "error" in r
        for shard, v in r["after_fault"].items():
            assert v["verified"], (r["rank"], shard, v)
            assert v["step"] >= kill_step - 2


def test_bad_chunk_size_and_low_memory_fail_at_start_up_on_every_rank(slurm_cluster, slurm_env, tmp_path, dataset):
    proc, recs = run(slurm_env, tmp_path, dataset, "chunk0", steps=1, nodes=2,
                     args=["--protect", "--chunk-bytes", "0"])
    assert sorted(recs) == [0, 1], proc.stdout + proc.stderr
    for r in recs.values():
        assert "resilience.chunk_bytes must be a positive number of bytes, got 0" in r["create_error"]
        assert r["allocations"] == []
    proc, recs = run(slurm_env, tmp_path, dataset, "lowmem", steps=1, nodes=2,
                     args=["--protect", "--mem-available", "1:1000000"])
    assert sorted(recs) == [0, 1], proc.stdout + proc.stderr
    for r in recs.values():
        assert "rank 1: not enough host memory for the replication buffers" in r["create_error"], r["create_error"]
        assert "MemAvailable is 1000000 bytes" in r["create_error"]
        assert r["allocations"] == []  # checked on every rank before any rank allocated


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-x", "-q"]))
