"""The Llama-style model options and the ``megatron`` section: what the schema refuses (field, value, allowed),
and the GPU memory estimate (formula terms checked against Korthikanti et al. 2022). `phoenix submit`'s
refusals of engine megatron are in test_submit_cli.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from phoenix_hpc.config.load import load_job_config
from phoenix_hpc.config.memory import GB, estimate_gpu_memory, layer_activation_bytes, stage_params
from phoenix_hpc.config.schema import JobConfig
from phoenix_hpc.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
PERLMUTTER_7B = ROOT / "examples" / "perlmutter-7b.yaml"
VISTA_7B = ROOT / "examples" / "vista-7b.yaml"


def refused(data: dict) -> str:
    with pytest.raises(Exception) as ei:
        JobConfig.model_validate(data)
    return str(ei.value)


def cfg(**over) -> dict:
    d = {"name": "m", "engine": "megatron", "data": {"path": "d"},
         "model": {"layers": 4, "hidden_size": 64, "heads": 8}}
    for k, v in over.items():
        d[k] = {**d.get(k, {}), **v} if isinstance(v, dict) else v
    return d


# --- schema ----------------------------------------------------------------------------------------------
def test_query_groups_must_divide_heads():
    msg = refused(cfg(model={"num_query_groups": 3}))
    assert "model.num_query_groups: 3 must divide model.heads (8)" in msg


def test_query_groups_must_be_divisible_by_tp():
    msg = refused(cfg(model={"num_query_groups": 2}, parallelism={"tp": 4}))
    assert "model.num_query_groups: 2 must be divisible by parallelism.tp (4)" in msg
    JobConfig.model_validate(cfg(model={"num_query_groups": 4}, parallelism={"tp": 4}))


LLAMA_OPTIONS = {"position_embedding_type": "rope", "activation": "swiglu", "normalization": "RMSNorm",
                 "add_bias_linear": False, "num_query_groups": 2, "ffn_hidden_size": 176, "rotary_base": 500000}


def test_torch_engine_takes_the_llama_options_and_refuses_a_tied_head():
    m = JobConfig.model_validate(cfg(engine="torch", model=LLAMA_OPTIONS)).model
    assert (m.position_embedding_type, m.activation, m.normalization, m.add_bias_linear, m.query_groups,
            m.ffn_size) == ("rope", "swiglu", "RMSNorm", False, 2, 176)
    msg = refused(cfg(engine="torch", model={**LLAMA_OPTIONS, "untie_embeddings_and_output_weights": False},
                      megatron={"sequence_parallel": False, "recompute_granularity": "full"}))
    for needle in ("model.untie_embeddings_and_output_weights: False is not supported by engine torch (allowed: "
                   "True); use engine: megatron", "megatron: options are set but engine is torch"):
        assert needle in msg, msg
    assert "rope" not in msg and "swiglu" not in msg and "num_query_groups" not in msg, msg
    # an odd head dimension cannot be rotated in pairs
    msg = refused(cfg(engine="torch", model={"hidden_size": 24, "heads": 8, "position_embedding_type": "rope"}))
    assert "model.position_embedding_type: 'rope' needs an even head dimension" in msg and "= 3" in msg, msg
    JobConfig.model_validate(cfg(engine="torch", model={"hidden_size": 24, "heads": 8}))
    # the defaults are the torch engine's GPT: nothing changes for existing torch configs
    JobConfig.model_validate(cfg(engine="torch", model={"ffn_hidden_size": 256, "num_query_groups": 8}))


def test_a_factory_model_keeps_the_built_in_shape_options_at_their_defaults():
    msg = refused(cfg(engine="torch", model={**LLAMA_OPTIONS, "factory": "pkg.mod:build"}))
    for needle in ("model.position_embedding_type: 'rope' is not supported by engine torch (allowed: "
                   "'learned_absolute'); model.factory builds the model", "model.activation: 'swiglu'",
                   "model.normalization: 'RMSNorm'", "model.add_bias_linear: False", "model.num_query_groups: 2",
                   "model.ffn_hidden_size: 176"):
        assert needle in msg, msg


def test_torch_engine_refuses_float16_and_tensor_parallelism_before_a_rank_does():
    msg = refused(cfg(engine="torch", model={"dtype": "float16"}, parallelism={"tp": 2}))
    assert "model.dtype: 'float16' is not supported by engine torch (allowed: float32, bfloat16;" in msg, msg
    assert "parallelism.tp: 2 is not supported by engine torch (allowed: 1" in msg, msg
    for dtype in ("float32", "bfloat16"):
        JobConfig.model_validate(cfg(engine="torch", model={"dtype": dtype}))
    JobConfig.model_validate(cfg(engine="megatron", model={"dtype": "float16"}, parallelism={"tp": 2}))


@pytest.mark.parametrize("megatron,needle", [
    ({"attention_backend": "flash"}, "megatron.attention_backend: 'flash' needs megatron.transformer_impl: "
                                     "transformer_engine"),
    ({"transformer_impl": "transformer_engine", "attention_backend": "local"}, "'local' needs megatron.transformer_impl: local"),
    ({"recompute_granularity": "some"}, "recompute_granularity"),
    ({"transformer_impl": "te"}, "transformer_impl"),
])
def test_megatron_section_refusals(megatron, needle):
    assert needle in refused(cfg(megatron=megatron))


def test_sequence_parallel_needs_tp():
    assert "megatron.sequence_parallel: true needs parallelism.tp > 1" in refused(cfg(megatron={"sequence_parallel": True}))
    JobConfig.model_validate(cfg(megatron={"sequence_parallel": True}, parallelism={"tp": 2}))


def test_backend_default_follows_the_implementation():
    c = JobConfig.model_validate(cfg())
    assert c.megatron.backend == "local"
    c = JobConfig.model_validate(cfg(megatron={"transformer_impl": "transformer_engine"}))
    assert c.megatron.backend == "auto"


def test_7b_examples_are_the_llama2_7b_shape():
    for path in (PERLMUTTER_7B, VISTA_7B):
        m = load_job_config(path).model
        assert (m.layers, m.hidden_size, m.heads, m.ffn_size, m.vocab_size, m.seq_length) == (
            32, 4096, 32, 11008, 32000, 4096)
        assert (m.position_embedding_type, m.activation, m.normalization, m.add_bias_linear,
                m.untie_embeddings_and_output_weights, m.query_groups) == ("rope", "swiglu", "RMSNorm", False, True, 32)
        total = stage_params(m, 1, 0, 1)
        assert 6.73e9 < total < 6.75e9  # Llama-2-7B: 6,738,415,616 parameters
        assert total == 6_738_415_616


# --- memory estimate ---------------------------------------------------------------------------------------
def test_activation_terms_reproduce_korthikanti_table_2_without_dropout():
    """GPT shape, 16-bit, MHA, GeLU, 4h MLP, unfused attention: the paper's sbh(10 + 24/t + 5as/(ht)) bytes per
    layer, less the 2 sbh of dropout masks (dropout is off here, and the scores are kept once: 2as^2b)."""
    s, b, h, a, t = 512, 2, 256, 8, 2
    c = JobConfig.model_validate(cfg(model={"layers": 4, "hidden_size": h, "heads": a, "seq_length": s,
                                             "dtype": "bfloat16"},
                                      training={"micro_batch_size": b, "global_batch_size": 8},
                                      parallelism={"tp": t}))
    kept, full = layer_activation_bytes(c)
    assert kept == full == s * b * h * (8 + 24 / t) + 2 * a * s * s * b / t
    sel = c.model_copy(update={"megatron": c.megatron.model_copy(update={"recompute_granularity": "selective"})})
    assert layer_activation_bytes(sel)[0] == s * b * h * (8 + 24 / t)  # paper: selective drops the 5as/h term
    sp = sel.model_copy(update={"megatron": sel.megatron.model_copy(update={"sequence_parallel": True})})
    assert layer_activation_bytes(sp)[0] == s * b * h * 32 / t  # paper: 34/t with sequence parallelism
    full_rc = c.model_copy(update={"megatron": c.megatron.model_copy(update={"recompute_granularity": "full"})})
    assert layer_activation_bytes(full_rc)[0] == 2 * s * b * h  # paper: 2sbh per layer


def test_activation_terms_with_dropout_are_korthikanti_table_2():
    """With both dropouts on: the paper's sbh(10 + 24/t + 5as/(ht)) bytes per layer exactly (the masks: 2 sbh
    replicated, as^2b split; the dropped scores 2as^2b); selective recomputation drops the 5as/h term."""
    s, b, h, a, t = 512, 2, 256, 8, 2
    c = JobConfig.model_validate(cfg(model={"layers": 4, "hidden_size": h, "heads": a, "seq_length": s,
                                             "dtype": "bfloat16", "attention_dropout": 0.1, "hidden_dropout": 0.1},
                                      training={"micro_batch_size": b, "global_batch_size": 8},
                                      parallelism={"tp": t}))
    kept, full = layer_activation_bytes(c)
    assert kept == full == s * b * h * (10 + 24 / t) + 5 * a * s * s * b / t
    sel = c.model_copy(update={"megatron": c.megatron.model_copy(update={"recompute_granularity": "selective"})})
    assert layer_activation_bytes(sel)[0] == s * b * h * (10 + 24 / t)
    sp = sel.model_copy(update={"megatron": sel.megatron.model_copy(update={"sequence_parallel": True})})
    assert layer_activation_bytes(sp)[0] == s * b * h * 34 / t  # paper: 34/t with sequence parallelism


def test_estimate_of_the_examples_fits_their_gpus_and_grows_with_the_micro_batch():
    for path, gb in ((PERLMUTTER_7B, 40), (VISTA_7B, 96)):
        c = load_job_config(path)
        est = estimate_gpu_memory(c, dp=8)
        assert est.total < gb * GB
        assert est.grads == 2 * est.weights  # fp32 gradients of bf16 weights
        assert est.optimizer == pytest.approx(12 * est.params / 8)
        bigger = c.model_copy(update={"training": c.training.model_copy(update={"micro_batch_size": 4})})
        assert estimate_gpu_memory(bigger, dp=8).activations == pytest.approx(4 * est.activations)


def test_pipeline_first_stage_holds_pp_micro_batches():
    c = load_job_config(VISTA_7B)  # pp=4, 64 micro-batches per DP rank
    est = estimate_gpu_memory(c, dp=8)
    kept, _ = layer_activation_bytes(c)
    assert est.stage == 0 and est.activations == pytest.approx(kept * 8 * 4)


def test_load_error_is_a_config_error(tmp_path):
    data = yaml.safe_load(PERLMUTTER_7B.read_text())
    data["model"]["num_query_groups"] = 5
    p = tmp_path / "cfg.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError):
        load_job_config(p)
