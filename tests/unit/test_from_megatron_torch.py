"""`phoenix config from-megatron --engine torch`: a Megatron-LM Llama-style line becomes a config for the torch
engine (the same model, training, data and parallelism as for engine megatron, without the megatron section),
whose built-in GPT builds on CPU and which `phoenix submit --site local --dry-run` accepts; what the torch engine
cannot train is refused with exit 2, naming the Megatron-LM argument, before anything is written; the default
conversion (engine megatron) is unchanged."""

from __future__ import annotations

import pytest
import torch
import yaml
from click.testing import CliRunner

from phoenix_hpc.cli.main import cli
from phoenix_hpc.config.load import load_job_config
from phoenix_hpc.config.megatron_args import convert
from phoenix_hpc.config.megatron_torch import NO_SUCH_OPTION, ways_note
from phoenix_hpc.engines.torch_gpt import GPTShape, GPTStage

# A Llama-2-style line, small: rotary embeddings, grouped-query attention (2 groups of 4 heads), SwiGLU, RMSNorm,
# no linear biases, an untied head, an FFN size of its own; with performance options of the megatron section
LLAMA = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
         "--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
         "--group-query-attention", "--num-query-groups", "2", "--disable-bias-linear",
         "--untie-embeddings-and-output-weights", "--ffn-hidden-size", "96",
         "--attention-dropout", "0", "--hidden-dropout", "0", "--adam-beta2", "0.95",
         "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "10", "--lr", "1e-3",
         "--lr-warmup-iters", "2", "--vocab-size", "256", "--data-path", "data/ds", "--split", "98,2,0",
         "--eval-iters", "0", "--transformer-impl", "local", "--recompute-activations"]
MEGATRON_OPTIONS = {"--transformer-impl", "--recompute-activations"}


def _invoke(*args):
    return CliRunner().invoke(cli, ["config", "from-megatron", *map(str, args)])


@pytest.fixture
def launch(tmp_path, monkeypatch):
    """tmp_path as the launch folder, holding a byte-level dataset data/ds (vocabulary 256)."""
    from phoenix_hpc.data.prepare import prepare_dataset

    src = tmp_path / "text"
    src.mkdir()
    for i in range(200):
        (src / f"d{i:03d}.py").write_text(f"print('hello world {i}')\n" * 3)
    prepare_dataset(src, tmp_path / "data" / "ds")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_llama_line_converts_for_the_torch_engine_whose_gpt_builds_on_cpu(launch):
    r = _invoke("--engine", "torch", "--nodes", 2, "-o", "job.yaml", "--", *LLAMA)
    assert r.exit_code == 0, r.output
    text = (launch / "job.yaml").read_text()
    data = yaml.safe_load(text)
    assert data["engine"] == "torch" and "megatron" not in data
    # the model, training, data and parallelism are those of the conversion for engine megatron
    r = _invoke("--nodes", 2, "-o", "megatron.yaml", "--", *LLAMA)
    assert r.exit_code == 0, r.output
    mega = yaml.safe_load((launch / "megatron.yaml").read_text())
    assert mega["engine"] == "megatron" and mega["megatron"] == {"transformer_impl": "local",
                                                                 "recompute_granularity": "selective"}
    for section in ("model", "training", "data", "parallelism", "resources"):
        assert data[section] == mega[section], section
    assert data["model"] == {"layers": 2, "hidden_size": 64, "heads": 4, "seq_length": 32, "num_query_groups": 2,
                             "ffn_hidden_size": 96, "position_embedding_type": "rope", "rotary_base": 10000,
                             "activation": "swiglu", "normalization": "RMSNorm", "add_bias_linear": False,
                             "untie_embeddings_and_output_weights": True, "dtype": "float32", "vocab_size": 256}
    # the megatron section's options are listed as not carried over, with why, in the comments and the record
    record = data["converted_from"]["not_carried"]
    for flag in MEGATRON_OPTIONS:
        assert any(line.startswith(flag) and NO_SUCH_OPTION in line for line in record), (flag, record)
        assert any(line.startswith(f"#   {flag}") and NO_SUCH_OPTION in line for line in text.splitlines()), flag
    cfg = load_job_config(launch / "job.yaml")
    assert cfg.engine == "torch" and cfg.parallelism.tp == 1
    # the torch engine's model, as engines/torch_engine.py builds it from the config's model section
    shape = GPTShape(**{f: getattr(cfg.model, f) for f in GPTShape.__dataclass_fields__})
    stage = GPTStage(shape, pp=1, stage=0, seed=cfg.training.seed)
    block = stage.blocks["0"]
    assert isinstance(stage.ln_f, torch.nn.RMSNorm) and not hasattr(stage, "pos_embed")  # RMSNorm, rope
    assert block.qkv.weight.shape == (64 + 2 * 2 * 16, 64) and block.qkv.bias is None  # 2 kv groups of 16
    assert block.fc.weight.shape == (2 * 96, 64) and block.fc_out.weight.shape == (64, 96)  # SwiGLU, ffn 96
    assert stage.head.weight.data_ptr() != stage.tok_embed.weight.data_ptr()  # untied
    logits = stage(torch.randint(0, 256, (2, 32)))
    assert logits.shape == (2, 32, 256) and torch.isfinite(logits).all()


def test_the_converted_torch_config_passes_a_local_dry_run(launch):
    r = _invoke("--engine", "torch", "--nodes", 2, "-o", "job.yaml", "--", *LLAMA)
    assert r.exit_code == 0, r.output
    s = CliRunner().invoke(cli, ["submit", "--site", "local", "job.yaml", "--dry-run", "--run-dir",
                                 str(launch / "run")])
    assert s.exit_code == 0, s.output
    assert "#SBATCH" in s.output


