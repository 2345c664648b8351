"""More recovery paths on the real local Slurm cluster (same oracle as :mod:`test_hotswap`, docs/design.md
section 10): pipeline parallelism, double faults (k=2 in memory, k=1 via the persistent checkpoint) and an
exhausted spare pool. (The in-job checkpoint restart, ``checkpoint.restart: in-job``, is the job of
tests/e2e/test_drill.py's in-job drill: a node loss and a crash, each restarted in the same allocation.)

Each test submits a tiny GPT with ``phoenix submit --site local``, makes real faults happen (slots and
slurmd of whole nodes SIGKILLed, the node marked down) and compares the coordinator's ``job_done``
final hash with a fault-free run of the same configuration.
"""

from __future__ import annotations

import json
import signal

import pytest

from test_hotswap import (CONFIG, PHASES, PATHS, Job, _inject, _run_reference, _wait, check_path,  # noqa: F401
                          with_path)
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


# pp=2 x dp=2 on 4 active nodes + 1 spare (the shape of examples/gpt-small.yaml). 80 steps: the second node
# loss of a job waits for the first hot swap's recovery_done, which the coordinator journals when the new
# generation's commit past the fault step reaches it with the heartbeats (up to an interval, ~25 steps of
# this model here); the job must still be training when that kill lands
PP_STEPS = 80
PP_CONFIG = _config(parallelism={"pp": 2, "dp": 2}, resources={"nodes": 4, "spares": 1})
PP_CONFIG["training"]["steps"] = PP_STEPS


def _kill_nodes(cluster, job: Job, logicals: list[int], at_step: int) -> list[str]:
    """SIGKILL the nodes of ``logicals`` (generation-0 world rank == logical rank) once logical rank
    ``logicals[0]`` logged ``at_step``, all in one sweep; mark them down. Returns the node names. The
    processes to kill are found before the wait (a scan of ``/proc`` takes tens to hundreds of milliseconds on
    a loaded host): killed node by node, a first hot swap could end before the second node dies."""
    nodes = [job.node_of(r) for r in logicals]
    targets = {n: lc.node_kill_targets(cluster, n) for n in nodes}
    _wait(lambda: job.step(logicals[0]) >= at_step, 180, f"step {at_step} on logical rank {logicals[0]}",
          poll_s=0.01)
    procs.signal_procs([p for n in nodes for p in targets[n]], signal.SIGKILL)
    for n in nodes:  # waits for them, sweeps up what was forked since the scan, marks the node down
        lc.kill_node(cluster, n, mark_down_reason="hot-swap test: node loss", targets=targets[n])
    return nodes


def _revive(cluster, nodes: list[str]) -> None:
    for n in nodes:
        if not procs.is_alive(cluster.daemons[f"slurmd:{n}"]):
            lc.revive_node(cluster, n)


def _same_hash(done: dict, ref: dict) -> None:
    assert done["final_hash"] == ref["final_hash"], (
        f"final hash {done['final_hash'][:16]} != fault-free {ref['final_hash'][:16]}; "
        f"rank hashes {done['rank_hashes']} vs {ref['rank_hashes']}")
    assert done["step"] == ref["step"] and done["steps_agree"]


@pytest.fixture(scope="module")
def pp_reference(env, data, tmp_path_factory):  # noqa: F811
    return _run_reference(env, data, tmp_path_factory.mktemp("ref-pp"), "ref-pp", PP_CONFIG)


@pytest.mark.parametrize("victims,path,flip", [((1, 3), "rebind", None), ((3,), "rebuild", (2, 40))],
                         ids=["first-then-last-stage-rebind", "last-stage-rebuild"])
