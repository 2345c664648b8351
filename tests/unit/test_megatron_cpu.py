"""The Megatron engine's rules that need no GPU, against the installed megatron-core on CPU: the API names it
calls exist, the version bounds, config -> TransformerConfig / GPTModel (the real objects, built on CPU),
parallel state with the collective timeout on every group and no gloo DP groups, weight-decay groups, and
the recovery contract of the class."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import tomllib
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from phoenix_hpc.config.load import load_job_config
from phoenix_hpc.config.schema import JobConfig
from phoenix_hpc.engines import megatron_version as mv

ROOT = Path(__file__).resolve().parents[2]

warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine).*")


def job(**over) -> JobConfig:
    base = {"name": "m", "engine": "megatron", "data": {"path": "d"}}
    for k, v in over.items():
        base[k] = v
    return JobConfig.model_validate(base)


# --- versions and API names ------------------------------------------------------------------------------
def _names_of(obj) -> set[str]:
    if dataclasses.is_dataclass(obj):
        return {f.name for f in dataclasses.fields(obj)}
    return set(inspect.signature(obj).parameters)


@pytest.mark.parametrize("module,attr,kind,names", mv.API, ids=[f"{m}.{a}" for m, a, _, _ in mv.API])
def test_every_megatron_name_the_engine_calls_exists(module, attr, kind, names):
    mod = importlib.import_module(module)
    assert hasattr(mod, attr), f"{module} has no {attr} in megatron-core {mv.installed_version()}"
    obj = getattr(mod, attr)
    if kind == "kwargs":
        missing = set(names) - _names_of(obj)
        assert not missing, f"{module}.{attr} lacks {sorted(missing)}"
    elif kind == "methods":
        missing = [n for n in names if not callable(getattr(obj, n, None))]
        assert not missing, f"{module}.{attr} lacks methods {missing}"


def test_the_engine_source_calls_only_listed_megatron_names():
    """Every ``mc["..."]`` lookup and every method of the DistributedOptimizer the engine calls is in API."""
    src = (ROOT / "phoenix_hpc/engines/megatron_engine.py").read_text()
    listed = {a for _, a, _, _ in mv.API} | {n for _, _, k, ns in mv.API if k == "methods" for n in ns}
    for name in ("get_parameter_state_dp_reshardable", "initialize_model_parallel", "broadcast_params",
                 "zero_grad_buffer", "model_parallel_cuda_manual_seed", "get_cuda_rng_tracker"):
        assert name in listed
    for method in re.findall(r"\bo\.(get_\w+)\(", src):
        assert method in listed, method


def test_pyproject_bounds_are_the_supported_range_and_the_installed_version_is_in_it():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert mv.REQUIREMENT in deps
    lo, hi = mv.SUPPORTED
    assert mv.REQUIREMENT == f"megatron-core>={lo[0]}.{lo[1]},<{hi[0]}.{hi[1]}"
    assert mv.version_problem(mv.installed_version()) is None


@pytest.mark.parametrize("version,ok", [("0.16.1", True), ("0.16.0rc3", True), ("0.17.0", True), ("0.19.2", True),
                                        ("0.15.0", False), ("0.12.3", False), ("0.20.0", False), ("1.0.0", False)])
def test_version_problem(version, ok):
    problem = mv.version_problem(version)
    assert (problem is None) == ok
    if not ok:
        assert version in problem and ">=0.16,<0.20" in problem


def test_version_problem_names_missing_and_unreadable():
    assert "not installed" in mv.version_problem(None)
    assert "cannot read" in mv.version_problem("dev")


# --- config -> megatron-core -----------------------------------------------------------------------------
def test_llama_7b_example_maps_to_transformer_config_and_gpt_model_kwargs():
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.enums import AttnBackend

    from phoenix_hpc.engines.megatron_spec import gpt_model_kwargs, transformer_config_kwargs

    cfg = load_job_config(ROOT / "examples" / "perlmutter-7b.yaml")
    tc = TransformerConfig(**transformer_config_kwargs(cfg))
    assert (tc.num_layers, tc.hidden_size, tc.num_attention_heads, tc.num_query_groups, tc.ffn_hidden_size) == (
        32, 4096, 32, 32, 11008)
    assert tc.normalization == "RMSNorm" and tc.gated_linear_unit and tc.activation_func is F.silu
    assert tc.add_bias_linear is False and tc.bf16 and tc.params_dtype == torch.bfloat16
    assert tc.recompute_granularity == "selective" and tc.sequence_parallel and tc.tensor_model_parallel_size == 4
    assert tc.attention_backend == AttnBackend.auto
    assert tc.hidden_dropout == 0.0 and tc.attention_dropout == 0.0 and tc.deterministic_mode
    gk = gpt_model_kwargs(cfg)
    assert gk == {"vocab_size": 32000, "max_sequence_length": 4096, "position_embedding_type": "rope",
                  "rotary_base": 10000, "share_embeddings_and_output_weights": False}


def test_gpt_defaults_map_to_the_gpt2_shape_and_full_recompute_is_uniform():
    from megatron.core.transformer import TransformerConfig

    from phoenix_hpc.engines.megatron_spec import gpt_model_kwargs, transformer_config_kwargs

    cfg = job(model={"layers": 2, "hidden_size": 64, "heads": 4}, megatron={"recompute_granularity": "full"})
    tc = TransformerConfig(**transformer_config_kwargs(cfg))
    assert tc.ffn_hidden_size == 256 and tc.num_query_groups == 4 and tc.normalization == "LayerNorm"
    assert tc.activation_func is F.gelu and not tc.gated_linear_unit and tc.add_bias_linear
    assert (tc.recompute_granularity, tc.recompute_method, tc.recompute_num_layers) == ("full", "uniform", 1)
    assert gpt_model_kwargs(cfg)["position_embedding_type"] == "learned_absolute"


def test_init_method_std_reaches_transformer_config_and_the_cpu_built_weights(gloo_world):
    """model.init_method_std is megatron-core's init_method_std: weights ~ N(0, std), the residual output
    projections (linear_proj, linear_fc2) N(0, std / sqrt(2 L)), as megatron-core derives them."""
    from phoenix_hpc.engines.megatron_parallel import destroy_parallel_state, init_parallel_state
    from phoenix_hpc.engines.megatron_spec import transformer_config_kwargs

    shape = {"layers": 2, "hidden_size": 128, "heads": 4, "vocab_size": 256, "seq_length": 16}
    assert transformer_config_kwargs(job(model=shape))["init_method_std"] == 0.02  # the default: Megatron-LM's
    cfg = job(model={**shape, "init_method_std": 0.006})
    assert transformer_config_kwargs(cfg)["init_method_std"] == 0.006
    init_parallel_state(1, 1, timeout_s=30.0)
    try:
        torch.manual_seed(0)
        params = dict(_tiny_model(cfg).named_parameters())
    finally:
        destroy_parallel_state()
    layer = "decoder.layers.0."
    for name, want in ((layer + "self_attention.linear_qkv.weight", 0.006), (layer + "mlp.linear_fc1.weight", 0.006),
                       (layer + "self_attention.linear_proj.weight", 0.006 / 2), (layer + "mlp.linear_fc2.weight", 0.006 / 2),
                       ("embedding.word_embeddings.weight", 0.006)):
        assert float(params[name].float().std()) == pytest.approx(want, rel=0.05), name


def test_build_problems_reports_what_megatron_core_refuses():
    from phoenix_hpc.engines.megatron_spec import build_problems, submit_problems

    assert build_problems(load_job_config(ROOT / "examples" / "vista-7b.yaml")) == []
    # the schema refuses this first in real use; megatron-core's own check must catch it too
    cfg = job(model={"layers": 4, "hidden_size": 64, "heads": 4}, parallelism={"tp": 2})
    bad = cfg.model_copy(update={"model": cfg.model.model_copy(update={"num_query_groups": 3})})
    problems = build_problems(bad)
    assert len(problems) == 1 and problems[0].startswith("model: megatron-core cannot build this model")
    assert "num_query_groups (3)" in problems[0]
    assert submit_problems(job(engine="torch", model={"layers": 2})) == []


@pytest.fixture(scope="module")
def gloo_world():
    import torch.distributed as dist

    from phoenix_hpc.engines.megatron_parallel import destroy_parallel_state

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    destroy_parallel_state()
    dist.destroy_process_group()


def test_parallel_state_timeout_on_every_group_no_gloo_and_teardown(gloo_world):
    from megatron.core import parallel_state as ps

    from phoenix_hpc.engines.megatron_parallel import (
        created_groups,
        destroy_parallel_state,
        groups_and_coord,
        init_parallel_state,
    )

    assert created_groups() == []
    init_parallel_state(1, 1, timeout_s=7.5)
    try:
        created = created_groups()
        assert len(created) >= 5 and ps.get_data_parallel_group() in created
        for g in created:
            assert g._get_backend(torch.device("cpu")).options._timeout.total_seconds() == 7.5
        with pytest.raises(AssertionError, match="gloo"):
            ps.get_data_parallel_group_gloo()
        groups, coord = groups_and_coord(gloo_world, generation=3)
        assert groups.world is gloo_world and groups.generation == 3 and groups.dp is ps.get_data_parallel_group()
        assert (coord.pp, coord.dp, coord.tp) == (0, 0, 0)
        with pytest.raises(RuntimeError, match="already initialised"):
            init_parallel_state(1, 1, timeout_s=7.5)
    finally:
        destroy_parallel_state()
    assert not ps.model_parallel_is_initialized() and created_groups() == []
    destroy_parallel_state()  # idempotent
    init_parallel_state(1, 1, timeout_s=3.0)  # the next generation builds afresh
    assert ps.model_parallel_is_initialized()
    destroy_parallel_state()


def _tiny_model(cfg):
    from megatron.core.models.gpt import GPTModel

    from phoenix_hpc.engines.megatron_spec import gpt_model_kwargs, layer_spec, transformer_config_kwargs
    from megatron.core.transformer import TransformerConfig

    tc = TransformerConfig(**transformer_config_kwargs(cfg), use_cpu_initialization=True)
    return GPTModel(config=tc, transformer_layer_spec=layer_spec(cfg), **gpt_model_kwargs(cfg))


LLAMA_TINY = {"layers": 2, "hidden_size": 64, "heads": 8, "num_query_groups": 2, "ffn_hidden_size": 176,
              "vocab_size": 256, "seq_length": 32, "position_embedding_type": "rope", "activation": "swiglu",
              "normalization": "RMSNorm", "add_bias_linear": False}


def test_llama_shaped_gpt_model_builds_on_cpu_with_gqa_swiglu_rmsnorm(gloo_world):
    from phoenix_hpc.config.memory import stage_params
    from phoenix_hpc.engines.megatron_parallel import destroy_parallel_state, init_parallel_state

    init_parallel_state(1, 1, timeout_s=30.0)
    try:
        cfg = job(model=LLAMA_TINY)
        shapes = {n: tuple(p.shape) for n, p in _tiny_model(cfg).named_parameters()}
    finally:
        destroy_parallel_state()
    head_dim = 64 // 8
    assert shapes["decoder.layers.0.self_attention.linear_qkv.weight"] == ((8 + 2 * 2) * head_dim, 64)  # GQA
    assert shapes["decoder.layers.0.mlp.linear_fc1.weight"] == (2 * 176, 64)  # SwiGLU: gate and up
    assert shapes["decoder.layers.0.mlp.linear_fc2.weight"] == (64, 176)
    assert not any(n.endswith(".bias") for n in shapes)  # add_bias_linear false, RMSNorm has no bias
    assert "embedding.position_embeddings.weight" not in shapes  # RoPE
    assert "output_layer.weight" in shapes  # untied
    # the memory estimate counts exactly these parameters
    assert stage_params(cfg.model, 1, 0, 1) == sum(int(torch.tensor(s).prod()) for s in shapes.values())


def test_weight_decay_groups_skip_norms_and_biases(gloo_world):
    from megatron.core.optimizer import OptimizerConfig, _get_param_groups

    from phoenix_hpc.config.memory import stage_params
    from phoenix_hpc.engines.megatron_engine import group_weight_decay
    from phoenix_hpc.engines.megatron_parallel import destroy_parallel_state, init_parallel_state

    init_parallel_state(1, 1, timeout_s=30.0)
    try:
        for model in (dict(LLAMA_TINY), {"layers": 2, "hidden_size": 64, "heads": 4, "seq_length": 32}):
            cfg = job(model=model)
            gpt = _tiny_model(cfg)
            names = {p: n for n, p in gpt.named_parameters()}
            assert stage_params(cfg.model, 1, 0, 1) == sum(p.numel() for p in names)
            # the groups get_megatron_optimizer builds for the engine (no config_overrides: megatron's defaults)
            groups = _get_param_groups([gpt], OptimizerConfig(optimizer="adam", lr=1e-3, weight_decay=0.1), None)
            decay = {names[p]: group_weight_decay(g, 0.1) for g in groups for p in g["params"]}
            assert set(decay) == set(names.values())
            for n, wd in decay.items():
                p = dict(gpt.named_parameters())[n]
                no_decay = p.dim() == 1 or n.endswith(".bias")
                assert wd == (0.0 if no_decay else 0.1), (n, wd)
            assert any(wd == 0.0 for n, wd in decay.items() if "layernorm" in n)
    finally:
        destroy_parallel_state()


def test_group_weight_decay():
    from phoenix_hpc.engines.megatron_engine import group_weight_decay

    assert group_weight_decay({"wd_mult": 0.0}, 0.1) == 0.0
    assert group_weight_decay({"wd_mult": 1.0}, 0.1) == 0.1
    assert group_weight_decay({}, 0.1) == 0.1


# --- the recovery contract -------------------------------------------------------------------------------
def test_megatron_engine_recovers_by_rebuild_and_owns_its_groups():
    from phoenix_hpc.engines.base import Engine
    from phoenix_hpc.engines.megatron_engine import MegatronEngine

    assert MegatronEngine.recovery_style == "rebuild"
    assert MegatronEngine.supported_recovery_styles == ("rebuild",)
    assert MegatronEngine.owns_groups is True
    assert "rebind" not in MegatronEngine.__dict__  # no always-raising rebind of its own
    assert MegatronEngine.teardown is not Engine.teardown
    assert not inspect.isabstract(MegatronEngine)


def test_megatron_engine_without_cuda_raises_before_touching_megatron():
    from phoenix_hpc.engines.base import GridCoord, ProcessGroups
    from phoenix_hpc.engines.megatron_engine import MegatronEngine
    from phoenix_hpc.errors import EngineError

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(EngineError, match="needs CUDA"):
        MegatronEngine(job(), GridCoord(0, 0, 0), ProcessGroups(None, None, None, None, 0), torch.device("cpu"))


def test_teardown_destroys_parallel_state_drops_state_and_is_idempotent(gloo_world):
    """teardown() on an engine whose CUDA parts are stand-ins (its own code runs no collective and needs no
    GPU): parallel state gone, model / optimizer / data dropped, a second call harmless."""
    from megatron.core import parallel_state as ps

    from phoenix_hpc.engines.megatron_engine import MegatronEngine
    from phoenix_hpc.engines.megatron_parallel import groups_and_coord, init_parallel_state

    init_parallel_state(1, 1, timeout_s=30.0)
    e = MegatronEngine.__new__(MegatronEngine)
    e.groups, _ = groups_and_coord(gloo_world, 0)
    e.model, e.optimizer, e.dist_opts, e.samples = torch.nn.Linear(2, 2), object(), [object()], object()
    e.teardown()
    assert not ps.model_parallel_is_initialized()
    assert e.groups is None and e.model is None and e.optimizer is None and e.dist_opts is None and e.samples is None
    e.teardown()
    assert not ps.model_parallel_is_initialized()
