"""``phoenix status`` says whether the job logs its metrics to TensorBoard and W&B, and where (config.yaml's
``logging``), in the header and in ``--json``."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from phoenix_hpc.cli.main import cli
from phoenix_hpc.status.metrics_sinks import metrics_sinks, metrics_text
from test_cli_status import make_run
from test_status_derive import CONFIG, start_records


@pytest.mark.parametrize("logging, want", [
    (None, None),
    ({"tensorboard": False}, None),
    ({"tensorboard": True}, {"tensorboard": "/r/tensorboard", "wandb": None}),
    ({"tensorboard": True, "tensorboard_dir": "tb"}, {"tensorboard": "/r/tb", "wandb": None}),
    ({"tensorboard": True, "tensorboard_dir": "/scratch/tb"}, {"tensorboard": "/scratch/tb", "wandb": None}),
    ({"wandb": {"project": "p"}},
     {"tensorboard": None, "wandb": {"project": "p", "entity": None, "name": "toy", "mode": "online", "dir": None}}),
    ({"wandb": {"project": "p", "entity": "e", "name": "n", "mode": "offline"}},
     {"tensorboard": None, "wandb": {"project": "p", "entity": "e", "name": "n", "mode": "offline", "dir": "/r/wandb"}}),
    ("not a section", None),
])
def test_the_sinks_are_read_from_the_config_as_the_logging_rank_opens_them(logging, want):
    cfg = dict(CONFIG, **({"logging": logging} if logging is not None else {}))
    assert metrics_sinks(cfg, "/r") == want
    assert metrics_sinks(None, "/r") is None


def test_one_header_line_names_each_sink_and_where_its_data_goes():
    both = {"tensorboard": "/r/tb", "wandb": {"project": "p", "entity": "e", "name": "n", "mode": "offline",
                                                "dir": "/r/wandb"}}
    assert metrics_text(both) == "TensorBoard /r/tb; W&B project e/p, run n (offline: /r/wandb, upload with wandb sync)"
    assert metrics_text({"tensorboard": None, "wandb": dict(both["wandb"], entity=None, mode="online", dir=None)}) \
        == "W&B project p, run n (online)"


def test_phoenix_status_shows_the_metrics_sinks_of_the_job(tmp_path, monkeypatch):
    monkeypatch.setenv("PHOENIX_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setenv("COLUMNS", "250")
    plain = make_run(tmp_path, "plain", start_records())
    rd = make_run(tmp_path, "logged", start_records())
    (rd / "config.yaml").write_text(yaml.safe_dump(dict(CONFIG, logging={
        "tensorboard": True, "wandb": {"project": "llama", "mode": "offline"}})))
    r = CliRunner().invoke(cli, ["status", str(rd), "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["job"]["metrics"] == {
        "tensorboard": str(rd / "tensorboard"),
        "wandb": {"project": "llama", "entity": None, "name": "toy", "mode": "offline", "dir": str(rd / "wandb")}}
    r = CliRunner().invoke(cli, ["status", str(rd)], catch_exceptions=False)
    assert r.exit_code == 0 and f"metrics TensorBoard {rd / 'tensorboard'}; W&B project llama, run toy (offline: " \
        f"{rd / 'wandb'}, upload with wandb sync)" in " ".join(r.output.split())
    r = CliRunner().invoke(cli, ["status", str(plain), "--json"], catch_exceptions=False)
    assert json.loads(r.output)["job"]["metrics"] is None
    assert "TensorBoard" not in CliRunner().invoke(cli, ["status", str(plain)], catch_exceptions=False).output


@pytest.mark.parametrize("tensorboard_dir", [5, ["tb"], {"a": 1}])
def test_a_hand_edited_tensorboard_dir_that_is_not_a_path_reads_as_off_not_a_traceback(tmp_path, monkeypatch,
                                                                                      tensorboard_dir):
    cfg = dict(CONFIG, logging={"tensorboard": True, "tensorboard_dir": tensorboard_dir, "wandb": {"project": "p"}})
    assert metrics_sinks(cfg, "/r") == {
        "tensorboard": None, "wandb": {"project": "p", "entity": None, "name": "toy", "mode": "online", "dir": None}}
    monkeypatch.setenv("PHOENIX_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    rd = make_run(tmp_path, "odd", start_records())
    (rd / "config.yaml").write_text(yaml.safe_dump(dict(CONFIG, logging={"tensorboard": True,
                                                                         "tensorboard_dir": tensorboard_dir})))
    r = CliRunner().invoke(cli, ["status", str(rd), "--json"])
    assert r.exit_code == 0 and r.exception is None, r.output
    assert json.loads(r.output)["job"]["metrics"] is None