def test_pp2_node_loss_is_hot_swapped_with_identical_final_hash(env, data, pp_reference, slurm_cluster,  # noqa: F811
                                                                 tmp_path, victims, path, flip):
    """Logical 1 = (pp0, dp1), first pipeline stage; logical 3 = (pp1, dp1), the stage computing the loss.
    On rebind one job loses both, one after the other (two spares: the node of logical 1 at step 8, the node
    of logical 3 at step 16, after the first hot swap); each loss is checked as its own job would be.

    On rebuild the job also gets a bitflip (``flip``: logical rank 2, (pp1, dp0), at step 40, after the hot
    swap): replica agreement at dp = 2 (docs/design.md section 6) names both replicas of stage pp1, no
    majority, and every member rolls back before the difference on the rebuild path (a local recovery to
    step 38) and replays: the final hash is still the fault-free run's."""
    cfg = dict(PP_CONFIG, resources=dict(PP_CONFIG["resources"], spares=len(victims)))
    job = Job(env, tmp_path, data, f"pp-node-loss-{'-'.join(map(str, victims))}-{path}", with_path(cfg, path))
    nodes: list[str] = []
    try:
        if flip:  # armed on its survivor before the loss, at a named step after the hot swap
            rep = _inject(job, "bitflip", "forward", at_step=flip[1], rank=flip[0], wait=False)
            assert rep["at_step"] == flip[1], rep
        for i, victim in enumerate(victims):
            if i:
                _wait(lambda: len(job.events("recovery_done")) == i, 120, f"hot swap {i}", poll_s=0.2)
            nodes += _kill_nodes(slurm_cluster, job, [victim], 8 * (i + 1))
        done = job.wait_end(240)
    finally:
        job.cancel()
        _revive(slurm_cluster, nodes)
    _same_hash(done, pp_reference)
    recs = job.events("recovery_done")
    n = len(victims) + (flip is not None)
    assert [r["generation"] for r in recs] == list(range(1, n + 1)), recs
    for rec in recs[:len(victims)]:
        assert rec["action"] == "hot_swap" and rec["steps_replayed"] <= 1 and set(rec["phases"]) == PHASES
    if flip:
        at = flip[1]
        (sc,) = job.events("silent_corruption")
        assert (sc["step"], sc["pp"], sc["suspects"], sc.get("majority")) == (at - 1, 1, [2, 3], None), sc
        fl = recs[-1]
        assert (fl["action"], fl["recoverable_step"], fl["steps_replayed"]) == ("local_recovery", at - 2, 2), fl
        assert not [d for d in job.events("slots_dead") if d["kind"] == "repeated_corruption"]
        print(f"bitflip dp=2 at step {at} ({path}): recovery {fl['total_s']} s {fl['phases']}, "
              f"R={fl['recoverable_step']}, replayed {fl['steps_replayed']}")
    # a survivor blocked in a collective with a survivor that saw the dead rank is released by that
    # survivor's destroyed groups (Member.release_groups), not by resilience.collective_timeout_s
    timeouts = [f for f in job.events("fault") if f.get("kind") == "collective_timeout"]
    assert not timeouts, f"a survivor waited for the collective timeout: {timeouts}"
    plans = job.events("recovery_plan")
    assert len(plans) == n and all(not p["joins"] for p in plans[len(victims):]), plans
    for i, (plan, victim) in enumerate(zip(plans, victims)):
        (join,) = plan["joins"]
        assert join["logical_rank"] == victim and join["world_rank"] == 4 + i
        spare = json.loads((job.run_dir / "ranks" / f"rank{victim}.json").read_text())
        assert spare["world_rank"] == 4 + i and spare["joined"]
        assert spare["state_hash"] == pp_reference["rank_hashes"][victim]
    check_path(job, PP_CONFIG, path)
    for victim, rec in zip(victims, recs):
        print(f"pp=2 node loss of logical {victim}: job {job.elapsed_s:.1f} s, recovery {rec['total_s']} s "
              f"{rec['phases']}, R={rec['recoverable_step']}, replayed {rec['steps_replayed']}")


# dp=3 on 3 active nodes + 2 spares, replicas on the plain DP ring (shard i held by i+1, then i+2), a
# persistent checkpoint every 5 steps. Killing the nodes of logical ranks 1 and 2 in the same step loses
# shard dp1's owner and its first holder.
def _dp3_config(k: int) -> dict:
    return _config(parallelism={"dp": 3}, resources={"nodes": 3, "spares": 2},
                   training={"global_batch_size": 6},
                   resilience={"k": k, "placement_levels": ["node"], "checkpoint": {"interval_steps": 5}})


