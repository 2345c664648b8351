"""More recovery paths on the real local Slurm cluster (same oracle as :mod:`test_hotswap`, DESIGN.md
section 10): pipeline parallelism, double faults (k=2 in memory, k=1 via the persistent checkpoint) and an
exhausted spare pool.

Each test submits a tiny GPT with ``phoenix submit --site local``, makes real faults happen (slots and
slurmd of whole nodes SIGKILLed, the node marked down) and compares the coordinator's ``job_done``
final hash with a fault-free run of the same configuration.
"""

from __future__ import annotations

import json

import pytest

from test_hotswap import CONFIG, PHASES, Job, _wait, data, env  # noqa: F401 -- fixtures reused
from phoenix_hpc.slurm import cluster as lc
from phoenix_hpc.slurm import procs

pytestmark = pytest.mark.cluster

STEPS = 24


def _config(**over) -> dict:
    """:data:`test_hotswap.CONFIG` with sections updated from ``over`` (``section={key: value}``)."""
    cfg = {k: (dict(v) if isinstance(v, dict) else v) for k, v in CONFIG.items()}
    for section, values in over.items():
        cfg[section].update(values)
    cfg["training"]["steps"] = STEPS
    return cfg


# pp=2 x dp=2 on 4 active nodes + 1 spare (the shape of examples/gpt-small.yaml)
PP_CONFIG = _config(parallelism={"pp": 2, "dp": 2}, resources={"nodes": 4, "spares": 1})


def _run_reference(env, data, tmp, name, config) -> dict:  # noqa: F811
    job = Job(env, tmp, data, name, config)
    try:
        done = job.wait_end()
    finally:
        job.cancel()
    assert done["step"] == STEPS and done["steps_agree"]
    assert not job.events("fault") and not job.events("recovery_start")
    print(f"fault-free {name}: {job.elapsed_s:.1f} s, final hash {done['final_hash'][:16]}")
    return done


def _kill_nodes(cluster, job: Job, logicals: list[int], at_step: int) -> list[str]:
    """SIGKILL the nodes of ``logicals`` (generation-0 world rank == logical rank) once logical rank
    ``logicals[0]`` logged ``at_step``; mark them down. Returns the node names."""
    nodes = [job.node_of(r) for r in logicals]
    _wait(lambda: job.step(logicals[0]) >= at_step, 180, f"step {at_step} on logical rank {logicals[0]}",
          poll_s=0.01)
    for n in nodes:
        lc.kill_node(cluster, n, mark_down_reason="hot-swap test: node loss")
    return nodes


def _revive(cluster, nodes: list[str]) -> None:
    for n in nodes:
        if not procs.is_alive(cluster.daemons[f"slurmd:{n}"]):
            lc.revive_node(cluster, n)


def _same_hash(done: dict, ref: dict) -> None:
    assert done["final_hash"] == ref["final_hash"], (
        f"final hash {done['final_hash'][:16]} != fault-free {ref['final_hash'][:16]}; "
        f"rank hashes {done['rank_hashes']} vs {ref['rank_hashes']}")
    assert done["step"] == STEPS and done["steps_agree"]


@pytest.fixture(scope="module")
def pp_reference(env, data, tmp_path_factory):  # noqa: F811
    return _run_reference(env, data, tmp_path_factory.mktemp("ref-pp"), "ref-pp", PP_CONFIG)


@pytest.mark.parametrize("victim", [1, 3], ids=["first-stage", "last-stage"])
def test_pp2_node_loss_is_hot_swapped_with_identical_final_hash(env, data, pp_reference, slurm_cluster,  # noqa: F811
                                                                 tmp_path, victim):
    """Logical 1 = (pp0, dp1), first pipeline stage; logical 3 = (pp1, dp1), the stage computing the loss."""
    job = Job(env, tmp_path, data, f"pp-node-loss-{victim}", PP_CONFIG)
    nodes: list[str] = []
    try:
        nodes = _kill_nodes(slurm_cluster, job, [victim], 8)
        done = job.wait_end(240)
    finally:
        job.cancel()
        _revive(slurm_cluster, nodes)
    _same_hash(done, pp_reference)
    (rec,) = job.events("recovery_done")
    assert rec["action"] == "hot_swap" and rec["steps_replayed"] <= 1 and set(rec["phases"]) == PHASES
    (plan,) = job.events("recovery_plan")
    (join,) = plan["joins"]
    assert join["logical_rank"] == victim and join["world_rank"] == 4
    spare = json.loads((job.run_dir / "ranks" / f"rank{victim}.json").read_text())
    assert spare["world_rank"] == 4 and spare["joined"]
    assert spare["state_hash"] == pp_reference["rank_hashes"][victim]
    print(f"pp=2 node loss of logical {victim}: job {job.elapsed_s:.1f} s, recovery {rec['total_s']} s {rec['phases']}, "
          f"R={rec['recoverable_step']}, replayed {rec['steps_replayed']}")
