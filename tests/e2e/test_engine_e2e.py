"""The torch engine end to end: real processes under srun --mpi=pmix on the local Slurm cluster, pp=2 x dp=2
over gloo on CPU, 2 spare nodes in standby, real text (the Python standard library's source)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from phoenix_hpc.data.prepare import prepare_dataset, stdlib_dir

pytestmark = pytest.mark.cluster

STEPS, SNAP = 8, 3


def _config(run_dir: Path, data: str, **over) -> Path:
    cfg = {
        "name": "engine-e2e",
        "engine": "torch",
        "model": {"layers": 2, "hidden_size": 32, "heads": 2, "vocab_size": 256, "seq_length": 32},
        "parallelism": {"tp": 1, "pp": 2},  # dp derived from the 4 active slots
        "training": {"steps": STEPS, "micro_batch_size": 2, "global_batch_size": 8, "lr": 3e-3,
                     "warmup_steps": 2, "seed": 7},
        "data": {"path": data},
        "resilience": {"enabled": False},
        "resources": {"nodes": 4, "spares": 2},
    }
    for k, v in over.items():
        cfg[k] = {**cfg[k], **v} if isinstance(v, dict) else v
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))
    return run_dir


def _srun(env, run_dir: Path, nodes: int, *extra: str) -> subprocess.CompletedProcess:
    cmd = ["srun", "-N", str(nodes), "--ntasks-per-node=1", "--mpi=pmix", "--no-kill", "--kill-on-bad-exit=0",
           "-t", "5", sys.executable, "-m", "phoenix_hpc.launch.rank", "--run-dir", str(run_dir), *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


def _ranks(run_dir: Path) -> list[dict]:
    return [json.loads((run_dir / "ranks" / f"rank{r}.json").read_text()) for r in range(4)]


def _losses(run_dir: Path, rank: int) -> list:
    """The rank's loss per step, from its step log (its summary keeps only the first and the last)."""
    lines = (run_dir / "ranks" / f"rank{rank}.steps.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in lines if line.strip()]


@pytest.fixture(scope="module")
def runs(slurm_env, tmp_path_factory):
    base = tmp_path_factory.mktemp("engine")
    data = base / "data" / "stdlib"
    prepare_dataset(stdlib_dir(), data, max_bytes=1_000_000)
    out = {}
    for name, extra in (("a", ["--snapshot-at", str(SNAP)]), ("b", []), ("c", None)):
        run_dir = _config(base / name, str(data))
        if extra is None:
            extra = ["--restore-dir", str(base / "a" / "snapshots" / f"step{SNAP}")]
        proc = _srun(slurm_env, run_dir, 6, *extra)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        out[name] = (run_dir, proc)
    out["data"] = str(data)
    return out


def test_two_runs_identical_and_loss_falls(runs):
    a, b = _ranks(runs["a"][0]), _ranks(runs["b"][0])
    assert all(r["status"] == "done" and r["steps"] == STEPS for r in a + b)
    assert [r["state_hash"] for r in a] == [r["state_hash"] for r in b]
    assert len({r["state_hash"] for r in a}) == 4
    last = [r["rank"] for r in a if r["coord"]["pp"] == 1]
    assert len(last) == 2 and _losses(runs["a"][0], last[0]) == _losses(runs["a"][0], last[1])  # averaged over DP
    losses = _losses(runs["a"][0], last[0])
    assert len(losses) == STEPS and sum(losses[-2:]) / 2 < sum(losses[:2]) / 2 - 0.2, losses
    assert [r["first_loss"] for r in a if r["rank"] == last[0]] == [losses[0]]
    assert [r["final_loss"] for r in a if r["rank"] == last[0]] == [losses[-1]]
    assert "step      8/8 | loss" in runs["a"][1].stdout


def test_restore_into_fresh_processes_gives_identical_hashes(runs):
    a, c = _ranks(runs["a"][0]), _ranks(runs["c"][0])
    assert all(r["start_step"] == SNAP and r["steps"] == STEPS for r in c)
    assert [r["state_hash"] for r in c] == [r["state_hash"] for r in a]


def test_params_identical_on_dp_peers_and_shards_cover_params_once(runs):
    a = _ranks(runs["a"][0])
    by = {(r["coord"]["pp"], r["coord"]["dp"]): r for r in a}
    for pp in (0, 1):
        assert by[(pp, 0)]["param_hash"] == by[(pp, 1)]["param_hash"]
        assert by[(pp, 0)]["optimizer_hash"] != by[(pp, 1)]["optimizer_hash"]
    snap = runs["a"][0] / "snapshots" / f"step{SNAP}"
    assert sorted(p.name for p in snap.iterdir()) == [f"pp{p}-tp0-dp{d}.pt" for p in (0, 1) for d in (0, 1)]
    for pp in (0, 1):
        s0, s1 = (torch.load(snap / f"pp{pp}-tp0-dp{d}.pt", weights_only=True) for d in (0, 1))
        assert s0["envelope"]["step"] == SNAP and s0["envelope"]["data"]["position"] == SNAP * 8
        assert s0["params"].keys() == s1["params"].keys()
        assert all(torch.equal(s0["params"][k], s1["params"][k]) for k in s0["params"])
        assert not set(s0["optimizer"]) & set(s1["optimizer"])  # distinct logical ids per DP rank
        for pname, p in s0["params"].items():
            short = pname.split("/", 3)[3]
            mains = [s["optimizer"][f"opt/pp{pp}/tp0/dp{d}/{short}/main"] for d, s in enumerate((s0, s1))
                     if f"opt/pp{pp}/tp0/dp{d}/{short}/main" in s["optimizer"]]
            joined = torch.cat(mains)
            assert joined.numel() == p.numel(), pname  # every element exactly once
            assert torch.equal(joined, p.reshape(-1).float()), pname  # fp32 main params == model params
        moments = torch.cat([t for n, t in s0["optimizer"].items() if n.endswith("/exp_avg_sq")])
        assert moments.abs().sum() > 0


def test_bad_grid_missing_data_and_megatron_without_cuda(slurm_env, runs, tmp_path):
    grid = _config(tmp_path / "grid", runs["data"], parallelism={"tp": 1, "pp": 2, "dp": 3},
                   resources={"nodes": 1, "spares": 0})
    p = _srun(slurm_env, grid, 1)
    assert p.returncode == 2
    assert "tp (1) x pp (2) x dp (3) = 6 does not match the 1 active slots" in p.stderr
    nodata = _config(tmp_path / "nodata", str(tmp_path / "no" / "such"), resources={"nodes": 1, "spares": 0})
    p = _srun(slurm_env, nodata, 1)
    assert p.returncode == 2 and "is not a Megatron indexed dataset" in p.stderr and "no/such" in p.stderr
    notidx = tmp_path / "notidx"
    (tmp_path / "notidx.idx").write_text("plain text, not an index")
    (tmp_path / "notidx.bin").write_text("x")
    bad = _config(tmp_path / "badidx", str(notidx), resources={"nodes": 1, "spares": 0})
    p = _srun(slurm_env, bad, 1)
    assert p.returncode == 2 and "MMIDIDX" in p.stderr
    if not torch.cuda.is_available():
        meg = _config(tmp_path / "meg", runs["data"], engine="megatron", resources={"nodes": 1, "spares": 0})
        p = _srun(slurm_env, meg, 1)
        assert p.returncode == 2 and "engine 'megatron' needs CUDA" in p.stderr
    for d in ("grid", "nodata", "badidx", "meg"):
        if (tmp_path / d).exists():
            assert [x.name for x in (tmp_path / d).iterdir()] == ["config.yaml"], d  # no partial files
    assert "Traceback" not in p.stderr
