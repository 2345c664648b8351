"""Shrink end to end on the real local Slurm cluster (docs/design.md section 6, "Shrink").

A job of pp=1 x dp=4 with one spare node (the tiny GPT of :mod:`test_hotswap`, torch engine on gloo, k=1)
takes two process crashes: the first is hot swapped onto the spare, the second finds no spare left and the
coordinator removes that slot's DP replica (dp 4 -> 3). The global batch (8 samples, micro-batches of 2)
no longer divides over 3 ranks: the 4 micro-batches are dealt out 2, 1, 1, the gradient is the same sum over
the same samples. The optimizer state is re-partitioned from the survivors' slices and the lost slice's
replica.

The oracle: a second run of the same config, without faults, asks for ``phoenix drain --shrink --at-step
R+1`` of a slot, where ``R`` is the recoverable step the fault run shrank at. Its final state (SHA-256 over
the ranks' parameter and optimizer hashes) must be bitwise the fault run's: a shrink is a pure function of
``S(R)`` and the new dp, whatever caused it.
"""

from __future__ import annotations

import json

import pytest

from test_hotswap import CONFIG, STEPS, Job, _cli, _inject, _wait

pytestmark = pytest.mark.cluster

SHRINK_CONFIG = dict(CONFIG, name="shrink", parallelism={"tp": 1, "pp": 1, "dp": 4},
                     resources=dict(CONFIG["resources"], nodes=4, spares=1))
FIRST_AT, SECOND_AT = 10, 25


def test_spares_exhausted_shrinks_the_job_bitwise_as_a_planned_shrink_at_the_same_step(env, data, tmp_path):
    job = Job(env, tmp_path, data, "shrink-faults", SHRINK_CONFIG)
    try:
        _inject(job, "crash", "forward", at_step=FIRST_AT, rank=1, wait=False)
        _inject(job, "crash", "forward", at_step=SECOND_AT, rank=3, wait=False)
        done = job.wait_end(timeout_s=240)
    finally:
        job.cancel()
    assert done["step"] == STEPS and done["steps_agree"], done
    assert done["grid"] == [1, 1, 3], done
    assert job.slurm_state == "COMPLETED", (job.slurm_state, job.output()[-1500:])
    recs = job.events("recovery_done")
    assert [r["action"] for r in recs] == ["hot_swap", "shrink"], recs
    assert all(r["steps_replayed"] <= 1 for r in recs), recs
    assert not job.events("invariant_violation") and not job.events("evidence_rejected")
    (sh,) = job.events("shrink")
    assert (sh["dp_from"], sh["dp_to"], sh["freed"], sh["lost"]) == (4, 3, [], [3]), sh
    R = sh["recoverable_step"]
    assert FIRST_AT <= R < SECOND_AT, sh
    (plan,) = [p for p in job.events("recovery_plan") if p["action"] == "shrink"]
    assert plan["grid"] == {"tp": 1, "pp": 1, "dp": 3} and plan["joins"] == []
    assert {t["kind"] for t in plan["transfers"]} == {"reshard"}, plan["transfers"]
    st = json.loads(_cli(job, "status", str(job.run_dir), "--json").stdout)
    assert st["job"]["grid"]["dp"] == 3 and [s["dp_to"] for s in st["shrinks"]] == [3], st.get("shrinks")

    ref = Job(env, tmp_path, data, "shrink-drain", SHRINK_CONFIG)
    try:
        _wait(lambda: ref.events("job_running"), 120, "job_running")
        r = _cli(ref, "drain", str(ref.run_dir), "--rank", "3", "--shrink", "--at-step", str(R + 1), "--json")
        assert r.exit_code == 0, r.output
        out = json.loads(r.stdout)
        assert out["state"] == "done" and out["steps_replayed"] == 0 and out["dp"] == 3, out
        done_ref = ref.wait_end(timeout_s=240)
    finally:
        ref.cancel()
    assert not ref.events("fault") and not ref.events("slots_dead")
    (d,) = ref.events("drain_done")
    assert d["recoverable_step"] == R, d
    assert done_ref["grid"] == [1, 1, 3] and done_ref["step"] == STEPS
    assert done["final_hash"] == done_ref["final_hash"], (done["rank_hashes"], done_ref["rank_hashes"])
    print(f"shrink: fault job {job.elapsed_s:.1f} s, recoveries "
          + "; ".join(f"{x['action']} {x['total_s']} s {x['phases']}" for x in recs)
          + f"; planned shrink job {ref.elapsed_s:.1f} s at R={R}")


PP_SHRINK_CONFIG = dict(CONFIG, name="shrink-pp2", parallelism={"tp": 1, "pp": 2, "dp": 2},
                        resources=dict(CONFIG["resources"], nodes=4, spares=1))


