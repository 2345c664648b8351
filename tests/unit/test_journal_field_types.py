"""Wrong-typed journal fields, lines that are not UTF-8 or nest too deep, and where a skipped line is: each
event's fields are checked against their annotations when a record is read (control/event_base.py), so the
fold (the running coordinator, its restart, ``phoenix status``) skips such a record and names it by its file
line, and nothing after it ever sees a wrong type."""

from __future__ import annotations

import json
import math
import types
from dataclasses import make_dataclass
from pathlib import Path
from typing import Annotated

import pytest
from annotated_types import Ge
from click.testing import CliRunner

from phoenix_hpc.cli.main import cli
from phoenix_hpc.control import events as E
from phoenix_hpc.control.journal import (Journal, line_namer, read_journal, read_journal_numbered,
                                         read_journal_skipping)
from phoenix_hpc.control.recorder import Recorder
from phoenix_hpc.control.view import fold
from test_cli_status import make_run

DATA = Path(__file__).parent / "data"
REAL = [json.loads(line) for line in (DATA / "status_node_loss" / "journal.jsonl").read_text().splitlines()]


def _real(event: str, n: int = 0) -> dict:
    return [r for r in REAL if r["event"] == event][n]


# (record, the field the error names, the value as the journal spells it, what is allowed)
BAD_FIELDS = [
    ({**_real("job_done"), "final_hash": 12345}, "final_hash", "12345", "a string or null"),
    ({**_real("recovery_done"), "total_s": "?"}, "total_s", '"?"', "a finite number or null"),
    ({**_real("recovery_done"), "generation": "?"}, "generation", '"?"', "an integer >= 0 or null"),
    ({**_real("recovery_done"), "phases": {"detect": "?"}}, "phases", '{"detect": "?"}',
     "an object of (a finite number) or null"),
    ({**_real("commit"), "recoverable_step": "abc"}, "recoverable_step", '"abc"', "an integer >= 0"),
    ({**_real("commit"), "recoverable_step": None}, "recoverable_step", "null", "an integer >= 0"),
    ({**_real("commit"), "recoverable_step": -5}, "recoverable_step", "-5", "an integer >= 0"),
    ({**_real("commit"), "recoverable_step": True}, "recoverable_step", "true", "an integer >= 0"),
    ({k: v for k, v in _real("commit").items() if k != "recoverable_step"}, "recoverable_step", None, "required"),
    ({**_real("commit"), "shard_steps": {"opt/pp0": {"0": "9"}}}, "shard_steps", '{"opt/pp0": {"0": "9"}}',
     "an object of (an object of (an integer >= 0)) or null"),
    ({**_real("commit"), "ts": "yesterday"}, "ts", '"yesterday"', "a finite number (unix seconds)"),
    ({**_real("commit"), "ts": math.nan}, "ts", "NaN", "a finite number (unix seconds)"),
    ({**_real("commit"), "ts": math.inf}, "ts", "Infinity", "a finite number (unix seconds)"),
    ({**_real("commit"), "ts": 10 ** 400}, "ts", None, "a finite number (unix seconds)"),  # json.loads reads it
    ({**_real("registered"), "world_rank": "w3"}, "world_rank", '"w3"', "an integer >= 0"),
    ({**_real("job_running"), "rank_map": [[0, "a"]]}, "rank_map", '[[0, "a"]]', "a list of (a list of"),
    ({**_real("recovery_start"), "survivors": 3}, "survivors", "3", "a list of (an integer >= 0) or null"),
    ({**_real("fault"), "superseded": "no"}, "superseded", '"no"', "true or false or null"),
    ({**_real("fault"), "generation": -1}, "generation", "-1", "an integer >= 0 or null"),
    ({**_real("registered"), "world_rank": 3.0}, "world_rank", "3.0", "an integer >= 0"),
    ({**_real("recovery_done"), "total_s": math.nan}, "total_s", "NaN", "a finite number or null"),
    ({**_real("recovery_done"), "total_s": -math.inf}, "total_s", "-Infinity", "a finite number or null"),
    ({**_real("recovery_done"), "total_s": True}, "total_s", "true", "a finite number or null"),
    ({**_real("recovery_done"), "total_s": 10 ** 400}, "total_s", None, "a finite number or null"),  # no float
    ({**_real("recovery_done"), "phases": {"detect": 4.0, "params": math.inf}}, "phases",
     '{"detect": 4.0, "params": Infinity}', "an object of (a finite number) or null"),
    ({**_real("recovery_start"), "survivors": [0, True, 3]}, "survivors", "[0, true, 3]",
     "a list of (an integer >= 0) or null"),
    ({**_real("recovery_start"), "survivors": [0, -2, 3]}, "survivors", "[0, -2, 3]",
     "a list of (an integer >= 0) or null"),
    ({**_real("recovery_start"), "detect_s": "4.03"}, "detect_s", '"4.03"', "a finite number or null"),
    ({**_real("job_running"), "rank_map": [[0, 0], [1, 1.0]]}, "rank_map", "[[0, 0], [1, 1.0]]",
     "a list of (a list of (an integer >= 0)) or null"),
    ({**_real("commit"), "shard_steps": {"opt/pp0": {"0": -1}}}, "shard_steps", '{"opt/pp0": {"0": -1}}',
     "an object of (an object of (an integer >= 0)) or null"),
]


