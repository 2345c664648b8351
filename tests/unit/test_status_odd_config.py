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


@pytest.mark.parametrize("parallelism", [{"tp": 1, "pp": 1, "dp": "x"}, {"tp": [1], "pp": 1, "dp": 2}, "x",
                                         {"dp": -2}, {"dp": 2.5}, {"dp": True}])
def test_a_wrong_typed_parallelism_is_read_as_no_grid_before_the_journal_names_one(tmp_path, monkeypatch,
                                                                                  parallelism):
    from phoenix_hpc.status.derive import _config_grid

    assert _config_grid(dict(CONFIG, parallelism=parallelism)) is None
    assert _config_grid(dict(CONFIG, parallelism={"dp": 4})) == (1, 1, 4)
    assert _config_grid(dict(CONFIG, parallelism={"tp": 2, "pp": 3, "dp": 4})) == (2, 3, 4)
    monkeypatch.setenv("PHOENIX_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    rd = make_run(tmp_path, "odd", [])
    (rd / "config.yaml").write_text(yaml.safe_dump(dict(CONFIG, parallelism=parallelism)))
    r = CliRunner().invoke(cli, ["status", str(rd), "--json"])
    assert r.exit_code == 0 and r.exception is None, r.output


@pytest.mark.parametrize("records", ["none", "started"])
@pytest.mark.parametrize("section, value", [
    ("resilience", {"k": "x"}), ("resilience", {"k": [1]}), ("resilience", {"placement_levels": 5}),
    ("resilience", {"placement_levels": [1, 2]}), ("resources", {"spares": "x", "gpus_per_node": 4}),
    ("resources", {"spares": 1, "gpus_per_node": "x"}),
])
def test_a_wrong_typed_k_level_or_count_is_read_as_not_given(tmp_path, monkeypatch, records, section, value):
    from phoenix_hpc.status.derive import _config_int, _config_levels

    cfg = dict(CONFIG, **{section: dict(CONFIG.get(section) or {}, **value)})
    for bad in (5, "rack", [1, 2], []):  # a string is not a list of one level per character
        assert _config_levels({"resilience": {"placement_levels": bad}}) == ["node"]
    assert _config_int({"resilience": {"k": 2}}, "resilience", "k") == 2
    assert _config_int({"resilience": {"k": True}}, "resilience", "k") is None
    assert _config_levels({"resilience": {"placement_levels": ["rack", "node"]}}) == ["rack", "node"]
    monkeypatch.setenv("PHOENIX_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    rd = make_run(tmp_path, "odd", start_records() if records == "started" else [])
    (rd / "config.yaml").write_text(yaml.safe_dump(cfg))
    for extra in ([], ["--json"]):
        r = CliRunner().invoke(cli, ["status", str(rd), *extra])
        assert r.exit_code == 0 and r.exception is None, r.output
