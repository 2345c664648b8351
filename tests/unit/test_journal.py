"""Journal: append-only JSON lines, fsync'd, private modes, tolerant of a torn last line."""

import json
import os
import stat

import pytest

from phoenix_hpc.control.journal import Journal, read_journal, read_journal_numbered, write_private_file


def test_append_and_read_back_with_private_modes(tmp_path):
    run = tmp_path / "run 'x'; echo"
    clock = iter([10.0, 11.5])
    with Journal(run, clock=lambda: next(clock)) as j:
        j.append("registered", world_rank=0, node="nid00001")
        j.append("commit", recoverable_step=3)
    recs = read_journal(run)
    assert recs == [
        {"ts": 10.0, "event": "registered", "world_rank": 0, "node": "nid00001"},
        {"ts": 11.5, "event": "commit", "recoverable_step": 3},
    ]
    assert read_journal(run, "commit")[0]["recoverable_step"] == 3
    assert stat.S_IMODE(os.stat(run).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(run / "journal.jsonl").st_mode) == 0o600


def test_reopen_appends_instead_of_truncating(tmp_path):
    with Journal(tmp_path) as j:
        j.append("a")
    with Journal(tmp_path) as j:
        j.append("b")
    assert [r["event"] for r in read_journal(tmp_path)] == ["a", "b"]


def test_torn_last_line_is_ignored_but_a_broken_middle_line_is_an_error(tmp_path):
    with Journal(tmp_path) as j:
        j.append("a", x=1)
    path = tmp_path / "journal.jsonl"
    with open(path, "ab") as f:
        f.write(b'{"ts": 1.0, "event": "b", "x"')  # crash mid-write
    assert [r["event"] for r in read_journal(tmp_path)] == ["a"]
    path.write_bytes(b'{"ts": 1.0, "event": "a"}\nnot json\n{"ts": 2.0, "event": "c"}\n')
    with pytest.raises(ValueError, match=r"journal.jsonl:2: not a JSON line"):
        read_journal(tmp_path)


@pytest.mark.parametrize("torn", [b'{"ts": 1.0, "event": "b", "x"', b'{"ts": 1.0, "ev\xe2\x82', b"x" * 70000])
def test_a_writer_that_opens_a_torn_journal_ends_the_torn_line_before_its_first_record(tmp_path, torn):
    with Journal(tmp_path) as j:
        j.append("a", x=1)
    path = tmp_path / "journal.jsonl"
    with open(path, "ab") as f:
        f.write(torn)  # the writer crashed mid-line
    with Journal(tmp_path) as j:  # a restarted coordinator
        assert j.torn_tail == torn
        j.append("coordinator_started", restart=1)
    read = read_journal_numbered(tmp_path)
    assert [r["event"] for r in read.records] == ["a", "coordinator_started"]  # its first record is kept
    (skipped,) = read.skipped  # the torn line stays, named as the trace of the crash
    assert skipped.startswith(f"{path}:2: not ") and skipped.endswith(": skipped")
    assert read.lines == [1, 3] and read.line_count == 3
    with Journal(tmp_path) as j:  # an intact journal is left as it is
        assert j.torn_tail == b""
    assert path.read_bytes().count(b"\n") == 3


def test_bad_records_rejected(tmp_path):
    with Journal(tmp_path) as j:
        with pytest.raises(ValueError, match="non-empty"):
            j.append("")
        with pytest.raises(ValueError, match="may not be named"):
            j.append("x", ts=3)
        with pytest.raises(TypeError):
            j.append("x", obj=object())
    assert read_journal(tmp_path) == []  # nothing half-written
    (tmp_path / "journal.jsonl").write_text(json.dumps({"event": "no ts"}) + "\n")
    with pytest.raises(ValueError, match="needs 'ts' and 'event'"):
        read_journal(tmp_path)


def test_missing_journal_reads_empty_and_private_file_is_atomic(tmp_path):
    assert read_journal(tmp_path / "nope") == []
    p = write_private_file(tmp_path / "coordinator.json", '{"port": 1}')
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600 and json.loads(p.read_text()) == {"port": 1}
    assert [x.name for x in tmp_path.iterdir()] == ["coordinator.json"]  # no temp file left behind


def test_deferred_lines_keep_their_order_and_one_sync_makes_them_durable(tmp_path):
    j = Journal(tmp_path)
    j.append("first")
    assert j.fsyncs == 1
    for i in range(5):
        j.append_deferred("registered", world_rank=i)
    assert j.fsyncs == 1  # written, not yet synced
    assert [r.get("world_rank") for r in read_journal(tmp_path)] == [None, 0, 1, 2, 3, 4]  # in call order
    assert j.sync() == 5 and j.fsyncs == 2
    assert j.sync() == 0 and j.fsyncs == 2  # nothing pending: no fsync
    j.append_deferred("registered", world_rank=5)
    j.append("job_running")  # a synced append covers the deferred line before it
    assert j.fsyncs == 3 and j.sync() == 0
    j.append_deferred("registered", world_rank=6)
    j.close()  # close makes the pending line durable
    assert j.fsyncs == 3 and read_journal(tmp_path)[-1]["world_rank"] == 6
    with pytest.raises(ValueError, match="closed"):
        j.append_deferred("late")
