"""The pure parts of a planned end: which step the final checkpoint takes, when a round is over, and when a
checkpoint on disk counts as complete."""

from __future__ import annotations

import json

import pytest

from phoenix_hpc.control.ending import PlannedEnd, after_stop_round, choose_step, no_final_checkpoint
from phoenix_hpc.recovery.ckpt_files import (
    check_checkpoint,
    complete_steps,
    latest_step,
    mark_complete,
    step_dir,
)


def test_choose_step_is_the_newest_step_every_member_holds():
    assert choose_step({0: [288, 287], 1: [287, 286]}) == 287
    assert choose_step({0: [288, 287], 1: [288, 287], 2: [288]}) == 288
    assert choose_step({0: [5], 1: [7, 6]}) is None
    assert choose_step({0: [], 1: [3]}) is None
    assert choose_step({}) is None


def test_a_round_is_over_when_all_answered_a_silent_member_exited_or_the_deadline_passed():
    end = PlannedEnd("time limit", "USR1", {0, 1}, t_start=0.0, deadline=10.0)
    end.copies[0] = [3]
    assert not end.round_over(5.0) and end.missing() == [1]
    assert end.round_over(10.5)
    end.exited.add(1)
    assert end.round_over(5.0) and end.failures() == ["world rank 1: no answer (its process exited)"]
    end.copies[1] = [3]
    end.phase = "write"
    end.written = {0: {"file": "a"}, 1: {"error": "OSError: disk full"}}
    assert end.round_over(0.0) and end.failures() == ["world rank 1: OSError: disk full"]


def _shard(root, step, name, data=b"x" * 10):
    d = step_dir(root, step)
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)
    import hashlib

    return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}


def test_only_marked_checkpoints_are_complete_and_latest_follows_the_newest(tmp_path):
    a = _shard(tmp_path, 100, "pp0-tp0-dp0.pt")
    _shard(tmp_path, 200, "pp0-tp0-dp0.pt")  # written, never marked: not complete
    assert complete_steps(tmp_path) == [] and latest_step(tmp_path) is None
    mark_complete(tmp_path, 100, "snapshot", grid=[1, 1, 1], files={"pp0-tp0-dp0.pt": a})
    assert complete_steps(tmp_path) == [100] and latest_step(tmp_path) == 100
    assert (tmp_path / "latest").read_text() == "100\n"
    (step_dir(tmp_path, 300)).mkdir()
    (step_dir(tmp_path, 300) / "complete.json").write_text("{not json")  # a torn marker is not a marker
    assert latest_step(tmp_path) == 100
    assert latest_step(tmp_path / "missing") is None


def test_check_checkpoint_names_the_problem(tmp_path):
    good = _shard(tmp_path, 10, "pp0-tp0-dp0.pt")
    mark_complete(tmp_path, 10, "snapshot", grid=[1, 1, 2],
                  files={"pp0-tp0-dp0.pt": good, "pp0-tp0-dp1.pt": {"sha256": "0" * 64, "bytes": 10}})
    problems = check_checkpoint(tmp_path, 10, (1, 1, 2))
    assert len(problems) == 1 and "pp0-tp0-dp1.pt is missing" in problems[0]
    assert any("grid" in p for p in check_checkpoint(tmp_path, 10, (1, 2, 1)))
    (step_dir(tmp_path, 10) / "pp0-tp0-dp0.pt").write_bytes(b"y" * 10)  # same size, other bytes
    assert any("SHA-256" in p for p in check_checkpoint(tmp_path, 10))
    assert check_checkpoint(tmp_path, 11) == [f"checkpoint of step 11 in {step_dir(tmp_path, 11)} is not complete "
                                              "(no complete.json)"]
    marker = json.loads((step_dir(tmp_path, 10) / "complete.json").read_text())
    assert marker["kind"] == "snapshot" and marker["step"] == 10


