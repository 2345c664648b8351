"""A job continuing from the newest complete checkpoint of its checkpoint folder (recovery/continuation.py):
a fresh `phoenix submit` whose folder's checkpoint is at or past training.steps, or was trained with another
learning-rate schedule, is refused with exit code 2 before anything is written (the dry run too);
`phoenix submit --resume` refuses the first with the same rule (--steps counts) and warns of the second."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from phoenix_hpc.config.load import load_job_config
from phoenix_hpc.recovery.ckpt_files import mark_complete, step_dir
from phoenix_hpc.recovery.continuation import nothing_left, schedule_differences, schedule_record
from test_resume_cli import make_run
from test_submit_cli import assert_bad, invoke, write_cfg


def _checkpoint(root: Path, step: int, lr_scheduler: dict | None) -> None:
    """A complete snapshot checkpoint of ``step`` under ``root`` (grid 1x1x2, as gpt-small's), recording
    ``lr_scheduler`` when given, as the ranks and the coordinator write it."""
    files = {}
    for d in range(2):
        name = f"pp0-tp0-dp{d}.pt"
        step_dir(root, step).mkdir(parents=True, exist_ok=True)
        (step_dir(root, step) / name).write_bytes(b"shard %d" % d)
        files[name] = {"sha256": hashlib.sha256(b"shard %d" % d).hexdigest(), "bytes": 7}
    extra = {} if lr_scheduler is None else {"lr_scheduler": lr_scheduler}
    mark_complete(root, step, "snapshot", grid=[1, 1, 2], files=files, **extra)


def _cfg(tmp: Path, ckpt: Path, **training):
    path = write_cfg(tmp, resilience={"checkpoint": {"path": str(ckpt), "interval_steps": 20}},
                     training={"steps": 50, **training})
    return path, load_job_config(path)


# --- the pure rules -------------------------------------------------------------------------------------------
def test_nothing_left_names_the_folder_the_step_the_steps_and_what_is_allowed():
    assert nothing_left("/ck", 299, 300, resuming=False) is None
    at = nothing_left("/ck", 300, 300, resuming=False)
    assert "/ck holds a complete checkpoint of step 300, at training.steps 300" in at
    assert "nothing left to train" in at and "more steps" in at and "another resilience.checkpoint.path" in at
    assert "beyond training.steps 200" in nothing_left("/ck", 300, 200, resuming=False)
    assert nothing_left("/ck", 300, 300, resuming=True).startswith("--resume: ")


def test_schedule_differences_compare_what_decides_the_rate(tmp_path):
    _, cfg = _cfg(tmp_path, tmp_path / "ck")
    t = cfg.training
    same = schedule_record(t)
    assert schedule_differences(same, t) == []
    assert schedule_differences({}, t) == []  # a record without the fields says nothing
    # more steps with the decay following training.steps: the decay changes
    longer = t.model_copy(update={"steps": 80})
    (d,) = schedule_differences(same, longer)
    assert (d.field, d.checkpoint, d.config) == ("decay_steps", 50, 80)
    assert "training.steps (training.lr_decay_steps unset)" == d.source
    # more steps with the decay fixed at the checkpoint's: the same schedule
    assert schedule_differences(same, t.model_copy(update={"steps": 80, "lr_decay_steps": 50})) == []
    fields = {x.field: (x.checkpoint, x.config) for x in
              schedule_differences(same, t.model_copy(update={"lr": 2e-3, "lr_schedule": "linear"}))}
    assert fields == {"lr": (1e-3, 2e-3), "kind": (t.lr_schedule, "linear")}
    (u,) = schedule_differences(dict(same, train_samples=800, warmup_samples=0, decay_samples=800), t)
    assert (u.field, u.checkpoint, u.config) == ("counted_in", "samples", "steps")


# --- phoenix submit (fresh) -------------------------------------------------------------------------------------
@pytest.mark.parametrize("ck_step,steps,where", [(50, 50, "at"), (60, 50, "beyond")])
def test_a_fresh_submit_with_nothing_left_to_train_is_refused_and_writes_nothing(tmp_path, ck_step, steps, where):
    ck = tmp_path / "ck"
    cfg_path, cfg = _cfg(tmp_path, ck, steps=steps)
    _checkpoint(ck, ck_step, schedule_record(cfg.training))
    rd = tmp_path / "run"
    needles = (f"resilience.checkpoint.path: {ck} holds a complete checkpoint of step {ck_step}, {where} "
               f"training.steps {steps}", "nothing left to train", "more steps")
    assert_bad(invoke("--site", "local", cfg_path, "--run-dir", rd), *needles)
    assert not rd.exists()
    assert_bad(invoke("--site", "local", cfg_path, "--run-dir", rd, "--dry-run"), *needles)
    assert not rd.exists()
    # more steps with the checkpoint's decay length kept: the dry run prints the script
    r = invoke("--site", "local", cfg_path, "--run-dir", rd, "--dry-run", "--steps", "80") if ck_step == 50 else None
    if r is not None:
        assert_bad(r, "lr_scheduler.decay_steps is 50 there and 80 for this config",
                   "training.lr_decay_steps: 50")
        pinned, _ = _cfg(tmp_path, ck, steps=80, lr_decay_steps=50)
        ok = invoke("--site", "local", pinned, "--run-dir", rd, "--dry-run")
        assert ok.exit_code == 0, ok.output
        assert ok.stdout.startswith("#!/bin/bash")


def test_a_fresh_submit_continuing_on_another_schedule_is_refused_naming_each_field(tmp_path):
    ck = tmp_path / "ck"
    cfg_path, cfg = _cfg(tmp_path, ck)
    _checkpoint(ck, 20, dict(schedule_record(cfg.training), lr=3e-4, min_lr=3e-5))
    rd = tmp_path / "run"
    for extra in ((), ("--dry-run",)):
        assert_bad(invoke("--site", "local", cfg_path, "--run-dir", rd, *extra),
                   f"{ck} holds the checkpoint of step 20", "lr_scheduler.lr is 0.0003 there and 0.001 for this config",
                   "lr_scheduler.min_lr is 3e-05 there and 0.0001", "allowed: training.lr: 0.0003, training.min_lr: 3e-05",
                   "another resilience.checkpoint.path", "--resume")
        assert not rd.exists()


def test_a_fresh_submit_continuing_on_the_same_schedule_or_from_an_unrecorded_one_is_accepted(tmp_path):
    ck = tmp_path / "ck"
    cfg_path, cfg = _cfg(tmp_path, ck)
    _checkpoint(ck, 20, schedule_record(cfg.training))
    r = invoke("--site", "local", cfg_path, "--run-dir", tmp_path / "run", "--dry-run")
    assert r.exit_code == 0, r.output
    _checkpoint(ck, 40, None)  # written before checkpoints recorded their schedule: not compared
    r = invoke("--site", "local", cfg_path, "--run-dir", tmp_path / "run", "--dry-run")
    assert r.exit_code == 0, r.output


# --- phoenix submit --resume ----------------------------------------------------------------------------------
def test_resume_with_nothing_left_is_refused_and_steps_extend_it_with_a_schedule_warning(tmp_path):
    rd = make_run(tmp_path, steps_done=[50])  # gpt-small: training.steps 50
    cfg = load_job_config(rd / "config.yaml")
    marker = step_dir(rd / "checkpoints", 50) / "complete.json"
    marker.write_text(json.dumps(dict(json.loads(marker.read_text()), lr_scheduler=schedule_record(cfg.training))))
    assert_bad(invoke("--resume", rd), f"--resume: resilience.checkpoint.path: {rd / 'checkpoints'} holds a complete "
               "checkpoint of step 50, at training.steps 50", "nothing left to train", "--steps N")
    r = invoke("--resume", rd, "--steps", "80", "--dry-run")
    assert r.exit_code == 0, r.output
    assert "warning: --resume: the checkpoint of step 50 was trained with another learning-rate schedule" in r.output
    assert "lr_scheduler.decay_steps is 50 there and 80 for this config" in r.output
    assert "training.lr_decay_steps: 50" in r.output


# --- what writes the record -----------------------------------------------------------------------------------
def test_both_kinds_of_checkpoint_record_the_schedule_of_the_job_that_wrote_them(tmp_path, monkeypatch):

    from types import SimpleNamespace

    import phoenix_hpc.launch.persist as persist
    import phoenix_hpc.recovery.checkpoint as checkpoint
    from phoenix_hpc.control.settings import timing_from_run_dir

    cfg_path, cfg = _cfg(tmp_path, tmp_path / "ck", lr_decay_steps=40)
    rd = tmp_path / "run"
    rd.mkdir()
    (rd / "config.yaml").write_text(cfg_path.read_text())
    want = schedule_record(cfg.training)
    assert want["decay_steps"] == 40 and "last_step" not in want
    # a planned end's final checkpoint: the coordinator writes complete.json with the settings' record
    assert timing_from_run_dir(rd)[0].lr_scheduler == want
    # a periodic DCP checkpoint: the ranks pass it with the model record
    seen = {}
    monkeypatch.setattr(checkpoint, "save_checkpoint", lambda engine, root, group, keep=None, record=None:
                        seen.update(record) or Path(root))
    monkeypatch.setattr(persist, "_rank", lambda groups: 0)
    persist.save_if_due(None, SimpleNamespace(world=None), 20, cfg, rd)
    assert seen["lr_scheduler"] == want and seen["engine"] == cfg.engine
