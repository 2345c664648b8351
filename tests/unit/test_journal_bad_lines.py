"""A journal with a bad line in the middle (a disk error, a hand edit): ``phoenix status`` and a restarted
coordinator read on by one rule (``read_journal_skipping``), show what the other lines say and name the
line they skipped; a torn last line is dropped as before."""

from __future__ import annotations

import json

from click.testing import CliRunner

from phoenix_hpc.cli.main import cli
from phoenix_hpc.control.journal import read_journal_skipping
from test_cli_status import make_run
from test_status_derive import done_records, node_loss_records, start_records

BAD = "{\"ts\": 5.0, \"event\": \"comm"  # a line cut short, with the next record written after it


def _lines(records) -> list[str]:
    return [json.dumps(r) for r in records]


def _with_bad_line(rd, at: int) -> None:
    """Put the bad line in ``rd``'s journal as line ``at`` (1-based), between complete records."""
    lines = (rd / "journal.jsonl").read_text().splitlines()
    lines.insert(at - 1, BAD)
    (rd / "journal.jsonl").write_text("\n".join(lines) + "\n")


def test_the_reader_skips_and_names_a_bad_complete_line_and_drops_a_torn_tail_silently(tmp_path):
    lines = _lines(start_records()[:2]) + [BAD, "[1, 2]", json.dumps({"event": "no_ts"})] \
        + _lines(start_records()[2:3]) + ['{"ts": 9.0, "ev']
    (tmp_path / "journal.jsonl").write_text("\n".join(lines))  # no newline after the torn last line
    records, skipped = read_journal_skipping(tmp_path)
    assert [r["event"] for r in records] == ["coordinator_started", "registered", "registered"]
    assert [s.split(": ", 2)[:2] for s in skipped] == [
        [f"{tmp_path / 'journal.jsonl'}:3", "not a JSON line"],
        [f"{tmp_path / 'journal.jsonl'}:4", "journal record needs 'ts' and 'event'"],
        [f"{tmp_path / 'journal.jsonl'}:5", "journal record needs 'ts' and 'event'"]]
    assert all(s.endswith(": skipped") for s in skipped)
    assert read_journal_skipping(tmp_path / "missing") == ([], [])


def _status(rd, *args):
    return CliRunner().invoke(cli, ["status", str(rd), *args], catch_exceptions=False)


def test_phoenix_status_shows_a_journal_with_a_bad_middle_line_and_names_the_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PHOENIX_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setenv("COLUMNS", "200")
    records = start_records() + node_loss_records() + done_records()
    clean = make_run(tmp_path, "clean", records)
    rd = make_run(tmp_path, "bad", records)
    _with_bad_line(rd, 8)  # after the registrations, before job_running
    r = _status(rd, "--json")
    assert r.exit_code == 0, r.output
    data, want = json.loads(r.output), json.loads(_status(clean, "--json").output)
    line = f"{rd / 'journal.jsonl'}:8: not a JSON line: "
    (skipped,) = data["journal_skipped"]
    assert skipped.startswith(line) and skipped.endswith(": skipped") and want["journal_skipped"] == []
    (w,) = [w for w in data["warnings"] if w["code"] == "journal"]
    assert w["message"].startswith("1 journal record(s) not shown: " + line)
    assert not [w for w in want["warnings"] if w["code"] == "journal"]
    # everything the other lines say is shown as without the bad line
    for key in ("slots", "recoveries", "commits", "run_jobs"):
        assert data[key] == want[key], key
    no_age = [[{k: v for k, v in r.items() if k != "age_s"} for r in d["replicas"]] for d in (data, want)]
    assert no_age[0] == no_age[1]  # the ages are counted from now
    assert data["job"]["state"] == "done" and data["job"]["final_hash"] == "abc123"
    assert data["job"]["recoverable_step"] == want["job"]["recoverable_step"]
    r = _status(rd)
    assert r.exit_code == 0 and "journal.jsonl:8: not a JSON line" in r.output and "Traceback" not in r.output


def test_a_restarted_coordinator_skips_a_bad_middle_line_and_journals_it(tmp_path):
    from phoenix_hpc.control.coordinator import Coordinator

    (tmp_path / "journal.jsonl").write_text("\n".join(_lines(start_records()) + [BAD]
                                                     + _lines(node_loss_records())) + "\n")
    c = Coordinator(tmp_path, restart=1, host="127.0.0.1")
    c.open()
    try:
        records, skipped = read_journal_skipping(tmp_path)
        assert c.generation == 1 and c.rank_map == {0: 0, 1: 1, 2: 4, 3: 5}
    finally:
        c.close()
    (bad,) = skipped
    assert bad.startswith(f"{tmp_path / 'journal.jsonl'}:{len(start_records()) + 1}: not a JSON line")
    (rec,) = [r for r in records if r["event"] == "coordinator_restarted"]
    assert rec["skipped"] == [bad] and rec["generation"] == 1