class _Engine:
    """The part of the Engine interface a checkpoint load uses."""

    def __init__(self, coord):
        self.coord, self.step, self.loaded = coord, 0, {}

    def load_param_shard(self, t):
        self.loaded["params"] = t

    def load_optimizer_shard(self, t):
        self.loaded["opt"] = t

    def load_envelope(self, env):
        self.step = env["step"]


def test_a_snapshot_shard_round_trips_and_a_corrupt_one_is_refused(tmp_path):
    import pytest
    import torch

    from phoenix_hpc.engines.base import GridCoord
    from phoenix_hpc.errors import RecoveryError
    from phoenix_hpc.recovery.checkpoint import load_checkpoint, write_snapshot_shard

    coord = GridCoord(0, 1, 0)
    tensors = {"opt/pp0/tp0/dp1/w/main": torch.arange(4.0), "param/pp0/tp0/w": torch.ones(2, 2)}
    info = write_snapshot_shard(tmp_path, 7, coord, tensors, {"step": 7})
    assert info["file"] == "pp0-tp0-dp1.pt" and not list(step_dir(tmp_path, 7).glob(".*tmp*"))
    eng = _Engine(coord)
    with pytest.raises(RecoveryError, match="no complete persistent checkpoint"):
        load_checkpoint(eng, tmp_path, None)  # written but not marked complete
    mark_complete(tmp_path, 7, "snapshot", grid=[1, 1, 2], files={info["file"]: {k: info[k] for k in ("sha256", "bytes")}})
    assert load_checkpoint(eng, tmp_path, None) == 7 and eng.step == 7
    assert torch.equal(eng.loaded["opt"]["opt/pp0/tp0/dp1/w/main"], torch.arange(4.0))
    assert set(eng.loaded["params"]) == {"param/pp0/tp0/w"}
    with pytest.raises(RecoveryError, match="no shard pp0-tp0-dp0.pt"):
        load_checkpoint(_Engine(GridCoord(0, 0, 0)), tmp_path, None)
    p = step_dir(tmp_path, 7) / info["file"]
    raw = bytearray(p.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte, same size
    p.write_bytes(bytes(raw))
    with pytest.raises(RecoveryError, match="SHA-256"):
        load_checkpoint(_Engine(coord), tmp_path, None)


def test_pruning_keeps_the_newest_complete_checkpoints_and_never_the_newest(tmp_path):
    from phoenix_hpc.recovery.ckpt_files import prune, prune_plan

    assert prune_plan([10, 20, 30], 2) == [10]
    assert prune_plan([10, 20, 30], 0) == [10, 20]  # at least the newest stays
    assert prune_plan([30], 1) == [] and prune_plan([], 3) == []
    for s in (10, 20, 30):
        step_dir(tmp_path, s).mkdir()
        mark_complete(tmp_path, s, "snapshot", files={})
    step_dir(tmp_path, 5).mkdir()  # incomplete (a save in progress): left alone
    assert prune(tmp_path, 1) == [10, 20]
    assert complete_steps(tmp_path) == [30] and step_dir(tmp_path, 5).is_dir() and not step_dir(tmp_path, 10).exists()


def test_run_dirs_default_to_the_sites_run_root(tmp_path):
    import pytest

    from phoenix_hpc.cli.submit import default_run_dir
    from phoenix_hpc.errors import SubmitError

    assert default_run_dir("a b", tmp_path, 0.0).parent == tmp_path / "runs"
    got = default_run_dir("gpt", tmp_path, 0.0, "$SCRATCH/phoenix/runs", {"SCRATCH": "/scratch/u"})
    assert got.parent == tmp_path / "/scratch/u/phoenix/runs" and got.name.startswith("gpt-")
    with pytest.raises(SubmitError, match=r"scheduler.run_root '\$SCRATCH/phoenix/runs' .*\$SCRATCH is not set"):
        default_run_dir("gpt", tmp_path, 0.0, "$SCRATCH/phoenix/runs", {})


# (name, final_checkpoint, checkpoint_path, job state, active members, members) -> the note, or None
FINAL = [
    ("phoenix, running, every member active: the rounds run", True, "/ck", "running", 4, 4, None),
    ("not phoenix", False, "/ck", "running", 4, 4,
     "no final checkpoint: the job has no persistent checkpoints (resilience.mode is not phoenix)"),
    ("no checkpoint path", True, None, "running", 4, 4, "no final checkpoint: not every member is active"),
    ("recovering", True, "/ck", "recovering", 4, 4, "no final checkpoint: the job is recovering"),
    ("a member quiesced", True, "/ck", "running", 3, 4, "no final checkpoint: not every member is active"),
    ("no member at all", True, "/ck", "running", 0, 0, "no final checkpoint: not every member is active"),
]


@pytest.mark.parametrize("name,final,path,job,active,members,note", FINAL, ids=[f[0] for f in FINAL])
def test_whether_a_planned_end_writes_a_final_checkpoint(name, final, path, job, active, members, note):
    assert no_final_checkpoint(final_checkpoint=final, checkpoint_path=path, job_state=job,
                               active_members=active, members=members) == note


def _stopped(copies, members=(0, 1), exited=()):
    end = PlannedEnd("time limit", "USR1", set(members), t_start=0.0, deadline=10.0)
    end.copies.update(copies)
    end.exited |= set(exited)
    return end


# (name, stop round's answers, exited members, newest checkpoint on disk) -> (step to write, note)
ROUND = [
    ("the newest step every member holds", {0: [8, 7], 1: [7, 6]}, (), 5, (7, "")),
    ("nothing on disk yet", {0: [8], 1: [8]}, (), None, (8, "")),
    ("already on disk", {0: [8, 7], 1: [7]}, (), 7,
     (None, "no final checkpoint needed: step 7 is on disk, the newest step in host memory is 7")),
    ("no common step", {0: [8], 1: [6]}, (), None,
     (None, "no final checkpoint: no step held in host memory by every member ({0: [8], 1: [6]})")),
    ("a member without an answer (its process exited)", {0: [8]}, (1,), None,
     (None, "no final checkpoint: members without an answer: world rank 1: no answer (its process exited)")),
]


@pytest.mark.parametrize("name,copies,exited,on_disk,expected", ROUND, ids=[r[0] for r in ROUND])
def test_after_the_stop_round(name, copies, exited, on_disk, expected):
    assert after_stop_round(_stopped(copies, exited=exited), on_disk) == expected


# --- the decisions: answers in, events and commands out ---------------------------------------------------------
def _sends(out):
    from phoenix_hpc.control.commands import Send

    assert all(isinstance(c, Send) for c in out.commands), out.commands
    return [(c.world_rank, dict(c.body)) for c in out.commands]


def test_begin_end_journals_stopping_and_sends_stop_to_every_member():
    from phoenix_hpc.control.ending import begin_end

    end, out = begin_end(reason="time limit", signal="USR1", members={2, 0}, generation=3, now=5.0, round_s=7.0)
    assert (end.phase, end.members, end.t_start, end.deadline) == ("stop", {0, 2}, 5.0, 12.0)
    assert [e.to_record() | {"ts": 0} for e in out.events] == [
        {"ts": 0, "event": "stopping", "reason": "time limit", "signal": "USR1", "members": [0, 2], "generation": 3}]
    assert _sends(out) == [(w, {"type": "stop", "reason": "time limit", "checkpoint": True, "generation": 3})
                           for w in (0, 2)]


def test_the_answers_of_a_round_are_taken_only_from_members_in_that_round():
    end = PlannedEnd("stop", None, {0, 1}, t_start=0.0, deadline=10.0)
    assert not end.take_written(0, {"step": 4, "file": "a"})  # not the write round yet
    assert not end.take_stopping(5, [4])  # no member
    assert end.take_stopping(0, ["4", 3]) and end.copies == {0: [4, 3]}
    end.phase, end.step = "write", 4
    assert not end.take_stopping(1, [4])
    assert end.take_written(1, {"step": 3, "file": "b"}) and end.written[1] == {"error": "wrote step 3, asked for 4"}


# (name, phase, answers, exited, on disk) -> (events, sends, stop, write_complete, phase after)
_W = {"file": "pp0.pt", "sha256": "ab", "bytes": 10, "write_s": 0.5, "step": 7}
AFTER = [
    ("stop round done: write the newest common step", "stop", {0: [8, 7], 1: [7]}, (), 5,
     ([], [(0, {"type": "write_checkpoint", "step": 7, "generation": 2}),
           (1, {"type": "write_checkpoint", "step": 7, "generation": 2})], None, False, "write")),
    ("stop round: already on disk", "stop", {0: [7], 1: [7]}, (), 7,
     ([], [], (7, "no final checkpoint needed: step 7 is on disk, the newest step in host memory is 7"), False,
      "stop")),
    ("write round: a shard failed", "write", {0: _W, 1: {"error": "OSError: disk full", "step": 7}}, (), 5,
     (["checkpoint_incomplete"], [], (5, "final checkpoint of step 7 incomplete: world rank 1: OSError: disk full"),
      False, "write")),
    ("write round: a member exited silent", "write", {0: _W}, (1,), None,
     (["checkpoint_incomplete"], [],
      (None, "final checkpoint of step 7 incomplete: world rank 1: no answer (its process exited)"), False, "write")),
    ("write round: every shard written", "write", {0: _W, 1: dict(_W, file="pp1.pt", write_s=0.7)}, (), 5,
     ([], [], None, True, "write")),
]


@pytest.mark.parametrize("name,phase,answers,exited,on_disk,expected", AFTER, ids=[a[0] for a in AFTER])
def test_after_a_round_table(name, phase, answers, exited, on_disk, expected):
    from phoenix_hpc.control.ending import after_round

    end = PlannedEnd("stop", None, {0, 1}, t_start=0.0, deadline=10.0)
    end.exited |= set(exited)
    if phase == "stop":
        end.copies.update(answers)
    else:
        end.phase, end.step, end.written = "write", 7, dict(answers)
    assert end.round_over(1.0)
    nxt = after_round(end, 1.0, on_disk=on_disk, generation=2, write_timeout_s=30.0)
    events, sends, stop, complete, phase_after = expected
    assert [e.NAME for e in nxt.out.events] == events
    assert _sends(nxt.out) == sends and nxt.stop == stop and nxt.write_complete is complete
    assert end.phase == phase_after and (phase != "stop" or not sends or end.deadline == 31.0)


def test_a_completed_final_checkpoint_is_journalled_with_its_size_time_and_the_pruned_steps():
    from phoenix_hpc.control.ending import completed

    end = PlannedEnd("stop", None, {0, 1}, t_start=2.0, deadline=10.0)
    end.phase, end.step = "write", 7
    end.written = {0: _W, 1: dict(_W, file="pp1.pt", bytes=30, write_s=0.7)}
    assert end.files() == {"pp0.pt": {"sha256": "ab", "bytes": 10}, "pp1.pt": {"sha256": "ab", "bytes": 30}}
    events, note = completed(end, "/ck/step_00000007", 5.5, pruned=[3], keep=2)
    assert [e.to_record() | {"ts": 0} for e in events] == [
        {"ts": 0, "event": "checkpoints_pruned", "steps": [3], "keep": 2},
        {"ts": 0, "event": "checkpoint", "step": 7, "path": "/ck/step_00000007", "source": "final", "write_s": 0.7,
         "total_s": 3.5, "bytes": 40}]
    assert note == "final checkpoint of step 7 written"
    assert [e.NAME for e in completed(end, "p", 5.5, pruned=[], keep=2)[0]] == ["checkpoint"]
