"""The Llama-style model options and the ``megatron`` section: what the schema refuses (field, value, allowed),
the GPU memory estimate (formula terms checked against Korthikanti et al. 2022), and `phoenix submit`'s
refusals of engine megatron (exit 2, nothing written)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from phoenix_hpc.cli.main import cli
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


def test_torch_engine_refuses_what_its_gpt_does_not_implement():
    msg = refused(cfg(engine="torch", model={"position_embedding_type": "rope", "activation": "swiglu",
                                             "num_query_groups": 2, "ffn_hidden_size": 100},
                      megatron={"sequence_parallel": False, "recompute_granularity": "full"}))
    for needle in ("model.position_embedding_type: 'rope' is not supported by engine torch (allowed: "
                   "'learned_absolute')", "model.activation: 'swiglu'", "model.num_query_groups: 2",
                   "model.ffn_hidden_size: 100", "megatron: options are set but engine is torch"):
        assert needle in msg, msg
    # the defaults are the torch engine's GPT: nothing changes for existing torch configs
    JobConfig.model_validate(cfg(engine="torch", model={"ffn_hidden_size": 256, "num_query_groups": 8}))


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


# --- phoenix submit --------------------------------------------------------------------------------------
def invoke(*args):
    return CliRunner().invoke(cli, ["submit", *map(str, args)])


def write(tmp: Path, src: Path, **changes) -> Path:
    data = yaml.safe_load(src.read_text())
    for section, value in changes.items():
        if isinstance(value, dict):
            data.setdefault(section, {}).update(value)
        else:
            data[section] = value
    p = tmp / "cfg.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def assert_bad(result, *needles):
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for n in needles:
        assert n in result.output, result.output


def test_submit_dry_run_prints_the_memory_estimate(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = invoke("--site", "vista", VISTA_7B, "--dry-run")
    assert r.exit_code == 0, r.output
    assert "# GPU memory per rank, estimated by phoenix_hpc.config.memory (one GPU of this site: 96 GB):" in r.output
    assert "optimizer shard" in r.output and "activations" in r.output
    assert list(tmp_path.iterdir()) == []


def test_submit_refuses_megatron_on_the_local_site(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = write(tmp_path, ROOT / "examples" / "gpt-small.yaml", engine="megatron", data={"path": str(tmp_path / "d")})
    assert_bad(invoke("--site", "local", p, "--dry-run"), "engine: 'megatron' needs real CUDA GPUs",
               "node.gpu_model is null", "allowed here: torch")


def test_submit_refuses_an_unsupported_megatron_core(tmp_path, monkeypatch):
    import phoenix_hpc.engines.megatron_version as mv

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(mv, "installed_version", lambda: "0.12.3")
    assert_bad(invoke("--site", "vista", VISTA_7B, "--dry-run"),
               "engine: 'megatron' does not support the installed megatron-core 0.12.3", ">=0.15,<0.17")
    monkeypatch.setattr(mv, "installed_version", lambda: None)
    assert_bad(invoke("--site", "vista", VISTA_7B, "--dry-run"), "megatron-core, which is not installed here")


@pytest.mark.parametrize("model,parallelism,needle", [
    ({"num_query_groups": 5}, {}, "model.num_query_groups: 5 must divide model.heads (32)"),
    ({"num_query_groups": 2}, {"tp": 4}, "model.num_query_groups: 2 must be divisible by parallelism.tp (4)"),
    ({"normalization": "BatchNorm"}, {}, "normalization"),
    ({"position_embedding_type": "alibi"}, {}, "position_embedding_type"),
])
def test_submit_refuses_llama_options_megatron_cannot_build(tmp_path, monkeypatch, model, parallelism, needle):
    monkeypatch.chdir(tmp_path)
    p = write(tmp_path, PERLMUTTER_7B, model=model, parallelism=parallelism)
    assert_bad(invoke("--site", "perlmutter", p, "--dry-run"), needle)


def test_submit_refuses_a_config_that_cannot_fit(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = write(tmp_path, PERLMUTTER_7B, training={"micro_batch_size": 8, "global_batch_size": 512},
              megatron={"transformer_impl": "local", "attention_backend": None, "sequence_parallel": False,
                        "recompute_granularity": "none"})
    r = invoke("--site", "perlmutter", p, "--dry-run")
    assert_bad(r, "GPU memory: a rank needs about", "more than the 40 GB of one A100-40GB",
               "megatron.recompute_granularity: full", "megatron.sequence_parallel: true")
    assert list(tmp_path.iterdir()) == [p]


def test_load_error_is_a_config_error(tmp_path):
    p = write(tmp_path, PERLMUTTER_7B, model={"num_query_groups": 5})
    with pytest.raises(ConfigError):
        load_job_config(p)
