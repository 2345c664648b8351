"""``phoenix status`` reads config.yaml and job.json without re-validating them (an older version's must
render): a hand-edited section or value of the wrong type reads as not given, never a traceback."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from phoenix_hpc.cli.main import cli
from test_cli_status import make_run
from test_status_derive import CONFIG, start_records


@pytest.mark.parametrize("config", [
    dict(CONFIG, resilience="x"),
    dict(CONFIG, resilience={"checkpoint": "x"}),
    dict(CONFIG, resilience={"checkpoint": {"path": 5}}),
    dict(CONFIG, resilience={"checkpoint": {"path": ["a"]}}),
])
def test_a_wrong_typed_checkpoint_section_or_path_is_read_as_not_given(tmp_path, monkeypatch, config):
    monkeypatch.setenv("PHOENIX_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    rd = make_run(tmp_path, "odd", start_records())
    (rd / "config.yaml").write_text(yaml.safe_dump(config))
    r = CliRunner().invoke(cli, ["status", str(rd), "--json"])
    assert r.exit_code == 0 and r.exception is None, r.output
    assert json.loads(r.output)["job"]["job_id"] == "424242"


def test_a_job_list_that_is_not_a_list_reads_as_one_job(tmp_path):
    from phoenix_hpc.status.collect import read_run_files

    rd = make_run(tmp_path, "odd", start_records())
    (rd / "job.json").write_text(json.dumps({"job_id": "424242", "jobs": 5}))
    assert read_run_files(rd).rank_steps == []