@pytest.mark.parametrize("record,name,value,allowed", BAD_FIELDS, ids=lambda x: str(x)[:40])
def test_a_wrong_typed_field_is_an_event_error_naming_the_field_the_value_and_what_is_allowed(record, name, value,
                                                                                               allowed):
    with pytest.raises(E.EventError) as exc:
        E.from_record(record)
    msg = str(exc.value)
    assert msg.startswith(f"field {name!r} is ") and allowed in msg
    if value is not None:
        assert f"is {value}: allowed" in msg


def test_every_record_of_the_real_journals_reads_and_writes_back_unchanged():
    for path in sorted(DATA.glob("*/journal.jsonl")):
        for rec in read_journal_skipping(path)[0]:
            ev = E.from_record(rec)
            assert not isinstance(ev, E.UnknownEvent), rec
            out = ev.to_record()  # an older writer's record gains the defaults of the fields it lacked
            assert {k: out[k] for k in rec if k != "ts"} == {k: v for k, v in rec.items() if k != "ts"}


# (what the damaged record would have shown, read from the view with and without it)
VIEW_FIELD = {"job_done": lambda v: (v.final_hash, v.job_state),
              "recovery_done": lambda v: [(r.state, r.total_s, r.generation) for r in v.recoveries],
              "commit": lambda v: (v.recoverable_step, v.commits),
              "registered": lambda v: sorted(v.slots), "job_running": lambda v: v.rank_map,
              "recovery_start": lambda v: [r.state for r in v.recoveries], "fault": lambda v: len(v.faults)}


@pytest.mark.parametrize("record,name,value,allowed", BAD_FIELDS, ids=lambda x: str(x)[:40])
def test_the_fold_skips_a_wrong_typed_record_names_it_and_keeps_the_rest(record, name, value, allowed):
    """The damaged record changes nothing but ``skipped``; the view is the one of the journal without it."""
    i = next(i for i, r in enumerate(REAL) if r["event"] == record["event"])
    v = fold(REAL[:i] + [record] + REAL[i + 1:])
    want = fold(REAL[:i] + REAL[i + 1:])
    skipped = v.skipped[0]  # then what the journal without it skips (a recovery_done of no recovery_start)
    assert len(v.skipped) == 1 + len(want.skipped)
    assert skipped.startswith(f"record {i + 1} ({record['event']}): EventError: field {name!r} is ")
    assert skipped.endswith(": skipped")
    assert VIEW_FIELD[record["event"]](v) == VIEW_FIELD[record["event"]](want)


