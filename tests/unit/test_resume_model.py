"""`phoenix submit --resume RUN_DIR [CONFIG]`: a checkpoint written at another dp is accepted (the ranks
re-partition it); a config that changes the run's model, a checkpoint that records another model and a damaged
DCP checkpoint are refused with exit code 2 naming the field or file, and nothing of the run directory
changes."""

from __future__ import annotations

import json
from pathlib import Path

from phoenix_hpc.config.load import load_job_config
from phoenix_hpc.recovery.ckpt_compat import model_record
from phoenix_hpc.recovery.ckpt_files import mark_complete, step_dir
from test_resume_cli import make_run
from test_submit_cli import assert_bad, fake_dataset, invoke, write_cfg


def _tree(rd: Path) -> dict:
    """Every file under ``rd`` (recursively) -> its bytes."""
    return {str(p.relative_to(rd)): p.read_bytes() for p in sorted(rd.rglob("*")) if p.is_file()}


def test_a_checkpoint_written_at_another_dp_is_accepted_for_the_torch_engine(tmp_path):
    rd = make_run(tmp_path, steps_done=[20], dp=1)  # a run that shrank to dp = 1; the config's grid is dp = 2
    before = _tree(rd)
    r = invoke("--resume", rd, "--dry-run")
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("#!/bin/bash")
    assert _tree(rd) == before


def test_a_config_that_changes_the_model_is_refused_and_the_run_dir_is_unchanged(tmp_path):
    rd = make_run(tmp_path, steps_done=[20])
    before = _tree(rd)
    other = tmp_path / "other"
    other.mkdir()
    changed = write_cfg(other, data={"path": str(fake_dataset(other))}, model={"hidden_size": 256})
    assert_bad(invoke("--resume", rd, changed), f"--resume: {changed} changes the run's model",
               f"model.hidden_size: 256 in {changed}, {rd / 'config.yaml'} has 128", "nothing was written or submitted")
    bf16 = write_cfg(other, data={"path": str(fake_dataset(other))}, model={"dtype": "bfloat16"})
    assert_bad(invoke("--resume", rd, bf16), "model.dtype: 'bfloat16' in")
    assert _tree(rd) == before
    # the same model with other steps is a resume as before
    longer = write_cfg(other, data={"path": str(fake_dataset(other))}, training={"steps": 400})
    r = invoke("--resume", rd, longer, "--dry-run")
    assert r.exit_code == 0, r.output
    assert _tree(rd) == before


def test_a_checkpoint_that_records_another_model_is_refused(tmp_path):
    rd = make_run(tmp_path, steps_done=[20])
    d = step_dir(rd / "checkpoints", 20)
    marker = json.loads((d / "complete.json").read_text())
    rec = model_record(load_job_config(rd / "config.yaml"))  # as the ranks record it, of a narrower model
    marker.update(engine=rec["engine"], model=dict(rec["model"], hidden_size=64))
    (d / "complete.json").write_text(json.dumps(marker))
    before = _tree(rd)
    assert_bad(invoke("--resume", rd), "checkpoint of step 20 was written by another model",
               str(d / "complete.json"), "model.hidden_size: 128 in the config, the checkpoint has 64")
    assert _tree(rd) == before


def test_a_damaged_dcp_checkpoint_is_refused_naming_the_file(tmp_path):
    rd = make_run(tmp_path)
    d = step_dir(rd / "checkpoints", 30)
    d.mkdir(parents=True)
    (d / ".metadata").write_bytes(b"\x80\x04 cut short")
    mark_complete(rd / "checkpoints", 30, "dcp")
    before = _tree(rd)
    assert_bad(invoke("--resume", rd), "cannot be loaded", f"{d / '.metadata'} cannot be read")
    assert _tree(rd) == before


def test_a_run_dir_of_another_cluster_is_refused(tmp_path, monkeypatch):
    from phoenix_hpc.cli.resume import cluster_problem
    from phoenix_hpc.status.runs import record_run

    here = {"slurm_conf": "/a/slurm.conf", "cluster": "alpha"}
    rd = make_run(tmp_path, steps_done=[20])
    other = {"job_id": "7", "run_dir": str(rd), "slurm_conf": "/b/slurm.conf", "cluster": "beta"}
    why = cluster_problem(rd, [other], here)
    assert "another Slurm cluster" in why and "'beta' (slurm.conf /b/slurm.conf)" in why and "'alpha'" in why
    assert cluster_problem(rd, [dict(other, **here)], here) is None
    assert cluster_problem(rd, [dict(other, slurm_conf=None)], here) is None  # recorded without a cluster
    assert cluster_problem(rd, [], here) is None
    # the command: the runs index says the run's job went to another cluster than SLURM_CONF's
    home = tmp_path / "home"
    monkeypatch.setenv("PHOENIX_HOME", str(home))
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=alpha\n")
    record_run(rd, "123", home=home, identity={"slurm_conf": "/elsewhere/slurm.conf", "cluster": "beta"})
    before = _tree(rd)
    assert_bad(invoke("--resume", rd, env={"SLURM_CONF": str(conf)}), "is a run of another Slurm cluster",
               "cluster 'beta' (slurm.conf /elsewhere/slurm.conf)", f"cluster 'alpha' (slurm.conf {conf})")
    assert _tree(rd) == before
