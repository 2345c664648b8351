"""A model of the user's own, protected end to end: examples/custom-model (a Llama-style decoder in its own
package, built through ``model.factory`` and imported through ``python_path``) on the real local Slurm
cluster. Oracle as in :mod:`test_hotswap` (docs/design.md section 10): a fault-free run gives the reference
final hash; the same job with a node killed mid-run must end with the identical final hash, hot swapped to
the spare, replaying at most one step. At pp=2 x dp=2, the example's own shape: the factory builds each stage
(a pp=1 model is the factory's stage 0 of 1, built through the same call; the hot swap at pp=1 is that of
test_hotswap.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from test_hotswap import CONFIG, PHASES, Job, _run_reference, _wait  # noqa: F401
from phoenix_hpc.slurm import cluster as lc
from phoenix_hpc.slurm import procs

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "custom-model"
STEPS = 20


def _config(pp: int, nodes: int) -> dict:
    """examples/custom-model/job.yaml, shrunk (steps, width) and with the test's timeouts and node counts."""
    cfg = yaml.safe_load((EXAMPLE / "job.yaml").read_text())
    cfg["python_path"] = [str(EXAMPLE)]  # the job file is written elsewhere: point at the package's folder
    cfg["model"]["hidden_size"] = cfg["model"]["options"]["hidden_size"] = 32
    cfg["model"]["seq_length"] = cfg["model"]["options"]["seq_length"] = 32
    cfg["model"]["options"].update(layers=2, heads=2, ffn_hidden_size=64)
    cfg["training"].update(steps=STEPS, log_interval=10)
    cfg["parallelism"] = {"tp": 1, "pp": pp, "dp": 2}
    cfg["resilience"] = dict(CONFIG["resilience"])
    cfg["resources"] = {"nodes": nodes, "spares": 1, "time_limit": "00:05:00"}
    cfg.pop("data", None)  # Job sets data.path
    return cfg


def _node_loss(env, data, slurm_cluster, tmp: Path, name: str, cfg: dict, victim: int) -> tuple[Job, dict]:
    job = Job(env, tmp, data, name, cfg)
    node = None
    try:
        node = job.node_of(victim)
        # the node's processes are found before the wait (a /proc scan takes tens to hundreds of ms on a loaded
        # host, a few of this job's steps), so that the kill lands well before the last step
        targets = lc.node_kill_targets(slurm_cluster, node)
        _wait(lambda: job.step(victim) >= 8, 180, f"step 8 on logical rank {victim}", poll_s=0.01)
        killed_at = job.step(victim)  # before the kill: the spare appends to the same log once it holds the rank
        lc.kill_node(slurm_cluster, node, mark_down_reason="custom-model test: node loss", targets=targets)
        assert killed_at < STEPS, "the victim finished its steps before the kill: no fault was tested"
        done = job.wait_end(240)
    finally:
        job.cancel()
        if node and not procs.is_alive(slurm_cluster.daemons[f"slurmd:{node}"]):
            lc.revive_node(slurm_cluster, node)
    return job, done


def _check(job: Job, done: dict, ref: dict, victim: int, spare_world_rank: int) -> None:
    assert done["final_hash"] == ref["final_hash"], (
        f"final hash {done['final_hash'][:16]} != fault-free {ref['final_hash'][:16]}; "
        f"rank hashes {done['rank_hashes']} vs {ref['rank_hashes']}")
    assert done["step"] == STEPS and done["steps_agree"]
    (rec,) = job.events("recovery_done")
    assert rec["action"] == "hot_swap" and rec["steps_replayed"] <= 1 and set(rec["phases"]) == PHASES
    spare = json.loads((job.run_dir / "ranks" / f"rank{victim}.json").read_text())
    assert spare["world_rank"] == spare_world_rank and spare["joined"]
    assert spare["state_hash"] == ref["rank_hashes"][victim]
    print(f"custom model, node loss of logical {victim}: job {job.elapsed_s:.1f} s, recovery {rec['total_s']} s "
          f"{rec['phases']}, replayed {rec['steps_replayed']}")


@pytest.mark.parametrize("pp, nodes, victim", [(2, 4, 3)], ids=["pp2-dp2"])
def test_custom_model_node_loss_identical_final_hash(env, data, slurm_cluster, tmp_path, pp, nodes, victim):  # noqa: F811
    """Logical 3 = (pp1, dp1), the last stage, whose module returns the logits. The spare is the first world
    rank after the active ones."""
    cfg = _config(pp=pp, nodes=nodes)
    (tmp_path / "ref").mkdir()
    ref = _run_reference(env, data, tmp_path / "ref", "ref", cfg)
    job, done = _node_loss(env, data, slurm_cluster, tmp_path, "node-loss", cfg, victim=victim)
    _check(job, done, ref, victim=victim, spare_world_rank=nodes)
