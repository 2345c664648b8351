"""A model, a dataset and an engine of one's own: config fields, the checks at submit (exit 2 naming field,
value and what is expected), and the torch engine training a factory's model on a factory's dataset."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner

from phoenix_hpc.cli.main import cli
from phoenix_hpc.config.load import load_job_config
from phoenix_hpc.engines.base import GridCoord
from phoenix_hpc.engines.factory import create_engine
from phoenix_hpc.engines.user_code import load_engine_class, split_reference
from phoenix_hpc.errors import ConfigError
from phoenix_hpc.launch.loop import train
from test_submit_cli import assert_bad

ROOT = Path(__file__).resolve().parents[2]
KIT = Path(__file__).resolve().parent / "kit_engines"
EXAMPLE = ROOT / "examples" / "custom-model"


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A config folder holding the test factories (imported through python_path: ['.'])."""
    for f in ("user_factories.py", "broken_engines.py", "broken_import.py"):
        shutil.copy(KIT / f, tmp_path / f)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    import sys

    for m in ("user_factories", "broken_engines", "broken_import"):
        sys.modules.pop(m, None)


def write(folder: Path, **over) -> Path:
    cfg = {
        "name": "mine", "engine": "torch",
        "model": {"factory": "user_factories:good_model", "hidden_size": 16, "seq_length": 8, "vocab_size": 256},
        "parallelism": {"tp": 1, "pp": 1},
        "training": {"steps": 3, "micro_batch_size": 2, "global_batch_size": 4, "seed": 3},
        "data": {"factory": "user_factories:good_data"},
        "resources": {"nodes": 2, "spares": 1},
    }
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(cfg.get(k), dict):
            cfg[k] = {**cfg[k], **v}
        else:
            cfg[k] = v
    p = folder / "job.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def dry_run(path: Path):
    r = CliRunner().invoke(cli, ["submit", "--site", "local", str(path), "--dry-run"])
    return r




def test_reference_syntax():
    assert split_reference("model.factory", "a.b:c.d") == ("a.b", "c.d")
    for v in ("a.b.c", "a.b:", ":c", "a b:c", "a:1x"):
        with pytest.raises(ConfigError, match="expected 'package.module:attribute'"):
            split_reference("model.factory", v)


def test_good_config_passes_dry_run_and_python_path_is_absolute(folder):
    p = write(folder)
    r = dry_run(p)
    assert r.exit_code == 0, r.output
    assert load_job_config(p).python_path == [str(folder.resolve())]


@pytest.mark.parametrize("over, needles", [
    ({"model": {"factory": "user_factories.good_model"}}, ["model.factory", "user_factories.good_model",
                                                         "package.module:attribute"]),
    ({"model": {"factory": "no_such_pkg.mod:f"}}, ["model.factory", "'no_such_pkg.mod:f'", "does not import",
                                                 "ModuleNotFoundError", "no_such_pkg"]),
    ({"model": {"factory": "broken_import:f"}}, ["model.factory", "does not import",
                                               "No module named 'phoenix_hpc_no_such_module'"]),
    ({"model": {"factory": "user_factories:missing"}}, ["model.factory", "has no attribute 'missing'"]),
    ({"model": {"factory": "user_factories:NOT_CALLABLE"}}, ["model.factory", "expected a callable, got a int"]),
    ({"model": {"factory": "user_factories:no_keywords"}}, ["model.factory", "keyword arguments stage, num_stages"]),
    ({"model": {"factory": "user_factories:returns_string"}}, ["model.factory", "returned a str",
                                                             "expected a torch.nn.Module"]),
    ({"model": {"factory": "user_factories:two_stages"}}, ["model.factory", "returned 2 stage modules",
                                                         "parallelism.pp = 1"]),
    ({"model": {"factory": "user_factories:wrong_vocab"}}, ["model.factory", "returned (2, 8, 100)",
                                                          "expected logits", "(2, 8, 256)"]),
    ({"data": {"factory": "user_factories:float_data"}}, ["data.factory", "item 0", "dtype torch.float32",
                                                        "expected shape (9,)", "torch.int64"]),
    ({"data": {"factory": "user_factories:short_data"}}, ["data.factory", "item 0 has shape (8,)",
                                                        "expected shape (9,)"]),
    ({"data": {"factory": "user_factories:good_data", "path": "x"}}, ["data", "set exactly one of data.path"]),
    ({"engine": "broken_engines:NotAnEngine"}, ["engine", "'broken_engines:NotAnEngine'",
                                                "expected a subclass of phoenix_hpc.engines.base.Engine"]),
    ({"engine": "no_such_engine_name"}, ["engine", "'no_such_engine_name'", "entry point", "phoenix_hpc.engines"]),
])
def test_bad_user_code_exits_2_at_submit(folder, over, needles):
    r = dry_run(write(folder, **over))
    assert_bad(r, *needles)
    assert not (folder / "runs").exists()


