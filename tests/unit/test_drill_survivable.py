"""A drill plans only fault sets the job survives by design: a ``corrupt-replica`` with k = 1 is recovered
from the persistent checkpoint, so it is planned only after the first one, moved there, replaced by another
kind, or refused, always saying why (``phoenix_hpc.drills.drill``)."""

from __future__ import annotations

import pytest

from phoenix_hpc.drills.drill import corrupt_replica_first_step, plan_drill
from phoenix_hpc.errors import FaultError

# the README's example: examples/gpt-small.yaml (50 steps, 4 ranks, 2 spare nodes of 1 slot, k = 1,
# checkpoint every 20 steps), --faults 2 --kinds crash,corrupt-replica, default seed 0
README = dict(steps=50, world=4, gpus_per_node=1, spare_nodes=2, kinds=["crash", "corrupt-replica"], k=1,
              checkpoint_every=20)


def test_first_survivable_step_follows_k_and_the_checkpoint_interval():
    assert corrupt_replica_first_step(2, None) == 1  # another verified replica serves: no checkpoint needed
    assert corrupt_replica_first_step(1, 20) == 21  # checkpoint 20 is written before step 21 starts
    assert corrupt_replica_first_step(1, None) is None  # no persistent checkpoint: never


def test_the_readme_example_plans_no_corrupt_replica_before_the_first_checkpoint_and_says_why():
    plan = plan_drill(2, 0, **README)
    for f in plan:
        if f.kind == "corrupt-replica":
            assert f.at_step >= 21 and f.expect == "checkpoint_restart"
    redrawn = [f for f in plan if f.note]
    assert redrawn, plan  # seed 0 draws a corrupt-replica at step 9: it is replaced, with the reason
    assert redrawn[0].kind == "crash" and "corrupt-replica cannot be survived at step 9" in redrawn[0].note
    assert "first one is written after step 20" in redrawn[0].note and "resilience.k = 1" in redrawn[0].note


@pytest.mark.parametrize("seed", range(40))
def test_no_seed_plans_a_corrupt_replica_before_the_first_checkpoint(seed):
    for every in (5, 12, 20, 30):
        for f in plan_drill(3, seed, **{**README, "checkpoint_every": every, "steps": 80, "spare_nodes": 3}):
            if f.kind == "corrupt-replica":
                assert f.at_step > every, (seed, every, f)
            if f.note:  # moved (still a corrupt-replica) or another kind drawn in its place
                assert f.note.startswith("moved from step ") == (f.kind == "corrupt-replica"), f


def test_a_corrupt_replica_drawn_early_in_a_segment_that_reaches_the_checkpoint_is_moved_there():
    moved = [f for seed in range(30) for f in plan_drill(1, seed, steps=60, world=4, gpus_per_node=1,
                                                         spare_nodes=2, kinds=["corrupt-replica"], k=1,
                                                         checkpoint_every=10)
             if f.note]
    assert moved  # one fault over steps 3..58: its first half reaches step 11
    for f in moved:
        assert f.kind == "corrupt-replica" and f.at_step == 11 and f.note.startswith("moved from step ")
        assert "to step 11" in f.note


def test_with_k2_nothing_is_moved():
    plan = plan_drill(2, 0, **{**README, "k": 2})
    assert all(f.note is None for f in plan)
    assert [f.kind for f in plan].count("corrupt-replica") >= 1 and min(f.at_step for f in plan) < 20


@pytest.mark.parametrize("every,why", [(None, "this job writes none"), (40, "first one is written after step 40")])
def test_only_corrupt_replica_that_cannot_be_survived_is_refused_naming_the_reason(every, why):
    with pytest.raises(FaultError, match="--kinds: fault 1 cannot be a corrupt-replica") as e:
        plan_drill(2, 0, **{**README, "kinds": ["corrupt-replica"], "checkpoint_every": every})
    assert why in str(e.value) and "raise resilience.k to 2" in str(e.value)