def test_tensor_parallelism_is_refused_naming_the_argument_and_nothing_is_written(launch):
    r = _invoke("--engine", "torch", "-o", "job.yaml", "--", *LLAMA, "--tensor-model-parallel-size", "2")
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    assert ("parallelism.tp (from --tensor-model-parallel-size on the command line): 2 is not supported by engine "
            "torch (allowed: 1") in r.output
    assert "add --tensor-model-parallel-size 1 after --" in r.output and "--engine megatron" in r.output
    assert not (launch / "job.yaml").exists()
    # the way the refusal names: a later --tensor-model-parallel-size 1 wins, as in Megatron-LM
    r = _invoke("--engine", "torch", "-o", "job.yaml", "--", *LLAMA, "--tensor-model-parallel-size", "2",
                "--tensor-model-parallel-size", "1")
    assert r.exit_code == 0, r.output
    assert yaml.safe_load((launch / "job.yaml").read_text())["parallelism"]["tp"] == 1


@pytest.mark.parametrize("change, needles", [
    (lambda a: [w for w in a if w != "--untie-embeddings-and-output-weights"],
     ["model.untie_embeddings_and_output_weights (from --untie-embeddings-and-output-weights, absent: Megatron-LM's "
      "default): False is not supported by engine torch (allowed: True)", "add --untie-embeddings-and-output-weights"]),
    (lambda a: a + ["--fp16"],
     ["model.dtype (from --fp16 on the command line): 'float16' is not supported by engine torch",
      "--bf16 instead of --fp16"]),
    (lambda a: a + ["--tensor-model-parallel-size", "2", "--sequence-parallel"],
     ["parallelism.tp (from --tensor-model-parallel-size on the command line): 2"]),
])
def test_what_the_torch_engine_cannot_train_is_refused_naming_the_argument(launch, change, needles):
    r = _invoke("--engine", "torch", "-o", "job.yaml", "--", *change(list(LLAMA)))
    assert r.exit_code == 2, r.output
    for needle in needles:
        assert needle in r.output, (needle, r.output)
    assert "Traceback" not in r.output and not (launch / "job.yaml").exists()
    assert list(launch.glob("*.yaml")) == [] and list(launch.glob(".*job*")) == []


def test_a_megatron_checkpoint_to_load_is_refused_and_save_writes_phoenix_checkpoints_only(launch):
    (launch / "base").mkdir()
    (launch / "base" / "latest_checkpointed_iteration.txt").write_text("100")
    r = _invoke("--engine", "torch", "-o", "job.yaml", "--", *LLAMA, "--load", "base", "--save", "ck")
    assert r.exit_code == 2 and "--load: 'base' holds a Megatron-LM checkpoint" in r.output, r.output
    assert not (launch / "job.yaml").exists()
    r = _invoke("--engine", "torch", "--nodes", 2, "-o", "job.yaml", "--", *LLAMA, "--load", "ck", "--save", "ck")
    assert r.exit_code == 0, r.output
    data = yaml.safe_load((launch / "job.yaml").read_text())
    assert data["resilience"]["checkpoint"] == {"path": str(launch.resolve() / "ck")}
    assert any(line.startswith("--save 'ck': carried over as resilience.checkpoint.path only")
               for line in data["converted_from"]["not_carried"])
    s = CliRunner().invoke(cli, ["submit", "--site", "local", "job.yaml", "--dry-run", "--run-dir",
                                 str(launch / "run")])
    assert s.exit_code == 0, s.output


def test_the_default_engine_is_megatron_and_its_output_is_unchanged():
    runs = [_invoke(*engine, "--", *LLAMA) for engine in ([], ["--engine", "megatron"])]
    assert [r.exit_code for r in runs] == [0, 0], runs[1].output
    assert runs[0].output == runs[1].output and "engine: megatron" in runs[0].output
    assert convert(LLAMA).config == convert(LLAMA, engine="megatron").config
    assert "save_megatron" in convert(LLAMA + ["--save", "/ck"]).config["resilience"]["checkpoint"]
    r = _invoke("--engine", "tpu", "--", *LLAMA)
    assert r.exit_code == 2 and "'tpu' is not one of 'megatron', 'torch'" in r.output, r.output


def test_the_ways_note_names_only_the_torch_engine_s_refusals():
    assert ways_note(["training.global_batch_size (from --global-batch-size): must be a multiple"]) is None
    note = ways_note(["model.heads (from --num-attention-heads) (6) must be divisible by parallelism.tp (from "
                      "--tensor-model-parallel-size) (4); model.dtype (from --fp16): 'float16' is not supported by "
                      "engine torch (allowed: float32, bfloat16; float16 needs a loss scaler); use engine: megatron"])
    assert "--bf16 instead of --fp16" in note and "--tensor-model-parallel-size 1" not in note


def test_every_argument_of_the_megatron_section_is_listed_for_engine_torch():
    from phoenix_hpc.config.megatron_args import ARGS
    from phoenix_hpc.config.megatron_torch import OPTION_ARGS

    assert set(OPTION_ARGS) == {a.flag for a in ARGS if a.kind == "map" and a.field.startswith("megatron.")}
    extra = ["--attention-backend", "local", "--recompute-granularity", "full", "--sequence-parallel"]
    conv = convert(LLAMA + extra, engine="torch")
    assert "megatron" not in conv.config
    why = {flag: reason for flag, _, reason in conv.not_carried}
    assert {f for f in OPTION_ARGS if why.get(f) == NO_SUCH_OPTION} == set(OPTION_ARGS) - {"--sequence-parallel"}
    assert why["--sequence-parallel"].startswith("Megatron-LM turns sequence parallelism off at "
                                                 "--tensor-model-parallel-size 1")