def test_factories_are_refused_for_the_megatron_engine(folder):
    from phoenix_hpc.engines.factory import check_user_code

    with pytest.raises(ConfigError) as exc:
        check_user_code(load_job_config(write(folder, engine="megatron")))
    assert [p.split(" -- ")[0] for p in exc.value.problems] == [
        "model.factory: value 'user_factories:good_model'", "data.factory: value 'user_factories:good_data'"]
    assert "engine 'megatron' does not read model.factory: its model comes from model.provider" in exc.value.problems[0]
    assert "engine 'megatron' does not read data.factory" in exc.value.problems[1]


def test_gpt_options_with_a_factory_point_at_model_options(folder):
    assert_bad(dry_run(write(folder, model={"activation": "swiglu"})), "model.activation",
               "pass your model's settings in model.options")


def test_stage_count_checked_for_every_stage_of_pp(folder):
    p = write(folder, parallelism={"tp": 1, "pp": 2}, model={"factory": "user_factories:two_stages"},
              resources={"nodes": 4, "spares": 1})
    # two_stages returns 2 modules, pp=2: accepted as a list, but stage 0's output must then be hidden states
    assert_bad(dry_run(p), "model.factory", "stage 0 of 2 returned (2, 8, 256)", "hidden states")


def test_example_config_dry_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from test_submit_cli import fake_dataset

    (tmp_path / "data").mkdir()
    example = yaml.safe_load((EXAMPLE / "job.yaml").read_text())
    example["python_path"] = [str(EXAMPLE)]
    example["data"] = {"path": str(fake_dataset(tmp_path / "data"))}  # a dry run refuses a dataset not here
    (tmp_path / "example.yaml").write_text(yaml.safe_dump(example))
    r = dry_run(tmp_path / "example.yaml")
    assert r.exit_code == 0, r.output
    assert_bad(dry_run(_edited(tmp_path, parallelism={"tp": 1, "pp": 3}, resources={"nodes": 6, "spares": 0})),
        "model.factory", "raised ValueError", "options.layers (4) must be divisible by the number of stages (3)")


def _edited(tmp: Path, **over) -> Path:
    d = yaml.safe_load((EXAMPLE / "job.yaml").read_text())
    d.update(over)
    d["python_path"] = [str(EXAMPLE)]
    d["data"] = {"path": str(ROOT / "data" / "stdlib")}
    p = tmp / "job.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


# --- the torch engine with both factories, one process -------------------------------------------------
def test_torch_engine_trains_factory_model_on_factory_data(folder, world1):
    cfg = load_job_config(write(folder))
    eng = create_engine(cfg, GridCoord(0, 0, 0), world1, torch.device("cpu"))
    assert type(eng.model).__name__ == "TinyLM"
    names = [n for n, _ in eng.param_shard()]
    assert names == ["param/pp0/tp0/embed.weight", "param/pp0/tp0/head.weight", "param/pp0/tp0/head.bias"]
    recs = train(eng, 3, 32)
    assert len(recs) == 3 and all(r.loss is not None and r.loss > 0 for r in recs)
    # same seed -> same init (the factory runs under torch's RNG seeded with training.seed)
    other = create_engine(cfg, GridCoord(0, 0, 0), world1, torch.device("cpu"))
    first = create_engine(cfg, GridCoord(0, 0, 0), world1, torch.device("cpu"))
    assert other.state_hash() == first.state_hash()