def _write(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def _line(rec: dict) -> bytes:
    return json.dumps(rec).encode()


# (a damaged line, the reason the reader names it by)
BAD_LINES = [
    (_line(_real("commit"))[:-1] + b', "note": "\xff"}', "not UTF-8 (byte 0xff at offset"),
    (b"[" * 100_000 + b"]" * 100_000, "not a JSON line (nested deeper than the JSON reader allows)"),
    (b'{"ts": 1, "event": "commit", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested deeper"),
    (_line({**_real("commit"), "ts": "yesterday"}), "'ts' is \"yesterday\", allowed a finite number"),
    (_line(_real("commit")).replace(str(_real("commit")["ts"]).encode(), b"NaN"), "'ts' is NaN, allowed"),
    (_line({**_real("commit"), "event": 5}), "'event' is 5, allowed a non-empty string"),
    (b"{not json", "not a JSON line"),
]


@pytest.mark.parametrize("bad,why", BAD_LINES, ids=lambda x: str(x)[:30])
def test_the_reader_skips_and_names_a_line_that_is_no_record_and_reads_on(tmp_path, bad, why):
    p = _write(tmp_path / "journal.jsonl", [_line(r) for r in REAL[:5]] + [bad] + [_line(r) for r in REAL[5:]])
    records, skipped = read_journal_skipping(p)
    assert records == REAL
    (s,) = skipped
    assert s.startswith(f"{p}:6: ") and why in s and s.endswith(": skipped")
    with pytest.raises(ValueError, match=f"{p}:6: "):  # the strict reader refuses it
        read_journal(p)


def test_a_torn_last_line_cut_inside_a_character_is_dropped_silently(tmp_path):
    p = tmp_path / "journal.jsonl"
    p.write_bytes(b"".join(_line(r) + b"\n" for r in REAL) + '{"ts": 1, "event": "x", "n": "\u00e9'.encode()[:-1])
    assert read_journal_skipping(p) == (REAL, [])


def test_the_fold_and_the_reader_name_a_skipped_record_by_its_file_line(tmp_path):
    """Bad lines before it shift the record count, not the file line: an unknown event, a wrong-typed field
    and an event out of order are all named ``PATH:LINE``, as the reader names a line that is no record."""
    lines = [_line(r) for r in REAL[:3]] + [b"{not json", b"[1]"] + [_line(r) for r in REAL[3:10]]
    lines += [_line({"ts": 1.0, "event": "from_a_newer_writer"}),  # file line 13
              _line({**_real("commit"), "recoverable_step": "abc"}),  # 14
              _line({"ts": 2.0, "event": "drain_armed", "request_id": "zz", "at_step": 3})]  # 15
    lines += [_line(r) for r in REAL[10:]]
    p = _write(tmp_path / "journal.jsonl", lines)
    read = read_journal_numbered(p)
    assert read.lines[:4] == [1, 2, 3, 6] and read.line_count == len(lines)
    v = fold(read.records, where=line_namer(read))
    assert [s.split(": ")[0] for s in v.skipped] == [f"{p}:13 (from_a_newer_writer)", f"{p}:14 (commit)",
                                                     f"{p}:15 (drain_armed)"]
    assert [s.split(": ")[0] for s in read.skipped] == [f"{p}:4", f"{p}:5"]


def test_a_restarted_coordinators_view_names_skipped_records_by_file_line_and_goes_on(tmp_path):
    lines = [_line(r) for r in REAL[:3]] + [b"\xff\xfe not text"] + [_line(r) for r in REAL[3:8]]
    lines += [_line({**_real("registered"), "world_rank": "w3"})]  # file line 10
    p = _write(tmp_path / "journal.jsonl", lines)
    r = Recorder()
    j = Journal(tmp_path)
    try:
        r.open(j, fold_existing=True)
        assert [s.split(": ")[0] for s in r.view.skipped] == [f"{p}:4", f"{p}:10 (registered)"]
        assert r.lines == 10 and r.records == 9
        r.append(E.Registered(world_rank="w9", pid=1))  # line 11: the fold names it as a restart would
        assert r.view.skipped[-1].startswith(f"{p}:11 (registered): EventError: field 'world_rank' is \"w9\"")
    finally:
        j.close()


def _status(rd, *args):
    return CliRunner().invoke(cli, ["status", str(rd), *args], catch_exceptions=False)


def test_phoenix_status_of_a_damaged_copy_of_a_real_journal_names_each_bad_line_and_never_fails(tmp_path,
                                                                                                 monkeypatch):
    """The damage a hand edit or a disk leaves, all in one copy of a real finished run's journal: text,
    ``--json`` and ``--plot`` exit 0 and name every damaged line by its file line."""
    pytest.importorskip("matplotlib")
    monkeypatch.setenv("PHOENIX_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setenv("COLUMNS", "200")
    rd = make_run(tmp_path, "damaged", [])
    damage = {"job_done": lambda r: {**r, "final_hash": 12345},
              "recovery_done": lambda r: {**r, "total_s": "?"},
              "recovery_restored": lambda r: {**r, "ts": "yesterday"}}
    lines, want = [], []
    for r in REAL:
        lines.append(_line(damage[r["event"]](r)) if r["event"] in damage else _line(r))
        if r["event"] in damage:
            want.append(len(lines))
        if r["event"] == "commit" and r["recoverable_step"] == 10:
            lines += [b"[" * 100_000 + b"]" * 100_000, _line(r)[:-1] + b', "x": "\xff"}',
                      _line({"ts": r["ts"], "event": "from_a_newer_writer"})]
            want += [len(lines) - 2, len(lines) - 1, len(lines)]
    _write(rd / "journal.jsonl", lines)
    out = tmp_path / "timeline.png"
    for args in ((), ("--json",), ("--plot", str(out))):
        res = _status(rd, *args)
        assert res.exit_code == 0, res.output
        assert "Traceback" not in res.output
    data = json.loads(_status(rd, "--json").output)
    named = sorted(int(s.split(": ")[0].split(" ")[0].rsplit(":", 1)[1]) for s in data["journal_skipped"])
    assert named == sorted(want)
    assert data["job"]["final_hash"] is None and out.stat().st_size > 0
    assert all(rec["total_s"] != "?" for rec in data["recoveries"])


@pytest.mark.parametrize("ts", ["yesterday", None, "NaN", True])
def test_a_landing_file_whose_ts_is_no_finite_number_is_left_out_and_status_goes_on(tmp_path, monkeypatch, ts):
    """``faults/fired-*.json`` is merged into the journal's records by time: one with a ``ts`` that cannot be
    ordered (a hand edit) is left out like an unreadable one, never a traceback."""
    from phoenix_hpc.faults.trigger import read_fired

    monkeypatch.setenv("PHOENIX_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    rd = make_run(tmp_path, "fired", REAL)
    (rd / "faults").mkdir()
    good = json.loads((DATA / "status_node_loss" / "fired-2acb04551b36-w1.json").read_text())
    (rd / "faults" / "fired-2acb04551b36-w1.json").write_text(json.dumps(good))
    bad = {**good, "world_rank": 2, "ts": math.nan if ts == "NaN" else ts}
    (rd / "faults" / "fired-2acb04551b36-w2.json").write_text(json.dumps(bad))
    assert read_fired(rd) == [good]
    for args in ((), ("--json",)):
        res = _status(rd, *args)
        assert res.exit_code == 0 and "Traceback" not in res.output, res.output


@pytest.mark.parametrize("field,value", [("generation", [1]), ("suspects", 3), ("step", "3"), ("majority", "0")])
def test_a_coordinator_restarts_over_a_wrong_typed_record_and_journals_it(tmp_path, field, value):
    """The raw records a restart reads besides the fold (replica agreement's book) are the well-typed ones:
    the damaged record is skipped, named by its line in ``coordinator_restarted.skipped``, never a crash."""
    from phoenix_hpc.control.coordinator import Coordinator
    from test_status_derive import node_loss_records, start_records

    bad = {"ts": 99.0, "event": "silent_corruption", "generation": 1, "step": 3, "pp": 0, "tp": 0,
           "members": {"0": "a", "1": "b"}, "suspects": [1], "majority": [0], field: value}
    records = start_records() + node_loss_records() + [bad]
    p = _write(tmp_path / "journal.jsonl", [_line(r) for r in records])
    c = Coordinator(tmp_path, restart=1, host="127.0.0.1")
    c.open()
    try:
        assert c.generation == 1
    finally:
        c.close()
    (rec,) = [r for r in read_journal(p) if r["event"] == "coordinator_restarted"]
    (skipped,) = rec["skipped"]
    assert skipped.startswith(f"{p}:{len(records)} (silent_corruption): EventError: field {field!r} is ")


def test_the_event_holds_the_records_own_values_unconverted():
    """The check only checks: an integer in a seconds field stays an integer, an object is the record's own,
    and a read-only mapping is read like a dict."""
    rec = {**_real("recovery_done"), "total_s": 9}
    ev = E.from_record(types.MappingProxyType(rec))
    assert type(ev.total_s) is int and ev.total_s == 9
    assert ev.phases is rec["phases"] and ev.ts == rec["ts"]


def test_a_field_the_class_does_not_declare_goes_to_extra_as_it_is():
    """A newer writer's field is kept, not checked (its type is not declared here), and never a field."""
    odd = [1, "x", None, math.nan]
    rec = {**_real("heartbeat_summary"), "from_a_newer_writer": odd}
    ev = E.from_record(rec)
    assert ev.extra == {"from_a_newer_writer": odd} and ev.extra["from_a_newer_writer"] is odd
    assert not hasattr(ev, "from_a_newer_writer")
    assert ev.to_record()["from_a_newer_writer"] is odd


def test_an_object_key_that_is_no_string_is_refused():
    """JSON's object keys are strings: a record built in Python with an integer key is refused, named."""
    with pytest.raises(E.EventError, match="field 'shard_bytes' is .*: allowed an object of \\(an integer >= 0\\)"):
        E.from_record({**_real("commit"), "shard_bytes": {0: 5}})


def test_the_first_wrong_field_in_the_record_is_named_then_ts_then_a_missing_one():
    rec = {"ts": "x", "event": "commit", "shards": -1, "generation": "g"}
    with pytest.raises(E.EventError, match="^field 'shards' is -1: allowed"):
        E.from_record(rec)
    with pytest.raises(E.EventError, match="^field 'ts' is \"x\": allowed a finite number"):
        E.from_record({"ts": "x", "event": "commit"})
    with pytest.raises(E.EventError, match="^field 'recoverable_step' is missing: it is required"):
        E.from_record({"ts": 1.0, "event": "commit"})


@pytest.mark.parametrize("annotation", [bytes | None, dict[int, int], list[tuple[int, int]], Annotated[int, Ge(1)],
                                        Annotated[str, Ge(0)]])
def test_an_annotation_the_journal_cannot_hold_is_a_declaration_error(annotation):
    """pydantic would check more than a JSON line holds (bytes, tuples, int keys) and constraints the message
    does not name: such a declaration fails when the class is first read, on no user's journal."""
    cls = make_dataclass("Odd", [("x", annotation, None)], bases=(E.Event,), frozen=True, kw_only=True)
    with pytest.raises(TypeError, match="journal"):
        cls.from_record({"ts": 1.0, "event": "odd"})


def test_a_required_name_that_is_no_field_is_a_declaration_error():
    cls = make_dataclass("Odd", [("x", int | None, None)], bases=(E.Event,), frozen=True, kw_only=True,
                         namespace={"REQUIRED": ("y",)})
    with pytest.raises(TypeError, match="REQUIRED names no field"):
        cls.from_record({"ts": 1.0, "event": "odd", "x": 1})


def test_every_event_class_declares_checkable_field_types_and_reads_a_bare_record():
    """A field annotation outside the JSON vocabulary would raise TypeError here, not on a user's journal."""
    for name, cls in E.REGISTRY.items():
        if cls.REQUIRED:
            with pytest.raises(E.EventError, match="is missing: it is required"):
                E.from_record({"ts": 1.0, "event": name})
        else:
            assert type(E.from_record({"ts": 1.0, "event": name})) is cls


@pytest.mark.parametrize("event", ["clean_stop", "fallback", "coordinator_stopped", "job_done"])
@pytest.mark.parametrize("field", ["message", "reason"])
def test_the_words_of_a_jobs_end_are_text(event, field):
    with pytest.raises(E.EventError, match=f"field {field!r} is 12345: allowed a string or null"):
        E.from_record({"ts": 1.0, "event": event, field: 12345})
