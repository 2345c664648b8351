"""The Megatron engine's ``model.provider`` on CPU: the config field, the checks at submit (exit 2 naming the
field, the value and what is expected), the keywords the provider is called with, the checks of what it
returns (run on every rank before the first step), and examples/megatron-provider's Llama provider building
megatron-core's GPTModel from megatron-core's own layer specs. The engine's CUDA part (DDP, the distributed
optimizer, training) runs in the GPU check (phoenix_hpc/gpucheck/check_megatron.py, ``megatron.provider``)."""

from __future__ import annotations

import shutil
import sys
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner

from phoenix_hpc.cli.main import cli
from phoenix_hpc.config.schema import JobConfig
from phoenix_hpc.engines import megatron_provider as mp
from phoenix_hpc.engines.factory import check_user_code
from phoenix_hpc.errors import ConfigError
from test_megatron_cpu import gloo_world  # noqa: F401 -- fixture: a world of one gloo process
from test_submit_cli import assert_bad

warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine).*")

ROOT = Path(__file__).resolve().parents[2]
KIT = Path(__file__).resolve().parent / "kit_engines"
EXAMPLE = ROOT / "examples" / "megatron-provider"
LLAMA = "llama_provider.provider:llama_stage"
SHAPE = {"layers": 2, "hidden_size": 64, "heads": 4, "ffn_hidden_size": 96, "vocab_size": 256, "seq_length": 32}


def job(provider: str | None = LLAMA, engine: str = "megatron", options: dict | None = None, **over) -> JobConfig:
    base = {"name": "p", "engine": engine, "python_path": [str(EXAMPLE), str(KIT)], "data": {"path": "d"},
            "model": {**SHAPE, "provider": provider, "options": options or {"num_query_groups": 2}}}
    base.update(over)
    return JobConfig.model_validate(base)


@pytest.fixture(autouse=True)
def _forget_user_modules():
    yield
    for m in ("user_providers", "user_factories", "llama_provider", "llama_provider.provider"):
        sys.modules.pop(m, None)


def problems_of(cfg) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        check_user_code(cfg)
    return exc.value.problems


# --- the config field -----------------------------------------------------------------------------------
def test_provider_and_factory_are_exclusive_and_the_reference_is_checked():
    with pytest.raises(ValueError, match="set at most one of model.factory .* and model.provider"):
        JobConfig.model_validate({"name": "p", "engine": "megatron", "data": {"path": "d"},
                                  "model": {"factory": "a:b", "provider": "a:c"}})
    with pytest.raises(ValueError, match=r"model.provider[\s\S]*'a.b.c'[\s\S]*package.module:attribute"):
        job(provider="a.b.c")


# --- at submit --------------------------------------------------------------------------------------------
def test_good_provider_passes_for_megatron_and_engines_derived_from_it():
    check_user_code(job())
    check_user_code(job(engine="user_providers:DerivedMegatron"))


@pytest.mark.parametrize("engine", ["torch", "broken_engines:ClockEngine"])
def test_provider_with_the_torch_engine_or_one_derived_from_it_is_refused(engine):
    cfg = job(engine=engine, model={"provider": LLAMA}, data={"factory": "user_factories:good_data"})
    (p,) = problems_of(cfg)
    assert p.startswith(f"model.provider: value '{LLAMA}' -- a model provider is read by engine 'megatron'"), p
    assert f"engine is {engine!r}; expected engine: megatron" in p and "model.factory" in p


@pytest.mark.parametrize("provider, needles", [
    ("no_such_pkg.mod:f", ["model.provider: value 'no_such_pkg.mod:f'", "module 'no_such_pkg.mod' does not import",
                           "ModuleNotFoundError", "No module named 'no_such_pkg'"]),
    ("broken_import:f", ["model.provider", "does not import", "No module named 'phoenix_hpc_no_such_module'"]),
    ("user_providers:missing", ["model.provider", "has no attribute 'missing'"]),
    ("user_providers:NOT_CALLABLE", ["model.provider: value 'user_providers:NOT_CALLABLE'",
                                     "expected a callable, got a int"]),
    ("user_providers:positional_only", ["model.provider", "expected a callable taking the keyword arguments "
                                        "pre_process, post_process, config, vocab_size, max_sequence_length, "
                                        "options", "Megatron-LM's model_provider(pre_process, post_process)"]),
])
def test_bad_provider_is_refused_naming_field_value_and_expectation(provider, needles):
    (p,) = problems_of(job(provider=provider))
    for n in needles:
        assert n in p, p


