"""Replica agreement in the commit fence (docs/design.md sections 4 and 6): the fence's one MIN all-reduce also
gives each (pp, tp) stage's smallest and largest parameter digest; a difference holds the snapshot that would
overwrite the last agreed copy, names the step a recovery must restore before, and is planned as a rollback
before that step. Tables of the pure parts, and the fence itself on three real MPI ranks (``mpirun``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from phoenix_hpc.errors import ReplicaDisagreement
from phoenix_hpc.runtime.h2h import INT64_MAX, FenceResult, fence_vector, read_fence
from phoenix_hpc.runtime.protector import hold_for_disagreement
from phoenix_hpc.recovery.steps import before_step, recoverable_step

TOP = 2**64 - 1

# (name, [(digest or None, stage) per rank], stages) -> (differing stages [(stage, lo, hi)], compared)
FENCES = [
    ("dp=2 equal", [(5, 0), (5, 0)], 1, [], 1),
    ("dp=2 differ", [(5, 0), (6, 0)], 1, [(0, 5, 6)], 1),
    ("dp=3 one of three differs", [(5, 0), (9, 0), (5, 0)], 1, [(0, 5, 9)], 1),
    ("digests above 2**63 read as negative int64: still ordered and exact", [(TOP, 0), (2**63, 0)], 1,
     [(0, 2**63, TOP)], 1),
    ("0 and the largest value: ordered as int64, so 2**64 - 1 (-1) comes first", [(0, 0), (TOP, 0)], 1,
     [(0, TOP, 0)], 1),
    ("INT64_MAX itself is a digest like any other", [(INT64_MAX, 0), (INT64_MAX, 0)], 1, [], 1),
    ("two stages: only the one that differs is named", [(1, 0), (2, 1), (1, 0), (3, 1)], 2, [(1, 2, 3)], 2),
    ("dp=1 stages: one digest each, nothing to differ", [(1, 0), (2, 1)], 2, [], 2),
    ("a rank without a digest adds nothing", [(4, 0), (None, 0), (4, 0)], 1, [], 1),
    ("a stage with no digest at all is not compared", [(4, 0), (4, 0)], 2, [], 1),
]


@pytest.mark.parametrize("name,ranks,stages,differ,compared", FENCES, ids=[f[0] for f in FENCES])
def test_the_fences_min_all_reduce_gives_each_stages_smallest_and_largest_digest(name, ranks, stages, differ,
                                                                                 compared):
    vecs = [fence_vector(7, 1 + i, d, st, stages) for i, (d, st) in enumerate(ranks)]
    res = read_fence(np.minimum.reduce(vecs), stages)  # what MPI_MIN over the ranks computes
    assert res == FenceResult(7, len(ranks), tuple(differ), compared)
    assert all(v.dtype == np.int64 and v.shape == (2 + 2 * stages,) for v in vecs)  # 16 bytes per stage


def test_a_fence_vector_refuses_a_digest_it_cannot_carry():
    with pytest.raises(ValueError, match="stage 2"):
        fence_vector(1, 1, 5, 2, 2)
    with pytest.raises(ValueError, match="64-bit"):
        fence_vector(1, 1, 2**64, 0, 1)
    assert fence_vector(1, 1, None, 5, 0).tolist() == [1, -1]  # no stage, no digest: the old [step, -m]


# (name, first differing fence, newest agreed step, tp size, step the snapshot would overwrite) -> held?
HOLDS = [
    ("no fence differed: the copy writes", None, 9, 1, 8, None),
    ("a fence with no stage differing: writes", FenceResult(9, 1, (), 1), 8, 1, 8, None),
    ("the fence of s-1 differed: the copy that would overwrite s-2 is held", FenceResult(9, 1, ((0, 1, 2),), 1),
     8, 1, 8, (9, 8, [(0, 0, 1, 2)])),
    ("stage index pp * tp + tp: stage 3 of tp=2 is pp=1, tp=1", FenceResult(9, 1, ((3, 1, 2),), 4), 8, 2, 8,
     (9, 8, [(1, 1, 1, 2)])),
    ("the generation's first fence differed: no agreed step known", FenceResult(4, 1, ((0, 1, 2),), 1), None, 1,
     None, (4, None, [(0, 0, 1, 2)])),
]


@pytest.mark.parametrize("name,differ,agreed,tp,old,held", HOLDS, ids=[h[0] for h in HOLDS])
def test_a_snapshot_is_held_once_a_fence_showed_replicas_that_differ(name, differ, agreed, tp, old, held):
    got = hold_for_disagreement(differ, agreed, tp, [(differ.step if differ else 1, 2)], old)
    if held is None:
        assert got is None
        return
    step, agreed_step, stages = held
    assert isinstance(got, ReplicaDisagreement) and got.fault_kind == "silent_corruption"
    assert (got.step, got.agreed_step, [tuple(s) for s in got.stages]) == (step, agreed_step, stages)
    assert "silent corruption" in str(got) and f"differ at step {step}" in str(got)
    assert (f"would overwrite step {old} is held" in str(got)) is (old is not None)
    assert got.fault_detail == {"corrupt_step": step, "agreed_step": agreed_step,
                                "params": [[step, "0000000000000002"]]}


# (name, copies, live steps, dirty, bad step) -> (copies kept, dirty, R)
BEFORE = [
    ("the fence of 11 differed: every member is dirty, both buffers' older step is R",
     {"a": {0: [12, 11], 1: [11, 10]}, "b": {1: [12, 11], 0: [11, 10]}}, {0: 12, 1: 12}, [], 11,
     {"a": {1: [10]}, "b": {0: [10]}}, [0, 1], None),
    ("the previous buffers hold R",
     {"a": {0: [11, 10], 1: [11, 10]}, "b": {1: [11, 10], 0: [11, 10]}}, {0: 12, 1: 12}, [], 11,
     {"a": {0: [10], 1: [10]}, "b": {1: [10], 0: [10]}}, [0, 1], 10),
    ("a member already back below the bad step (a re-plan) keeps its live state",
     {"a": {0: [10, 9]}, "b": {1: [10, 9]}}, {0: 10, 1: 12}, [], 11, {"a": {0: [10, 9]}, "b": {1: [10, 9]}},
     [1], 10),
    ("a dirty member stays dirty", {"a": {0: [9]}}, {0: 9}, [0], 11, {"a": {0: [9]}}, [0], 9),
]


@pytest.mark.parametrize("name,copies,live,dirty,bad,kept,dirty_out,R", BEFORE, ids=[b[0] for b in BEFORE])
def test_a_recovery_after_a_difference_restores_a_step_before_it(name, copies, live, dirty, bad, kept, dirty_out, R):
    got, d = before_step(copies, live, dirty, bad)
    assert (got, d) == (kept, dirty_out)
    # what the plan offers per shard: the live step of a clean owner, and every kept copy
    offer = {sid: [s for st in per.values() for s in st] for sid, per in got.items()}
    for r, s in live.items():
        sid = "ab"[r]
        if r not in d:
            offer.setdefault(sid, []).append(s)
    if R is not None:
        assert recoverable_step(offer) == R and R < bad


@pytest.mark.parametrize("value, ok", [(0, True), (1, True), (1000, True), (10**9, True), (-1, False),
                                       (10**9 + 1, False), (2.5, False), ("100", False), (True, False)])
def test_the_strike_window_is_checked_naming_the_field_the_value_and_what_is_allowed(value, ok):
    from phoenix_hpc.config.schema import ResilienceConfig

    if ok:
        assert ResilienceConfig(agreement_strikes_window_steps=value).agreement_strikes_window_steps == value
        return
    with pytest.raises(Exception) as e:
        ResilienceConfig(agreement_strikes_window_steps=value)
    assert "agreement_strikes_window_steps" in str(e.value)
    assert "allowed: an integer from 0 to 1000000000" in str(e.value)


def test_a_bad_strike_window_in_a_job_config_exits_2_naming_field_value_and_allowed(tmp_path):
    from click.testing import CliRunner

    from phoenix_hpc.cli.main import cli

    src = (Path(__file__).resolve().parents[2] / "examples" / "gpt-small.yaml").read_text()
    assert "\nresilience:\n" in src
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(src.replace("\nresilience:\n", "\nresilience:\n  agreement_strikes_window_steps: -3\n", 1))
    r = CliRunner().invoke(cli, ["submit", str(cfg), "--site", "local", "--dry-run"])
    assert r.exit_code == 2, r.output
    assert "resilience.agreement_strikes_window_steps: value -3" in r.output
    assert "allowed: an integer from 0 to 1000000000" in r.output and "Traceback" not in r.output


MPI_CHILD = r"""
import json, sys
from mpi4py import MPI
from phoenix_hpc.runtime.h2h import H2HEngine, make_tag_plan, tag_ub