@pytest.fixture(scope="module")
def dp3_reference(env, data, tmp_path_factory):  # noqa: F811
    return _run_reference(env, data, tmp_path_factory.mktemp("ref-dp3"), "ref-dp3", _dp3_config(1))


def _double_fault(env, data, cluster, tmp_path, name: str, k: int, path: str = "rebind") -> Job:  # noqa: F811
    job = Job(env, tmp_path, data, name, with_path(_dp3_config(k), path))
    nodes: list[str] = []
    try:
        nodes = _kill_nodes(cluster, job, [1, 2], 8)
        job.done = job.wait_end(240)
    finally:
        job.cancel()
        _revive(cluster, nodes)
    return job


# A double fault runs on one recovery path per k: k=2 (memory serves) on rebind, k=1 (the restart from the
# persistent checkpoint) on rebuild. The other path of each is the same scenario on the same path machinery,
# which the single-fault jobs of both paths (test_hotswap.py) and the spares-lost jobs below check.
@pytest.mark.parametrize("path", ["rebind"])
def test_k2_owner_and_one_holder_lost_in_one_step_is_survived_in_memory(env, data, dp3_reference,  # noqa: F811
                                                                        slurm_cluster, tmp_path, path):
    job = _double_fault(env, data, slurm_cluster, tmp_path, f"double-k2-{path}", k=2, path=path)
    _same_hash(job.done, dp3_reference)
    (rec,) = job.events("recovery_done")
    assert rec["action"] == "hot_swap" and rec["steps_replayed"] <= 1 and set(rec["phases"]) == PHASES
    assert not job.events("checkpoint_restart") and not job.events("fallback")
    plan = job.events("recovery_plan")[-1]
    assert sorted(j["logical_rank"] for j in plan["joins"]) == [1, 2]
    opt = {t["shard_id"]: t["sender"] for t in plan["transfers"] if t["kind"] == "optimizer"}
    assert opt == {"opt/pp0/tp0/dp1": 0, "opt/pp0/tp0/dp2": 0}  # both from the second holder, logical 0
    check_path(job, _dp3_config(2), path)
    print(f"k=2 double fault: job {job.elapsed_s:.1f} s, recovery {rec['total_s']} s {rec['phases']}, "
          f"R={rec['recoverable_step']}")


@pytest.mark.parametrize("path", ["rebuild"])
def test_k1_owner_and_its_holder_lost_restarts_in_the_job_from_the_persistent_checkpoint(
        env, data, dp3_reference, slurm_cluster, tmp_path, path):  # noqa: F811
    job = _double_fault(env, data, slurm_cluster, tmp_path, f"double-k1-{path}", k=1, path=path)
    _same_hash(job.done, dp3_reference)
    (restart,) = job.events("checkpoint_restart")
    assert "opt/pp0/tp0/dp1" in restart["lost_shards"]
    ck = restart["checkpoint_step"]
    assert ck is not None and ck % 5 == 0 and ck >= 5 and restart["lost_steps"] >= 1
    (rec,) = job.events("recovery_done")
    assert rec["action"] == "checkpoint_restart" and rec["recoverable_step"] == ck
    assert rec["steps_replayed"] == restart["lost_steps"] and set(rec["phases"]) == PHASES
    assert not job.events("invariant_violation") and not job.events("fallback")
    loads = [json.loads(x) for r in range(3)
             for x in (job.run_dir / "ranks" / f"rank{r}.persist.jsonl").read_text().splitlines()]
    assert sorted(x["step"] for x in loads if x.get("in_job")) == [ck] * 3
    check_path(job, _dp3_config(1), path)
    print(f"k=1 double fault: job {job.elapsed_s:.1f} s, restart from checkpoint step {ck}, "
          f"{restart['lost_steps']} step(s) lost and trained again, recovery {rec['total_s']} s {rec['phases']}")