def test_factory_with_the_megatron_engine_points_at_the_provider():
    cfg = JobConfig.model_validate({"name": "p", "engine": "megatron", "python_path": [str(KIT)],
                                    "data": {"factory": "user_factories:good_data"},
                                    "model": {"factory": "user_factories:good_model"}})
    model, data = problems_of(cfg)
    assert model.startswith("model.factory: value 'user_factories:good_model' -- engine 'megatron' does not read")
    assert "model.provider" in model
    assert data.startswith("data.factory: value 'user_factories:good_data' -- engine 'megatron' does not read")


def _example(tmp: Path, **model) -> Path:
    d = yaml.safe_load((EXAMPLE / "job.yaml").read_text())
    d["python_path"] = [str(EXAMPLE)]
    d["data"] = {"path": str(tmp / "absent")}
    d["model"].update(model)
    p = tmp / "job.yaml"
    p.write_text(yaml.safe_dump(d))
    return p


def test_example_dry_run_and_an_unimportable_provider_exits_2_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli, ["submit", "--site", "perlmutter", str(EXAMPLE / "job.yaml"), "--dry-run",
                                      "--data-on-cluster"])
    assert r.exit_code == 0, r.output
    assert "#SBATCH" in r.output
    p = _example(tmp_path, provider="no_such_pkg.llama:stage")
    r = CliRunner().invoke(cli, ["submit", "--site", "perlmutter", str(p), "--dry-run", "--data-on-cluster"])
    assert_bad(r, "model.provider: value 'no_such_pkg.llama:stage'", "module 'no_such_pkg.llama' does not import",
               "ModuleNotFoundError")
    r = CliRunner().invoke(cli, ["submit", "--site", "perlmutter", str(p), "--run-dir", str(tmp_path / "runs" / "x")])
    # a real submit: refused the same way, before the run directory is made or sbatch runs
    assert_bad(r, "model.provider", "does not import")
    assert sorted(f.name for f in tmp_path.iterdir()) == ["job.yaml"]


# --- the call and what it returns (every rank, before the first step) -----------------------------------
def test_provider_kwargs_are_megatron_lm_s_plus_what_its_arguments_would_give():
    cfg = job(options={"num_query_groups": 2, "x": [1]})
    kw = mp.provider_kwargs(cfg, "CONFIG", True, False)
    assert tuple(kw) == mp.PROVIDER_ARGS
    assert kw == {"pre_process": True, "post_process": False, "config": "CONFIG", "vocab_size": 256,
                  "max_sequence_length": 32, "options": {"num_query_groups": 2, "x": [1]}}


def test_base_config_is_the_job_s_transformer_config():
    tc = mp.base_config(job(model={**SHAPE, "dtype": "bfloat16", "provider": LLAMA}, parallelism={"tp": 2, "pp": 2}))
    assert (tc.num_layers, tc.hidden_size, tc.num_attention_heads, tc.ffn_hidden_size) == (2, 64, 4, 96)
    assert (tc.tensor_model_parallel_size, tc.pipeline_model_parallel_size) == (2, 2)
    assert tc.params_dtype == torch.bfloat16 and tc.deterministic_mode and tc.hidden_dropout == 0.0


@pytest.mark.parametrize("provider, needles", [
    ("user_providers:returns_string", ["returned a str for pipeline stage 0 of 1 (pre_process=True, "
                                       "post_process=True), expected a megatron-core MegatronModule"]),
    ("user_providers:returns_linear", ["returned a Linear", "a torch.nn.Module but not a megatron-core "
                                       "MegatronModule", "engine: torch and model.factory"]),
    ("user_providers:no_parameters", ["has no parameters"]),
    ("user_providers:other_tp", ["config.tensor_model_parallel_size = 2, expected 1 (parallelism.tp)"]),
    ("user_providers:other_dtype", ["config.params_dtype = torch.float16, expected float32 (model.dtype)"]),
])
def test_what_the_provider_returns_is_checked(gloo_world, provider, needles):  # noqa: F811
    cfg = job(provider=provider)
    with pytest.raises(ConfigError) as exc:
        _with_parallel_state(lambda: mp.build_stage(cfg, 0, True, True, _cpu_config(cfg)))
    (p,) = exc.value.problems
    assert p.startswith(f"model.provider: value '{provider}' --"), p
    for n in needles:
        assert n in p, p


