"""``resilience.replica_agreement`` (docs/design.md section 6): the field is checked like every resilience field;
off, a rank computes no parameter digest, its commit fence carries no stage pairs and its commit records no
digests, and the coordinator compares nothing and journals once per generation that the check is off."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_agreement import A, B, _commit, _coordinator, read_journal

from phoenix_hpc.control.settings import Timing


@pytest.mark.parametrize("value, ok", [(True, True), (False, True), ("yes", False), ("false", False), (0, False),
                                       (1, False), (None, False)])
def test_the_switch_is_checked_naming_the_field_the_value_and_what_is_allowed(value, ok):
    from phoenix_hpc.config.schema import ResilienceConfig

    if ok:
        assert ResilienceConfig(replica_agreement=value).replica_agreement is value
        return
    with pytest.raises(Exception) as e:
        ResilienceConfig(replica_agreement=value)
    assert "replica_agreement" in str(e.value) and "allowed: true or false" in str(e.value)


def test_the_check_is_on_by_default():
    from phoenix_hpc.config.schema import ResilienceConfig

    assert ResilienceConfig().replica_agreement is True and Timing().replica_agreement is True


def test_a_bad_switch_in_a_job_config_exits_2_naming_field_value_and_allowed(tmp_path):
    from click.testing import CliRunner

    from phoenix_hpc.cli.main import cli

    src = (Path(__file__).resolve().parents[2] / "examples" / "gpt-small.yaml").read_text()
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(src.replace("\nresilience:\n", "\nresilience:\n  replica_agreement: 'off'\n", 1))
    r = CliRunner().invoke(cli, ["submit", str(cfg), "--site", "local", "--dry-run"])
    assert r.exit_code == 2, r.output
    assert "resilience.replica_agreement: value 'off'" in r.output and "allowed: true or false" in r.output
    assert "Traceback" not in r.output


def test_the_coordinator_reads_the_switch_from_the_run_config(tmp_path):
    from phoenix_hpc.control.settings import timing_from_run_dir

    src = (Path(__file__).resolve().parents[2] / "examples" / "gpt-small.yaml").read_text()
    (tmp_path / "config.yaml").write_text(src.replace("\nresilience:\n", "\nresilience:\n  replica_agreement: false\n", 1))
    assert timing_from_run_dir(tmp_path)[0].replica_agreement is False


def _off(c):
    c.t = type(c.t)(**{**c.t.__dict__, "replica_agreement": False})
    return c


@pytest.mark.parametrize("grid", [(1, 1, 3), (1, 1, 1)], ids=["dp3", "dp1"])
def test_off_the_coordinator_compares_nothing_and_journals_it_once_per_generation(tmp_path, grid):
    c = _off(_coordinator(tmp_path, grid))
    dp = grid[2]
    for step in (4, 5):  # digests that differ (a rank with the check on would send them): nothing compared
        for w in range(dp):
            _commit(c, w, step, B if w == 1 else A, board=step == 5)
    assert not c.faults and c.agreement is None
    assert not read_journal(tmp_path, "silent_corruption") and not read_journal(tmp_path, "agreement_undetectable")
    [rec] = read_journal(tmp_path, "agreement_off")
    assert rec["generation"] == 0 and "resilience.replica_agreement is false" in rec["reason"]
    assert c.view.agreement["off"] == rec["reason"]
    c.view.generation = 1  # a recovery's new generation: said again, once
    for w in range(dp):
        _commit(c, w, 6, A, g=1)
        _commit(c, w, 6, A, g=0)  # an old generation's report says nothing more
    assert [r["generation"] for r in read_journal(tmp_path, "agreement_off")] == [0, 1]


def test_off_a_silent_corruption_fault_report_with_digests_is_not_compared(tmp_path):
    c = _off(_coordinator(tmp_path, (1, 1, 2)))
    for w in range(2):
        c._dispatch({"type": "fault", "world_rank": w, "pid": 100 + w, "generation": 0, "step": 6,
                     "kind": "silent_corruption", "exc_type": "ReplicaDisagreement", "message": "differ at step 5",
                     "corrupt_step": 5, "params": [[5, A if w else B]]})
    assert c.agreement is None and not read_journal(tmp_path, "silent_corruption")


def test_on_the_same_reports_are_compared(tmp_path):
    """The control for the tests above: with the check on, the same differing digests are a difference."""
    c = _coordinator(tmp_path, (1, 1, 3))
    for step in (4, 5):
        for w in range(3):
            _commit(c, w, step, B if w == 1 and step == 5 else A, board=step == 5)
    assert read_journal(tmp_path, "silent_corruption") and not read_journal(tmp_path, "agreement_off")


def test_an_off_fence_carries_no_stage_pairs():
    from phoenix_hpc.runtime.h2h import fence_vector, read_fence

    v = fence_vector(7, 1, None, 0, 0)
    assert v.tolist() == [7, -1]
    assert read_fence(v, 0).differ == () and read_fence(v, 0).compared == 0


CHILD = r"""
from mpi4py import MPI
from phoenix_hpc.gpucheck import protect

out = {}
for on in (True, False):
    recs = []
    prot = protect.make_protector(engine, MPI.COMM_WORLD, torch.device("cpu"), replica_agreement=on,
                                  on_commit=recs.append)
    train(engine, engine.step + 3, 64, protector=prot, keep=False)
    prot.check_fences()
    out[str(on)] = {"stages": prot.h2h.stages, "digests": [r.param_digest for r in recs],
                    "history": [len(r.param_digests) for r in recs], "fenced": prot.h2h.fenced_step,
                    "commits": [r.step for r in recs]}
    prot.close()
print("RESULT " + json.dumps(out))
"""


def test_off_a_rank_computes_no_digest_and_its_fence_carries_none(child_result, torch_engine_child):
    out = child_result(torch_engine_child(2) + CHILD)
    on, off = out["True"], out["False"]
    assert on["stages"] == 1 and all(isinstance(d, int) for d in on["digests"]) and on["history"][-1] >= 2
    assert off["stages"] == 0 and off["digests"] and set(off["digests"]) == {None} and set(off["history"]) == {0}
    assert off["fenced"] is not None and off["fenced"] >= off["commits"][0]  # the fences still complete


def test_a_drill_refuses_a_bitflip_with_the_check_off():
    from phoenix_hpc.drills.drill import plan_drill
    from phoenix_hpc.errors import FaultError

    kw = dict(steps=60, world=4, gpus_per_node=1, spare_nodes=2, kinds=["bitflip"], dp=4)
    assert plan_drill(1, 1, **kw)  # on (the default): planned
    with pytest.raises(FaultError, match="replica_agreement = false"):
        plan_drill(1, 1, **kw, replica_agreement=False)


@pytest.mark.parametrize("old, new, snapshots", [
    ("  mode: phoenix\n", "  mode: phoenix\n", True),
    ("  mode: phoenix\n", "  mode: checkpoint-restart\n", False),
    ("  enabled: true\n", "  enabled: false\n", False),
])
def test_the_coordinator_knows_from_the_run_config_whether_the_ranks_snapshot(tmp_path, old, new, snapshots):
    from phoenix_hpc.control.settings import timing_from_run_dir

    src = (Path(__file__).resolve().parents[2] / "examples" / "gpt-small.yaml").read_text()
    assert old in src
    (tmp_path / "config.yaml").write_text(src.replace(old, new, 1))
    assert timing_from_run_dir(tmp_path)[0].snapshots is snapshots