def test_bad_item_at_run_time_names_field_and_item(folder, world1):
    cfg = load_job_config(write(folder, data={"factory": "user_factories:good_data", "options": {"bad_at": 5}}))
    eng = create_engine(cfg, GridCoord(0, 0, 0), world1, torch.device("cpu"))
    train(eng, 1, 32)  # items 0..3
    with pytest.raises(ConfigError, match=r"data.factory: value 'user_factories:good_data' -- item 5 has shape "
                                          r"\(9,\) dtype torch.int32, expected shape \(9,\)"):
        train(eng, 2, 32)


@pytest.mark.parametrize("factory, pp, needle", [
    ("meta_blind_wrong_vocab", 1, "stage 0 of 1 returned (2, 8, 100), expected logits (mbs, seq_length, "
                                  "vocab_size) = (2, 8, 256)"),
    ("crashes_in_forward", 1, "the module of stage 0 of 1 raised RuntimeError: this forward is broken on one "
                              "micro-batch of zeros of shape (2, 8)"),
    ("two_stages", 3, "returned 2 stage modules, expected parallelism.pp = 3"),
])
def test_what_submit_cannot_see_stops_the_rank_before_the_first_step(folder, world1, factory, pp, needle):
    """Checks the meta-device probe at submit cannot make (a forward that needs real data) run on the rank when
    the engine is built, before the first step: ConfigError (exit 2) naming the field and value."""
    cfg = load_job_config(write(folder, model={"factory": f"user_factories:{factory}"}))
    if pp == 1:
        assert dry_run(write(folder, model={"factory": f"user_factories:{factory}"})).exit_code == 0
    else:  # the stage count is checked at submit too; here the rank's own build of stage 0
        cfg = cfg.model_copy(update={"parallelism": cfg.parallelism.model_copy(update={"pp": pp})})
    with pytest.raises(ConfigError) as exc:
        if pp == 1:
            create_engine(cfg, GridCoord(0, 0, 0), world1, torch.device("cpu"))
        else:
            from phoenix_hpc.engines.custom_model import build_stage

            build_stage(cfg, 0, pp)
    (p,) = exc.value.problems
    assert p.startswith(f"model.factory: value 'user_factories:{factory}' --") and needle in p, p


def test_engine_from_an_installed_entry_point(folder, monkeypatch):
    """``engine: NAME`` finds an entry point of group phoenix_hpc.engines in an installed distribution's
    metadata (a real .dist-info folder on sys.path, read by importlib.metadata)."""
    dist = folder / "myengines-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: myengines\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[phoenix_hpc.engines]\nclockwork = broken_engines:ClockEngine\n"
                                           "notanengine = broken_engines:NotAnEngine\n"
                                           "gone = no_such_module_here:Engine\n")
    monkeypatch.syspath_prepend(str(folder))
    assert load_engine_class("clockwork").__name__ == "ClockEngine"
    with pytest.raises(ConfigError, match="engine: value 'notanengine' -- expected a subclass of "
                                          "phoenix_hpc.engines.base.Engine, got NotAnEngine"):
        load_engine_class("notanengine")
    with pytest.raises(ConfigError, match="engine: value 'gone' -- entry point 'no_such_module_here:Engine' does "
                                          "not load: ModuleNotFoundError"):
        load_engine_class("gone")


def test_engine_class_loads_from_reference(folder):
    cls = load_engine_class("broken_engines:ClockEngine", [str(folder)])
    assert cls.__name__ == "ClockEngine"
    assert load_engine_class("torch").__name__ == "TorchEngine"