def run_pp2_shrink(env, data, tmp) -> dict:
    """The two jobs of :func:`test_three_faults_with_one_spare_at_pp2_reuse_the_slots_a_shrink_freed` (also the
    oracle of tests/e2e/test_resume_shrunk.py, through the session fixture ``pp2_shrink``): the fault job
    (hot swap of logical 1 at step 8, shrink at a crash of logical 2 at step 18, hot swap of logical 1 of the
    shrunk grid at step 30) and the fault-free job drained with ``--shrink`` at the fault job's recoverable step
    ``R`` + 1. Returns ``{"job", "done", "R", "ref", "done_ref", "drain"}`` (``drain``: the ``drain`` command's
    exit code and output)."""
    job = Job(env, tmp, data, "shrink-pp2", PP_SHRINK_CONFIG)
    try:
        _inject(job, "crash", "forward", at_step=8, rank=1, wait=False)
        _inject(job, "crash", "forward", at_step=18, rank=2, wait=False)
        _inject(job, "crash", "forward", at_step=30, rank=3, wait=False)
        done = job.wait_end(timeout_s=300)
    finally:
        job.cancel()
    shrinks = job.events("shrink")
    R = shrinks[0]["recoverable_step"] if shrinks else None
    ref, done_ref, drain = None, None, None
    if R is not None:  # the oracle: the hot swaps change no bit, so the run equals a fault-free one shrunk at R
        ref = Job(env, tmp, data, "shrink-pp2-drain", PP_SHRINK_CONFIG)
        try:
            _wait(lambda: ref.events("job_running"), 120, "job_running")
            r = _cli(ref, "drain", str(ref.run_dir), "--rank", "2", "--shrink", "--at-step", str(R + 1), "--json")
            drain = (r.exit_code, r.output)
            if r.exit_code == 0:
                done_ref = ref.wait_end(timeout_s=240)
            else:  # what the job said, for the failure message of the tests that need it
                drain += ([e["event"] for e in ref.events()][-8:], ref.output()[-3000:])
        finally:
            ref.cancel()
    return {"job": job, "done": done, "R": R, "ref": ref, "done_ref": done_ref, "drain": drain}


def test_three_faults_with_one_spare_at_pp2_reuse_the_slots_a_shrink_freed(pp2_shrink):
    """pp=2 x dp=2 (logical r = pp * 2 + dp) with one spare: a crash of logical 1 is hot swapped onto the spare;
    a crash of logical 2 finds none and the shrink removes DP replica 0 (logical 0 and 2): world 0, healthy,
    goes back to standby and dp = 1; a crash of world 3 (logical 1 of the shrunk grid) is then hot swapped onto
    world 0, which takes its stage's parameters from the optimizer slice it receives (dp = 1: no DP peer holds
    them). The job finishes with every member at the last step."""
    job, done = pp2_shrink["job"], pp2_shrink["done"]
    assert done["step"] == STEPS and done["steps_agree"] and done["grid"] == [1, 2, 1], done
    assert job.slurm_state == "COMPLETED", (job.slurm_state, job.output()[-1500:])
    recs = job.events("recovery_done")
    assert [r["action"] for r in recs] == ["hot_swap", "shrink", "hot_swap"], recs
    assert not job.events("invariant_violation") and not job.events("evidence_rejected")
    (sh,) = job.events("shrink")
    assert (sh["dp_from"], sh["dp_to"], sh["freed"], sh["lost"]) == (2, 1, [0], [2]), sh
    last = job.events("recovery_plan")[-1]
    assert [(j["world_rank"], j["replaces_world_rank"], j["logical_rank"]) for j in last["joins"]] == [(0, 3, 1)]
    kinds = [(t["kind"], t["receiver"]) for t in last["transfers"]]
    assert kinds == [("optimizer", 0), ("params_from_optimizer", 0)], last["transfers"]
    # world 0 left its replica (its summary under its world rank, not the logical rank a renumbered member
    # holds), then ended as logical 1; the rank files are the final members' only
    ranks = job.run_dir / "ranks"
    assert json.loads((ranks / "left-world0.json").read_text())["status"] == "left"
    finals = {p.name: json.loads(p.read_text()) for p in ranks.glob("rank*.json")}
    assert sorted(finals) == ["rank0.json", "rank1.json"], sorted(finals)
    assert all(f["status"] == "done" for f in finals.values()) and finals["rank1.json"]["world_rank"] == 0
    # the oracle: the hot swaps change no bit, so the run equals a fault-free one shrunk at the same step
    ref, done_ref = pp2_shrink["ref"], pp2_shrink["done_ref"]
    assert pp2_shrink["drain"][0] == 0, pp2_shrink["drain"]
    (d,) = ref.events("drain_done")
    assert d["freed"] == [0] and d["dp"] == 1, d  # the drained rank's node ends; its replica's other slot waits
    assert done["final_hash"] == done_ref["final_hash"], (done["rank_hashes"], done_ref["rank_hashes"])
    print(f"pp2 shrink: job {job.elapsed_s:.1f} s, recoveries "
          + "; ".join(f"{x['action']} {x['total_s']} s" for x in recs) + f"; planned shrink job {ref.elapsed_s:.1f} s")
