"""The drill's verdict lines: a run that did not finish is not called different."""

from __future__ import annotations

from phoenix_hpc.cli.drill import _print_report


def _report(final_hash, ref_hash):
    return {"config": "c.yaml", "site": "local", "faults": [], "nodes_revived": [], "job": {"job_id": "7"},
            "reference": {"final_hash": ref_hash}, "final_hash": final_hash, "final_state": "done" if final_hash else None,
            "hash_equal": bool(final_hash) and final_hash == ref_hash, "passed": False,
            "error": None if final_hash else "job start: not reached within 60s (job 7: Slurm PENDING, reason "
                                             "ReqNodeNotAvail)"}


def test_verdicts(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    _print_report(_report("aa", "aa"), as_json=False)
    assert "identical to the fault-free reference" in capsys.readouterr().out
    _print_report(_report("aa", "bb"), as_json=False)
    assert "DIFFERENT from the fault-free reference" in capsys.readouterr().out
    _print_report(_report(None, "bb"), as_json=False)
    out = capsys.readouterr().out
    assert "not compared: the drill job did not finish" in out and "DIFFERENT" not in out
    assert "reason ReqNodeNotAvail" in out


def test_drill_json_names_the_planned_and_the_targeted_logical_rank():
    """A kill-node planned on the batch host's rank 0 is sent to rank 1 on another node: the JSON names both
    for what they are, and no bare ``rank`` / ``planned_rank`` whose meaning a reader has to guess."""
    from phoenix_hpc.drills.drill import DrillFault, DrillOutcome

    out = DrillOutcome(DrillFault(0, "kill-node", "forward", 12, 0), rank=1, target_world_rank=4,
                       target_node="nid00005").to_json()
    assert out["planned_logical_rank"] == 0 and out["target_logical_rank"] == 1
    assert out["target_world_rank"] == 4 and out["target_node"] == "nid00005"
    assert not {"rank", "planned_rank"} & set(out)
    same = DrillOutcome(DrillFault(1, "crash", "h2h", 20, 2)).to_json()
    assert same["planned_logical_rank"] == same["target_logical_rank"] == 2


def test_the_report_names_its_run_directory_and_why_a_fault_was_redrawn(capsys, monkeypatch):
    from phoenix_hpc.drills.drill import DrillFault, DrillOutcome

    monkeypatch.setenv("COLUMNS", "200")
    note = "a corrupt-replica cannot be survived at step 9; drew crash instead"
    rep = {**_report("aa", "aa"), "base": "/runs/drill-x", "job": {"job_id": "7", "run_dir": "/runs/drill-x/job"},
           "reference": {"final_hash": "aa", "run_dir": "/runs/drill-x/reference"},
           "faults": [DrillOutcome(DrillFault(0, "crash", "h2h", 9, 3, None, note)).to_json()]}
    _print_report(rep, as_json=False)
    out = capsys.readouterr().out
    assert "run directory: /runs/drill-x" in out and "/runs/drill-x/job" in out
    assert f"fault 1 as planned: {note}" in out
