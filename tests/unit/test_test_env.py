"""The test-only environment variables (phoenix_hpc/test_env.py): strict reading, refusal before anything
starts, the journal record and the status warning."""

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from phoenix_hpc.cli.main import cli
from phoenix_hpc.status.derive import derive_status
from phoenix_hpc.status.model import RunFiles
from phoenix_hpc.test_env import (
    HOLD_ENV,
    REPLICATION_DELAY_ENV,
    VARIABLES,
    TestEnvError,
    active_test_env,
    parse_replication_delay,
)

ROOT = Path(__file__).resolve().parents[2]
DELAY = REPLICATION_DELAY_ENV


def test_the_replication_delay_reads_seconds_and_empty_or_unset_as_none():
    assert parse_replication_delay(None) == 0.0 and parse_replication_delay("") == 0.0
    assert parse_replication_delay("0.3") == 0.3 and parse_replication_delay("0") == 0.0
    assert parse_replication_delay("60") == 60.0


@pytest.mark.parametrize("value", ["x", "-0.1", "nan", "inf", "-inf", "60.5", "0.3s"])
def test_a_replication_delay_it_cannot_obey_is_refused_naming_variable_value_and_range(value):
    with pytest.raises(TestEnvError) as e:
        parse_replication_delay(value)
    assert f"{DELAY}={value!r}" in str(e.value) and "[0, 60]" in str(e.value)


def test_active_test_env_checks_every_variable_and_leaves_out_what_does_not_act():
    assert active_test_env({"PATH": "/bin", DELAY: "", HOLD_ENV: ""}) == {}
    assert active_test_env({DELAY: "0"}) == {}
    env = {DELAY: "0.3", HOLD_ENV: "recovery_start:5", "HOME": "/h"}
    assert active_test_env(env) == {DELAY: "0.3", HOLD_ENV: "recovery_start:5"}
    with pytest.raises(TestEnvError, match=f"{DELAY}='nan'"):
        active_test_env({DELAY: "nan", HOLD_ENV: "recovery_start:5"})
    with pytest.raises(TestEnvError, match=f"{HOLD_ENV}='recovery_start:0'"):
        active_test_env({HOLD_ENV: "recovery_start:0"})


def test_an_unknown_phoenix_test_name_is_refused_listing_the_known_ones():
    with pytest.raises(TestEnvError) as e:
        active_test_env({"PHOENIX_TEST_REPLICATION_DELAY": "0.3"})  # a typo: the _S is missing
    assert "PHOENIX_TEST_REPLICATION_DELAY='0.3'" in str(e.value)
    assert all(name in str(e.value) for name in VARIABLES)


def test_every_test_only_variable_in_the_code_is_in_the_table_and_the_docs():
    import re

    names = set()
    for p in (ROOT / "phoenix_hpc").rglob("*.py"):
        names |= set(re.findall(r"PHOENIX_TEST_[A-Z0-9_]+", p.read_text()))
    assert names == set(VARIABLES)
    design = (ROOT / "docs" / "design.md").read_text()
    assert all(f"| `{n}` |" in design for n in VARIABLES)


def _submit(tmp_path, env):
    from tests.unit.test_submit_cli import write_cfg

    return CliRunner().invoke(cli, ["submit", "--site", "local", str(write_cfg(tmp_path)), "--dry-run"], env=env)


@pytest.mark.parametrize("name,value", [(DELAY, "inf"), (DELAY, "-1"), (HOLD_ENV, "quiesce:3"),
                                        ("PHOENIX_TEST_NOSUCH", "1")])
def test_submit_refuses_a_bad_test_variable_with_exit_2_before_sbatch(tmp_path, monkeypatch, name, value):
    monkeypatch.chdir(tmp_path)
    r = _submit(tmp_path, {name: value})
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and f"{name}={value!r}" in r.output


def test_submit_warns_that_sbatch_carries_a_set_test_variable_into_the_job(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(DELAY, raising=False)
    r = _submit(tmp_path, {DELAY: "0.3"})
    assert r.exit_code == 0, r.output
    assert f"{DELAY}='0.3'" in r.output and "--export=ALL" in r.output
    assert "test-only" not in _submit(tmp_path, {}).output


def test_a_coordinator_given_a_bad_replication_delay_exits_2_before_it_starts(tmp_path, monkeypatch, capsys):
    from phoenix_hpc.control.coordinator import main

    shutil.copy(ROOT / "examples" / "gpt-small.yaml", tmp_path / "config.yaml")
    monkeypatch.setenv(DELAY, "inf")
    assert main(["--run-dir", str(tmp_path)]) == 2
    assert f"{DELAY}='inf'" in capsys.readouterr().err
    assert not (tmp_path / "coordinator.json").exists() and not (tmp_path / "journal.jsonl").exists()


def test_a_protector_refuses_a_bad_replication_delay_before_it_builds_anything(monkeypatch):
    from phoenix_hpc.runtime.protector import Protector

    monkeypatch.setenv(DELAY, "nan")
    with pytest.raises(TestEnvError, match=f"{DELAY}='nan'"):
        Protector(engine_coord=None, shard_id="s", grid={}, generation=0, setup=None, chunk_bytes=0,
                  commit_timeout_s=None, on_commit=None, log=None, fault_hook=None, device=None)


def test_the_coordinator_journals_the_active_test_variables_at_its_start(tmp_path):
    from phoenix_hpc.control.coordinator import Coordinator
    from phoenix_hpc.control.journal import read_journal

    c = Coordinator(tmp_path, grid=(1, 1, 1), host="127.0.0.1", test_env={DELAY: "0.3"})
    c.open()
    try:
        (rec,) = read_journal(tmp_path, "test_env")
    finally:
        c.close()
    assert rec["variables"] == {DELAY: "0.3"}
    plain = tmp_path / "plain"
    plain.mkdir()
    c = Coordinator(plain, grid=(1, 1, 1), host="127.0.0.1")
    c.open()
    c.close()
    assert read_journal(plain, "test_env") == []


def test_status_shows_the_test_variables_a_job_ran_with():
    recs = [{"ts": 0.0, "event": "coordinator_started", "grid": [1, 1, 1]},
            {"ts": 0.0, "event": "test_env", "variables": {DELAY: "0.3"}}]
    st = derive_status(recs, None, now=1.0, run=RunFiles(run_dir="/r"))
    assert st.job.test_env == {DELAY: "0.3"}
    (w,) = [w for w in st.warnings if w.code == "test_env"]
    assert f"{DELAY}='0.3'" in w.message and f"unset {DELAY}" in w.action
    assert not [w for w in derive_status(recs[:1], None, now=1.0, run=RunFiles(run_dir="/r")).warnings
                if w.code == "test_env"]