def _cpu_config(cfg):
    return mp.base_config(cfg, use_cpu_initialization=True)


def _with_parallel_state(fn, tp: int = 1, pp: int = 1):
    from phoenix_hpc.engines.megatron_parallel import destroy_parallel_state, init_parallel_state

    init_parallel_state(tp, pp, timeout_s=30.0)
    try:
        return fn()
    finally:
        destroy_parallel_state()


def test_the_provider_gets_the_stage_flags_config_and_options(gloo_world):  # noqa: F811
    import user_providers

    cfg = job(provider="user_providers:seen", options={"a": 1})
    user_providers.seen.calls.clear()
    conf = mp.base_config(cfg, use_cpu_initialization=True)
    mod = _with_parallel_state(lambda: mp.build_stage(cfg, 0, True, True, conf))
    (kw,) = user_providers.seen.calls
    assert kw["config"] is conf and mod.config is conf
    assert (kw["pre_process"], kw["post_process"], kw["vocab_size"], kw["max_sequence_length"], kw["options"]) == (
        True, True, 256, 32, {"a": 1})


def test_a_stage_built_for_the_other_end_of_the_pipeline_is_refused(gloo_world):  # noqa: F811
    cfg = job(provider="user_providers:swapped_stage")
    conf = mp.base_config(cfg, use_cpu_initialization=True)
    with pytest.raises(ConfigError, match=r"built with pre_process=False for pipeline stage 0 of 1 \(pre_process=True, "
                                          r"post_process=False\); expected pre_process=True: the stages must match "
                                          r"parallelism.pp = 1"):
        _with_parallel_state(lambda: mp.build_stage(cfg, 0, True, False, conf))


def test_a_provider_that_raises_is_reported_with_its_error(gloo_world):  # noqa: F811
    cfg = job(options={"num_query_groups": 3})
    with pytest.raises(ConfigError, match=r"model.provider: value 'llama_provider.provider:llama_stage' -- raised "
                                          r"ValueError: options.num_query_groups \(3\) must divide model.heads \(4\) "
                                          r"when building pipeline stage 0 of 1"):
        _with_parallel_state(lambda: mp.build_stage(cfg, 0, True, True, _cpu_config(cfg)))


# --- the example: a Llama-style provider from megatron-core's own layer specs ------------------------------
@pytest.mark.parametrize("pre, post", [(True, True), (True, False), (False, True)], ids=["whole", "first", "last"])
def test_example_llama_provider_builds_megatron_core_s_gpt_model(gloo_world, pre, post):  # noqa: F811
    from megatron.core.models.gpt import GPTModel

    cfg = job(options={"num_query_groups": 2, "qk_layernorm": True, "rotary_base": 500000})
    conf = mp.base_config(cfg, use_cpu_initialization=True)
    gpt = _with_parallel_state(lambda: mp.build_stage(cfg, 0 if pre else 1, pre, post, conf))
    assert type(gpt) is GPTModel and (gpt.pre_process, gpt.post_process) == (pre, post)
    shapes = {n: tuple(p.shape) for n, p in gpt.named_parameters()}
    head_dim = 64 // 4
    assert shapes["decoder.layers.0.self_attention.linear_qkv.weight"] == ((4 + 2 * 2) * head_dim, 64)  # GQA
    assert shapes["decoder.layers.0.mlp.linear_fc1.weight"] == (2 * 96, 64)  # SwiGLU: gate and up
    assert "decoder.layers.0.self_attention.q_layernorm.weight" in shapes  # options.qk_layernorm
    assert not any(n.endswith(".bias") for n in shapes)  # no biases; RMSNorm has none
    assert not any("position_embeddings" in n for n in shapes)  # RoPE
    assert ("embedding.word_embeddings.weight" in shapes) == pre
    assert ("output_layer.weight" in shapes) == post  # untied head on the last stage only
    assert gpt.rotary_pos_emb is not None and gpt.config.normalization == "RMSNorm"
    assert gpt.config.gated_linear_unit and gpt.config.activation_func is torch.nn.functional.silu
    assert conf.normalization == "LayerNorm"  # the engine's config is left as it was (replace, not mutate)


def test_example_provider_copied_elsewhere_imports_through_python_path(tmp_path):
    shutil.copytree(EXAMPLE / "llama_provider", tmp_path / "llama_provider")
    check_user_code(job(python_path=[str(tmp_path)]))
    assert sys.modules["llama_provider"].__file__.startswith(str(tmp_path))