def _inject_ahead(job: Job, kind: str, phase: str, rank: int) -> dict:
    """``phoenix inject-fault --no-wait`` without ``--at-step``: the target arms it a few steps after the step
    it is in (the logs this test reads lag a fast job); returns the command's JSON (``at_step``: armed)."""
    from click.testing import CliRunner

    from phoenix_hpc.cli.main import cli

    r = CliRunner().invoke(cli, ["inject-fault", str(job.run_dir), "--kind", kind, "--rank", str(rank), "--phase",
                                 phase, "--json", "--no-wait"], env=job.env, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _corrupt_then_kill_owner(env, data, cluster, tmp_path, name: str, k: int) -> Job:  # noqa: F811
    """``phoenix inject-fault --kind corrupt-replica`` on shard dp1 (owner logical rank 1), landing at the
    start of the next recovery on one of its holders, then the owner's node is killed: the recovery needs
    that shard from a replica."""
    job = Job(env, tmp_path, data, name, _dp3_config(k))
    nodes: list[str] = []
    try:
        _wait(lambda: job.step(1) >= 3, 180, "the first commits")  # the owner has said where its replica went
        rep = _inject_ahead(job, "corrupt-replica", "recovery", rank=1)  # lands in the next recovery from `at`
        assert rep["kind"] == "corrupt-replica" and len(rep["targets"]) == 1, rep
        at = rep["at_step"]
        nodes = _kill_nodes(cluster, job, [1], at)
        job.done = job.wait_end(240)
        job.holder = rep["targets"][0]
    finally:
        job.cancel()
        _revive(cluster, nodes)
    (fired,) = [f for f in _fired_of(job) if f["kind"] == "corrupt_replica"]
    assert fired["world_rank"] == job.holder and fired["phase"] == "recovery"
    rejected = job.events("replica_rejected")
    assert rejected and {(r["world_rank"], r["shard_id"]) for r in rejected} == {(job.holder, "opt/pp0/tp0/dp1")}
    assert all("fails its checksum" in r["reason"] for r in rejected)
    return job


def _fired_of(job: Job) -> list[dict]:
    from phoenix_hpc.faults.trigger import read_fired

    return read_fired(job.run_dir)


def test_k2_corrupt_replica_is_rejected_and_the_other_replica_serves(env, data, dp3_reference,  # noqa: F811
                                                                     slurm_cluster, tmp_path):
    job = _corrupt_then_kill_owner(env, data, slurm_cluster, tmp_path, "corrupt-k2", k=2)
    _same_hash(job.done, dp3_reference)
    (rec,) = job.events("recovery_done")
    assert rec["action"] == "hot_swap" and not job.events("checkpoint_restart") and not job.events("fallback")
    plan = job.events("recovery_plan")[-1]
    opt = {t["shard_id"]: t["sender"] for t in plan["transfers"] if t["kind"] == "optimizer"}
    assert set(opt) == {"opt/pp0/tp0/dp1"} and opt["opt/pp0/tp0/dp1"] != job.holder  # the other holder
    assert not job.events("invariant_violation") and not job.events("evidence_rejected")


def test_k1_corrupt_replica_restarts_every_member_from_the_persistent_checkpoint(env, data, dp3_reference,  # noqa: F811
                                                                                slurm_cluster, tmp_path):
    job = _corrupt_then_kill_owner(env, data, slurm_cluster, tmp_path, "corrupt-k1", k=1)
    _same_hash(job.done, dp3_reference)
    (restart,) = job.events("checkpoint_restart")
    assert "opt/pp0/tp0/dp1" in restart["lost_shards"] and restart["lost_steps"] >= 1
    ck = restart["checkpoint_step"]
    loads = [json.loads(x) for r in range(3)
             for x in (job.run_dir / "ranks" / f"rank{r}.persist.jsonl").read_text().splitlines()]
    assert sorted(x["step"] for x in loads if x.get("in_job")) == [ck] * 3  # every member at the same step
    assert not job.events("invariant_violation")


def _arm_on_standby(job: Job, kind: str, phase: str, at_step: int, node: str) -> dict:
    """Arm a fault on the standby slot(s) of ``node`` for a step of the generation it will join, through the
    coordinator's operator channel (what ``phoenix inject-fault`` sends): the slot arms it while it waits to
    join. The command itself refuses a step phase on a node of spares only (they run no steps, so from the
    command it could only miss unless a recovery comes first); it takes a phase of a recovery
    (:func:`_inject_on_spares`)."""
    from phoenix_hpc.drills.inject import InjectRequest, send_request

    return send_request(job.run_dir, InjectRequest(kind, phase, at_step, {"node": node}, (), ()))


def _inject_on_spares(job: Job, kind: str, phase: str, node: str, at_step: int = 1) -> dict:
    """``phoenix inject-fault --node NODE --phase PHASE --at-step S --no-wait`` for the standby slot(s) of
    ``node`` (a phase of a recovery; a step the job has done already is the next recovery's for a spare): the
    slot arms it while it waits to join, and it lands in the first recovery in which that slot takes over a
    rank. Returns the command's ``--json`` summary."""
    from click.testing import CliRunner

    from phoenix_hpc.cli.main import cli

    r = CliRunner().invoke(cli, ["inject-fault", str(job.run_dir), "--kind", kind, "--node", node, "--phase", phase,
                                 "--at-step", str(at_step), "--no-wait", "--json"], env=job.env,
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _replicas(job: Job) -> dict[str, dict]:
    """``phoenix status --json``'s replicas by shard id."""
    from click.testing import CliRunner

    from phoenix_hpc.cli.main import cli

    r = CliRunner().invoke(cli, ["status", str(job.run_dir), "--json"], env=job.env, catch_exceptions=False)
    return {x["shard_id"]: x for x in json.loads(r.stdout)["replicas"]}


def test_a_fault_in_the_first_step_after_a_hot_swap_is_recovered_in_memory(env, data, dp3_reference,  # noqa: F811
                                                                          slurm_cluster, tmp_path):
    """No unprotected window: logical rank 1 crashes in its update of step ``at`` (hot swap, R = at - 1);
    the spare that takes it over crashes in the new generation's first step, before that generation's first
    commit. With k=1 the shard is then only in the previous generation's replica of R: the second recovery
    is a hot swap from memory, not a restart from the persistent checkpoint."""
    job = Job(env, tmp_path, data, "first-step", _dp3_config(1))
    try:
        _wait(lambda: job.step(1) >= 3, 180, "the first commits")
        # armed first, a few steps ahead, while the job is surely still short of its end (reading phoenix status
        # first took, on a loaded machine, until the last step)
        at = _inject_ahead(job, "crash", "optimizer", rank=1)["at_step"]  # armed by logical rank 1 itself
        spare = min(job.node_of(3), job.node_of(4))  # the spare node a plan takes first (best fit, then name)
        for s in (at - 1, at):  # the new generation's first step: R + 1 (R = at - 1, or at - 2 if a commit lagged)
            _arm_on_standby(job, "crash", "forward", s, spare)
        # during the run: one verified replica (k=1) per shard, on a holder of another node
        during = _wait(lambda: (lambda r: r if r and all(x["verified_replicas"] == 1 for x in r.values()) else None)(
            _replicas(job)), 60, "a verified replica of every shard in phoenix status", poll_s=1.0)
        assert all(x["verified_domains"] != [x["owner_node"]] and len(x["verified_domains"]) == 1
                   for x in during.values()), during
        job.done = job.wait_end(240)
    finally:
        job.cancel()
    _same_hash(job.done, dp3_reference)
    recs = job.events("recovery_done")
    assert [r["action"] for r in recs] == ["hot_swap", "hot_swap"], recs
    R = recs[0]["recoverable_step"]
    (second,) = [f for f in _fired_of(job) if f["world_rank"] >= 3]
    assert (second["step"], second["phase"]) == (R + 1, "forward_backward")  # before the new generation's commit
    assert recs[1]["recoverable_step"] == R
    for ev in ("checkpoint_restart", "fallback", "invariant_violation", "evidence_rejected"):
        assert not job.events(ev), (ev, job.events(ev))
    plan = job.events("recovery_plan")[-1]
    assert {t["shard_id"] for t in plan["transfers"] if t["kind"] == "optimizer"} == {"opt/pp0/tp0/dp1"}
    after = _replicas(job)  # after the run: the final generation's verified replicas, still one per shard
    assert sorted(after) == [f"opt/pp0/tp0/dp{i}" for i in range(3)]
    assert all(x["verified_replicas"] == 1 and len(x["verified_domains"]) == 1 for x in after.values()), after


def _spares_lost_in(phases: tuple[str, ...], env, data, dp3_reference, slurm_cluster, tmp_path, path) -> Job:  # noqa: F811
    """Logical rank 1's node is lost and each spare a plan names in turn crashes in the next of ``phases`` of
    its restore (a crash armed on it), until one more spare completes it. The coordinator aborts each cut
    plan in its restore phase and plans again with the next spare, from the same recoverable step; the final
    state is the fault-free one. Returns the job."""
    n = len(phases)
    cfg = dict(_dp3_config(1), resources={"nodes": 3, "spares": n + 1})
    job = Job(env, tmp_path, data, f"spares-lost-{path}", with_path(cfg, path))
    nodes: list[str] = []
    try:
        _wait(lambda: job.step(1) >= 3, 180, "the first commits")
        spares = sorted(job.node_of(w) for w in range(3, 4 + n))  # the order the plans take them: by name
        armed = [_inject_on_spares(job, "crash", ph, node) for ph, node in zip(phases, spares)]
        assert all(a["targets"] and a["armed_steps"] for a in armed), armed
        nodes = _kill_nodes(slurm_cluster, job, [1], 8)
        job.done = job.wait_end(240)
    finally:
        job.cancel()
        _revive(slurm_cluster, nodes)
    _same_hash(job.done, dp3_reference)
    fired = _fired_of(job)
    assert sorted((f["phase"], f["kind"]) for f in fired) == sorted((ph, "crash") for ph in phases), fired
    assert {f["world_rank"] for f in fired} == {t for a in armed for t in a["targets"]}, (fired, armed)
    assert [(a["generation"], a["phase"]) for a in job.events("recovery_aborted")] == [
        (g, "restore") for g in range(1, n + 1)]
    plans = job.events("recovery_plan")
    assert [[j["node"] for j in p["joins"]] for p in plans] == [[x] for x in spares]
    assert len({p["recoverable_step"] for p in plans}) == 1, plans
    (rec,) = job.events("recovery_done")
    assert rec["generation"] == n + 1 and rec["action"] == "hot_swap" and rec["steps_replayed"] <= 1
    for ev in ("checkpoint_restart", "fallback", "invariant_violation", "evidence_rejected"):
        assert not job.events(ev), (ev, job.events(ev))
    check_path(job, _dp3_config(1), path)
    return job


@pytest.mark.parametrize("path", PATHS)
def test_spares_lost_while_joining_and_after_every_member_arrived_are_replaced_by_the_next_spare(
        env, data, dp3_reference, slurm_cluster, tmp_path, path):  # noqa: F811
    """Three spares, the first two lost in turn. The first crashes as it starts to join (phase ``recovery``),
    while the survivors wait for it at the new generation's arrival barrier (on the rebuild path with their
    engines already ended): they answer the newer quiesce from the barrier with what they quiesced with. The
    second crashes once every member of its generation arrived and built its groups (phase ``restore``): the
    survivors that send it the lost rank's state are in their transfers, which never complete, and any other
    waits for it at the new protector's first collective; they answer the newer quiesce from where they wait
    (their transfers abandoned, the cut-short generation's groups released), long before the transfers'
    timeout (8 s here). The third spare completes the hot swap."""
    job = _spares_lost_in(("recovery", "restore"), env, data, dp3_reference, slurm_cluster, tmp_path, path)
    logs = job.output()
    assert "recovery re-planned as generation 2 while waiting for the members of generation 1" in logs, logs[-3000:]
    assert "recovery re-planned as generation 3 while in its transfers of generation 2" in logs, logs[-3000:]
    assert "while waiting for the members of generation 2;" not in logs  # nobody was cut at that barrier
    abort = job.events("recovery_aborted")[1]
    third = job.events("recovery_plan")[2]
    assert third["ts"] - abort["ts"] < 4.0, (abort, third)  # within the quiesce phase, not after a timeout


def test_the_only_spare_lost_while_it_joins_shrinks_the_job_from_the_cut_short_host_copies(  # noqa: F811
        env, data, slurm_cluster, tmp_path):
    """Rebuild path, one spare: logical rank 1's node is lost and the spare crashes as it starts to join, while
    the survivors wait at the barrier with their engines already ended. No spare is left, so the coordinator
    plans a shrink (dp 3 -> 2), which the survivors enter from the host copies they took for the cut-short
    plan. Oracle: a fault-free run of the same config drained with ``--shrink`` of logical rank 1 at the same
    step ends bitwise the same (test_shrink.py: a shrink is a pure function of S(R) and the new dp)."""
    from test_hotswap import _cli

    cfg = with_path(_config(parallelism={"dp": 3}, resources={"nodes": 3, "spares": 1},
                            training={"global_batch_size": 6},
                            resilience={"k": 1, "placement_levels": ["node"]}), "rebuild")
    cfg["training"]["steps"] = 2 * STEPS  # the loss lands while it trains; the drain of the reference in time
    job = Job(env, tmp_path, data, "only-spare-lost", cfg)
    nodes: list[str] = []
    try:
        _wait(lambda: job.step(1) >= 3, 180, "the first commits")
        armed = _inject_on_spares(job, "crash", "recovery", job.node_of(3))
        assert armed["targets"] == [3], armed
        nodes = _kill_nodes(slurm_cluster, job, [1], 16)
        done = job.wait_end(240)
    finally:
        job.cancel()
        _revive(slurm_cluster, nodes)
    assert done["step"] == 2 * STEPS and done["steps_agree"] and done["grid"] == [1, 1, 2], done
    assert [(a["generation"], a["phase"]) for a in job.events("recovery_aborted")] == [(1, "restore")]
    (sh,) = job.events("shrink")
    assert (sh["dp_from"], sh["dp_to"], sh["lost"]) == (3, 2, [3]), sh  # world rank 3 held logical rank 1
    assert [r["action"] for r in job.events("recovery_done")] == ["shrink"]
    assert "re-planned as generation 2 while waiting for the members of generation 1" in job.output()
    R = sh["recoverable_step"]

    ref = Job(env, tmp_path, data, "only-spare-lost-drain", cfg)
    try:
        _wait(lambda: ref.events("job_running"), 120, "job_running")
        r = _cli(ref, "drain", str(ref.run_dir), "--rank", "1", "--shrink", "--at-step", str(R + 1), "--json")
        assert r.exit_code == 0, r.output
        done_ref = ref.wait_end(timeout_s=240)
    finally:
        ref.cancel()
    assert done_ref["grid"] == [1, 1, 2] and done_ref["step"] == 2 * STEPS
    assert done["final_hash"] == done_ref["final_hash"], (done["rank_hashes"], done_ref["rank_hashes"])


def test_no_spare_left_stops_cleanly_naming_the_checkpoint(env, data, slurm_cluster, tmp_path):  # noqa: F811
    """1 spare, two node losses one after the other: the first is hot swapped, the second finds no spare;
    with ``resilience.spares_exhausted: stop`` (the default shrinks the torch engine's job, tests/e2e/test_shrink.py)
    the job stops (no training on) with a message naming the newest checkpoint and the command that resumes the run."""
    cfg = _config(resilience={"checkpoint": {"interval_steps": 5}, "spares_exhausted": "stop"})
    # the second loss must land while the job still trains: with STEPS it could finish first (the kill of a node
    # takes longer than the dozen steps left); the job stops at that loss, so more steps cost no time
    cfg["training"]["steps"] = 3 * STEPS
    job = Job(env, tmp_path, data, "no-spare", cfg)
    nodes: list[str] = []
    try:
        nodes = _kill_nodes(slurm_cluster, job, [1], 6)
        nodes.append(job.node_of(2))  # the spare, logical rank 1 after the hot swap
        _wait(lambda: job.events("recovery_done"), 120, "the first hot swap", poll_s=0.2)
        _wait(lambda: job.step(1) >= 12, 120, "step 12 after the hot swap", poll_s=0.01)
        lc.kill_node(slurm_cluster, nodes[1], mark_down_reason="hot-swap test: second node loss")
        _wait(lambda: job.events("coordinator_exit"), 150, "the end of the job", poll_s=0.3)
        _wait(lambda: job.client.show_job(job.job_id).get("JobState") not in ("RUNNING", "COMPLETING", "PENDING"),
              90, "the Slurm job to end", poll_s=0.5)
    finally:
        job.cancel()
        _revive(slurm_cluster, nodes)
    assert not job.events("job_done")
    (fb,) = job.events("fallback")
    assert "no spare left" in fb["reason"]
    ck = fb["checkpoint_step"]
    assert ck is not None and ck >= 10 and ck % 5 == 0
    assert f"step {ck}" in fb["message"] and "phoenix submit --resume" in fb["message"]
    assert (job.run_dir / "checkpoints" / f"step_{ck:08d}" / ".metadata").exists()
    print(f"no spare left: {fb['message']}")


def test_a_flipped_parameter_bit_is_found_at_the_next_commit_naming_the_member(env, data, dp3_reference,  # noqa: F811
                                                                               slurm_cluster, tmp_path):
    """Replica agreement (docs/design.md section 6) at dp = 3: ``phoenix inject-fault --kind bitflip`` on
    logical rank 1 flips one bit of one of its live parameters as iteration ``at`` starts, before its
    snapshot of step ``at - 1``; the commit fence of that step shows the DP peers' parameter digests differ,
    so no rank lets its next snapshot overwrite its copy of step ``at - 2``: every rank reports the
    difference, the journal names rank 1 against the majority 0, 2, and a local recovery rolls every member
    back to step ``at - 2`` (no spare; none is configured) and replays: the final hash equals the fault-free
    run's."""
    cfg = _dp3_config(1)
    cfg["resources"] = dict(cfg["resources"], spares=0)  # a repair needs no spare
    job = Job(env, tmp_path, data, "bitflip-dp3", cfg)
    try:
        # at a named step, sent once the job runs (before its first steps: this model trains about 50 steps a
        # second here, faster than a request relative to the live step reaches it, and the run has 24)
        rep = _inject(job, "bitflip", "forward", at_step=10, rank=1, wait=False)
        assert rep["kind"] == "bitflip" and len(rep["targets"]) == 1, rep
        at = rep["at_step"]
        assert at == 10, rep
        # the journal's end is all this test reads: it does not wait for Slurm to end the job (cancelled below)
        _wait(lambda: job.events("coordinator_exit"), 240, f"the end of the job (journal: {job.events()[-6:]})",
              poll_s=0.3)
    finally:
        job.cancel()
    (job.done,) = job.events("job_done")
    fired = [f for f in _fired_of(job) if f["kind"] == "bitflip"]
    assert [(f["step"], f["world_rank"]) for f in fired] == [(at, 1)], fired  # generation 0: world = logical
    (sc,) = job.events("silent_corruption")
    assert (sc["step"], sc["pp"], sc["tp"], sc["suspects"], sc["majority"]) == (at - 1, 0, 0, [1], [0, 2]), sc
    assert sc["members"]["0"] == sc["members"]["2"] != sc["members"]["1"]
    # every rank's fence saw it: each reported it, naming the step
    reports = [f for f in job.events("fault") if f["kind"] == "silent_corruption"]
    assert reports and all(f"differ at step {at - 1}" in f["message"] for f in reports), reports
    (dec,) = job.events("decision")
    assert dec["action"] == "local_recovery" and f"differ at step {at - 1}" in dec["reason"], dec
    (rec,) = job.events("recovery_done")
    assert rec["action"] == "local_recovery" and rec["recoverable_step"] == at - 2, rec  # the step before the flip
    plan = job.events("recovery_plan")[-1]
    assert sorted(r for r, _ in plan["rollbacks"]) == [0, 1, 2] and not plan["joins"], plan
    assert not job.events("clean_stop") and not job.events("slots_dead") and not job.events("fallback")
    _same_hash(job.done, dp3_reference)  # bit for bit the fault-free run
    print(f"bitflip dp=3 at step {at}: recovery {rec['total_s']} s {rec['phases']}, R={rec['recoverable_step']}, "
          f"replayed {rec['steps_replayed']}")