comm = MPI.COMM_WORLD
r = comm.Get_rank()
# three ranks, two stages: ranks 0 and 2 are the DP replicas of stage 0, rank 1 alone at stage 1 (its digest is
# above 2**63); rank 2's digest of step 5 differs
eng = H2HEngine(comm, [], [], 0, 1 << 20, make_tag_plan(4, tag_ub(comm)), lambda *a: None, stage=r % 2, stages=2)
eng.start(threaded=True)
for i, step in enumerate((4, 5, 6)):
    d = 2**63 + 1 if r == 1 else (8 if (r, step) == (2, 5) else 7)
    eng.fence(step, 1 + r, d)
    assert eng.wait(lambda: eng.fences_done > i, 30)
res = {"step": eng.fenced_step, "agreed": eng.fence_agreed_step, "interval": eng.fenced_interval(2),
       "differ": [eng.fence_differ.step, [list(x) for x in eng.fence_differ.differ]]}
eng.stop()
with open(f"{sys.argv[1]}/rank{r}.json", "w") as f:  # not stdout: mpirun may interleave the ranks' lines
    json.dump(res, f)
"""


def test_on_three_mpi_ranks_every_rank_learns_the_first_differing_step_from_the_one_fence(tmp_path):
    mpirun = shutil.which("mpirun")
    assert mpirun, "Open MPI's mpirun is needed (the project's MPI stack)"
    prog = tmp_path / "fence.py"
    prog.write_text(MPI_CHILD)
    # a fresh launcher: this test process may be an MPI singleton itself (another test initialised MPI here),
    # whose OMPI_/PMIX_ variables would make mpirun take its children for part of that job
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_", "OPAL_"))}
    r = subprocess.run([mpirun, "--allow-run-as-root", "--oversubscribe", "-n", "3", sys.executable, str(prog),
                        str(tmp_path)], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[2], env=env)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    got = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(3)]
    # every rank: the same result; step 6 agreed again, but the first difference (5) is kept
    assert got == [{"step": 6, "agreed": 4, "interval": 3, "differ": [5, [[0, 7, 8]]]}] * 3, r.stdout
