import pytest

from phoenix_hpc.control.hold import HOLD_ENV, hold_of, parse_hold


def test_parse_hold_reads_event_and_seconds():
    assert parse_hold(None) is None and parse_hold("") is None
    assert parse_hold("recovery_start:2.5") == ("recovery_start", 2.5)


@pytest.mark.parametrize("value", ["recovery_start", "quiesce:1", "recovery_start:0", "recovery_start:x",
                                   "recovery_start:-1", "recovery_start:4000", "recovery_start:nan"])
def test_parse_hold_refuses_what_it_cannot_obey_naming_the_variable(value):
    with pytest.raises(ValueError, match=HOLD_ENV):
        parse_hold(value)


def test_only_the_first_coordinator_holds():
    env = {HOLD_ENV: "recovery_start:3"}
    assert hold_of(env, 0) == ("recovery_start", 3.0)
    assert hold_of(env, 1) is None and hold_of({}, 0) is None


def test_a_coordinator_given_a_bad_hold_exits_2_naming_the_variable_before_it_starts(tmp_path, monkeypatch, capsys):
    import shutil
    from pathlib import Path

    from phoenix_hpc.control.coordinator import main

    shutil.copy(Path(__file__).resolve().parents[2] / "examples" / "gpt-small.yaml", tmp_path / "config.yaml")
    monkeypatch.setenv(HOLD_ENV, "recovery_start:forever")
    assert main(["--run-dir", str(tmp_path)]) == 2
    assert f"{HOLD_ENV}='recovery_start:forever'" in capsys.readouterr().err
    assert not (tmp_path / "coordinator.json").exists() and not (tmp_path / "journal.jsonl").exists()
