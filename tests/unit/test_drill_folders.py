"""Every run of a drill (and of a demo: tests/unit/test_demo_parts.py) writes only into its own run directory:
a config whose checkpoint, Megatron-LM and TensorBoard folders are absolute (as ``phoenix config
from-megatron`` writes them from ``--save /abs``) is submitted with those folders moved under each run's
directory, so the drill job never starts from the reference's final checkpoint and no run writes into the
user's folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from phoenix_hpc.config.load import load_job_config
from phoenix_hpc.drills.folders import config_yaml, isolated_config, run_folders

ROOT = Path(__file__).resolve().parents[2]


def _config(tmp_path: Path, **resilience_checkpoint) -> tuple[Path, object]:
    data = yaml.safe_load((ROOT / "examples" / "gpt-small.yaml").read_text())
    data["data"]["path"] = str(ROOT / "data" / "stdlib")
    data["resilience"]["checkpoint"].update(resilience_checkpoint)
    data["logging"] = {"tensorboard": True, "tensorboard_dir": str(tmp_path / "user" / "tb")}
    p = tmp_path / "user" / "job.yaml"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(yaml.safe_dump(data))
    return p, load_job_config(p)


def test_an_absolute_checkpoint_folder_becomes_a_different_folder_under_each_run_dir(tmp_path):
    user_ckpt = str(tmp_path / "user" / "ckpt")
    _, cfg = _config(tmp_path, path=user_ckpt, save_megatron=user_ckpt, load_megatron=str(tmp_path / "start"))
    base = tmp_path / "drill"
    runs = {name: isolated_config(cfg, base / name) for name in ("reference", "job")}
    for name, (run_cfg, folders) in runs.items():
        rd = base / name
        assert folders["checkpoints"] == str(rd / "checkpoints") == run_folders(run_cfg, rd)["checkpoints"]
        # phoenix's and Megatron-LM's checkpoints shared the user's folder: they share the run's
        assert run_cfg.resilience.checkpoint.save_megatron == folders["save_megatron"] == str(rd / "checkpoints")
        assert folders["tensorboard"] == str(rd / "tensorboard")
        # the start point is only read: every run starts from it
        assert folders["load_megatron"] == str(tmp_path / "start")
        assert user_ckpt not in (folders["checkpoints"], folders["save_megatron"])
        assert folders["tensorboard"] != cfg.logging.tensorboard_dir
        assert run_cfg.run_dir == str(rd)
    ref, job = (runs[n][1] for n in ("reference", "job"))
    assert ref["checkpoints"] != job["checkpoints"] and ref["tensorboard"] != job["tensorboard"]
    # everything else is the user's config
    def strip(c):
        return c.model_dump(mode="json", exclude={"run_dir": True, "resilience": {"checkpoint"},
                                                  "logging": {"tensorboard_dir"}})

    assert strip(runs["job"][0]) == strip(cfg)


def test_a_separate_megatron_save_folder_and_a_relative_checkpoint_folder_are_moved_too(tmp_path):
    _, cfg = _config(tmp_path, path="../shared-ckpt", save_megatron=str(tmp_path / "user" / "megatron"))
    run_cfg, folders = isolated_config(cfg, tmp_path / "drill" / "job")
    # ../shared-ckpt would have been the same folder for the reference and the job
    assert folders["checkpoints"] == str(tmp_path / "drill" / "job" / "checkpoints")
    assert folders["save_megatron"] == str(tmp_path / "drill" / "job" / "megatron")
    assert folders["load_megatron"] is None


def test_a_relative_megatron_save_folder_is_left_for_submit_to_refuse(tmp_path):
    _, cfg = _config(tmp_path, save_megatron="megatron")
    run_cfg, _ = isolated_config(cfg, tmp_path / "drill" / "job")
    assert run_cfg.resilience.checkpoint.save_megatron == "megatron"


def test_the_written_config_reads_back_the_same_and_leaves_site_defaults_open(tmp_path):
    data = yaml.safe_load((ROOT / "examples" / "gpt-small.yaml").read_text())
    data["data"]["path"] = "../data/stdlib"  # relative to the config's folder: absolute once loaded
    del data["resilience"]["placement_levels"]  # phoenix submit takes the site's levels when not given
    p = tmp_path / "cfg" / "job.yaml"
    p.parent.mkdir()
    p.write_text(yaml.safe_dump(data))
    run_cfg, _ = isolated_config(load_job_config(p), tmp_path / "drill" / "reference")
    written = tmp_path / "elsewhere" / "reference.yaml"
    written.parent.mkdir()
    written.write_text(config_yaml(run_cfg))
    back = load_job_config(written)
    assert back == run_cfg
    assert back.data.path == str(tmp_path / "data" / "stdlib")
    assert "placement_levels" not in back.resilience.model_fields_set


def test_the_drill_submits_each_run_with_its_own_folders_and_names_the_users_config_in_errors(tmp_path,
                                                                                            monkeypatch):
    """``phoenix drill``'s submit step: the config handed to ``phoenix submit`` names the run's folders, the
    user's absolute checkpoint folder is never handed on, and a problem submit finds names the user's file."""
    import phoenix_hpc.status.runs as runs
    from phoenix_hpc.cli import drill as cli_drill
    from phoenix_hpc.cli.submit import submit
    from phoenix_hpc.errors import ConfigError

    user_ckpt = str(tmp_path / "user" / "ckpt")
    path, cfg = _config(tmp_path, path=user_ckpt)
    seen: list[dict] = []

    def fake_main(args, standalone_mode):
        seen.append(yaml.safe_load(Path(args[0]).read_text()) | {"_run_dir": args[args.index("--run-dir") + 1]})
        print(json.dumps({"job_id": str(len(seen))}))

    monkeypatch.setattr(submit, "main", fake_main)
    monkeypatch.setattr(runs, "record_run", lambda *a, **k: None)
    base = tmp_path / "drill"
    ids = [cli_drill._submit(path, cfg, "local", base / name) for name in ("reference", "job")]
    assert [i for i, _ in ids] == ["1", "2"]
    for name, sent, (_, folders) in zip(("reference", "job"), seen, ids):
        assert sent["_run_dir"] == str(base / name)
        assert sent["resilience"]["checkpoint"]["path"] == str(base / name / "checkpoints") == folders["checkpoints"]
        assert sent["logging"]["tensorboard_dir"] == str(base / name / "tensorboard")
        assert user_ckpt not in json.dumps(sent)

    def refusing(args, standalone_mode):
        raise ConfigError(["data.path: missing"], source=args[0])

    monkeypatch.setattr(submit, "main", refusing)
    with pytest.raises(ConfigError) as exc:
        cli_drill._submit(path, cfg, "local", base / "job2")
    assert exc.value.source.startswith(str(path)) and exc.value.problems == ["data.path: missing"]
