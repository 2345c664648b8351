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
