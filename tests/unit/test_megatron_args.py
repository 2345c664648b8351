"""`phoenix config from-megatron`: a Megatron-LM pretrain_gpt.py argument list becomes a job config; every
argument not carried over is listed with why; one that changes the training is refused (exit 2, nothing
written) unless dropped, and a dropped one is written into the config as a comment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from phoenix_hpc.cli.from_megatron import read_vocab, relocate_paths
from phoenix_hpc.cli.main import cli
from phoenix_hpc.config.megatron_args import (ARGS, convert, markdown_table, padded_vocab, split_args_text,
                                              swiglu_ffn, warmup_steps_of_fraction)
from phoenix_hpc.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]

# The Llama-2-7B shape of examples/perlmutter-7b.yaml as a Megatron-LM launch script writes it.
LLAMA_SCRIPT = r"""
# Llama-2-7B, launched as: torchrun ... pretrain_gpt.py "${GPT_MODEL_ARGS[@]}" ...
GPT_MODEL_ARGS=(
    --num-layers 32 --hidden-size 4096 --num-attention-heads 32 --ffn-hidden-size 11008
    --seq-length 4096 --max-position-embeddings 4096   # RoPE
    --position-embedding-type rope --swiglu --normalization RMSNorm --disable-bias-linear
    --untie-embeddings-and-output-weights --attention-dropout 0.0 --hidden-dropout 0.0
)
TRAINING_ARGS=(
    --micro-batch-size 1 --global-batch-size 512 --train-iters 2800 \
    --lr 3.0e-4 --min-lr 3.0e-5 --lr-decay-style cosine --lr-warmup-iters 280
    --weight-decay 0.1 --clip-grad 1.0 --adam-beta1 0.9 --adam-beta2 0.95 --bf16
    --use-distributed-optimizer --overlap-grad-reduce --seed 1234
)
MODEL_PARALLEL_ARGS=( --tensor-model-parallel-size 4 --pipeline-model-parallel-size 2 --sequence-parallel
    --transformer-impl transformer_engine --recompute-granularity selective )
DATA_ARGS=( --data-path ds --split 949,50,1 --tokenizer-type Llama2Tokenizer
    --tokenizer-model /nonexistent/tokenizer.model --vocab-size 32000 )
LOGGING_ARGS=( --log-interval 10 --save-interval 1000 --eval-interval 1000 --eval-iters 10 --tensorboard-dir tb )
"""

SMALL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
         "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "10", "--lr", "1e-3",
         "--data-path", "ds", "--vocab-size", "256"]
ZERO = ["--attention-dropout", "0", "--hidden-dropout", "0", "--adam-beta2", "0.95"]


def problems(tokens, **kw) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        convert(tokens, **kw)
    return exc.value.problems


def test_the_llama_script_gives_the_perlmutter_example_model_and_training():
    conv = convert(split_args_text(LLAMA_SCRIPT)[0], nodes=16, spares=2)
    cfg, example = conv.config, yaml.safe_load((ROOT / "examples" / "perlmutter-7b.yaml").read_text())
    want_model = dict(example["model"], vocab_size=32256)  # 32000 padded to a multiple of 128 x tp 4
    assert want_model.pop("num_query_groups") == want_model["heads"]  # MHA: Megatron-LM without GQA, null here
    assert cfg["model"] == want_model
    assert {k: cfg["training"][k] for k in example["training"]} == example["training"]
    assert cfg["parallelism"] == {"tp": 4, "pp": 2}
    assert cfg["megatron"] == {"transformer_impl": "transformer_engine", "sequence_parallel": True,
                               "recompute_granularity": "selective"}
    assert cfg["resources"] == {"nodes": 16, "spares": 2}
    assert cfg["resilience"] == {"checkpoint": {"interval_steps": 1000}}
    assert cfg["data"] == {"blend": [{"path": "ds"}], "split": "949,50,1"}
    skipped = {flag for flag, _, _ in conv.not_carried}
    assert skipped == {"--use-distributed-optimizer", "--overlap-grad-reduce"}
    assert (cfg["training"]["eval_interval"], cfg["training"]["eval_iters"]) == (1000, 10)
    assert cfg["logging"] == {"tensorboard": True, "tensorboard_dir": "tb"}
    assert {flag for flag, _ in conv.records} == {"--max-position-embeddings", "--tokenizer-type",
                                                  "--tokenizer-model"}
    assert any("32256" in n for n in conv.notes)


def test_megatron_defaults_that_change_the_training_are_refused_by_name():
    out = problems(SMALL)
    line = next(p for p in out if p.startswith("--adam-beta2"))
    assert "0.999" in line and "default when absent" in line and "--drop adam-beta2" in line
    assert len(out) == 1, out


def test_dropout_carries_over_with_megatrons_default_when_absent():
    cfg = convert(SMALL + ["--adam-beta2", "0.95"]).config
    assert (cfg["model"]["attention_dropout"], cfg["model"]["hidden_dropout"]) == (0.1, 0.1)
    cfg = convert(SMALL + ["--adam-beta2", "0.95", "--hidden-dropout", "0.2", "--attention-dropout", "0"]).config
    assert cfg["model"]["hidden_dropout"] == 0.2 and "attention_dropout" not in cfg["model"]
    assert any(p.startswith("--hidden-dropout: 1.0") and "0 <= p < 1" in p
               for p in problems(SMALL + ZERO[:2] + ["--hidden-dropout", "1.0", "--adam-beta2", "0.95"]))


def test_dropped_arguments_are_kept_as_comments_and_listed():
    conv = convert(SMALL + ZERO[:4], drop=("adam-beta2",))
    assert [f for f, _, _ in conv.dropped] == ["--adam-beta2"]
    from phoenix_hpc.cli.from_megatron import render

    text = render(conv)
    assert "# DROPPED although they change the training" in text
    assert "--adam-beta2 0.999" in text
    assert yaml.safe_load(text)["model"]["layers"] == 2


@pytest.mark.parametrize("extra, needle", [
    (["--num-experts", "8"], "--num-experts: 8"),
    (["--data-path", "30", "a", "b", "c"], "mixes weights and prefixes"),
    (["--data-path", "0.3", "a", "b"], "'0.3' would be read as a dataset prefix"),
    (["--dataloader-type", "cyclic"], "--dataloader-type: 'cyclic'"),
    (["--foo", "3"], "--foo: not known to phoenix"),
    (["--lr-decay-style", "WSD"], "--lr-decay-style: 'WSD'"),
    (["--lr-decay-iters", "0"], "--lr-decay-iters: 0 (allowed: a positive number of iterations)"),
    (["--init-method-std", "0"], "--init-method-std: 0.0 (allowed: a finite number > 0)"),
    (["--init-method-std", "-0.02"], "--init-method-std: -0.02 (allowed: a finite number > 0)"),
    (["--lr-warmup-iters", "3", "--lr-decay-iters", "2"],
     "--lr-decay-iters: 2 is shorter than the 3 warm-up iterations (allowed: > 3"),
    (["--kv-channels", "32"], "--kv-channels: 32"),
    (["--bf16", "--fp16"], "--bf16 and --fp16"),
    (["--max-position-embeddings", "16"], "--max-position-embeddings: 16"),
    (["--finetune"], "--finetune"),
    (["--no-load-optim"], "--no-load-optim"),
    (["--ckpt-format", "torch_dcp"], "--ckpt-format: 'torch_dcp'"),
])
def test_unsupported_arguments_are_refused_naming_them(extra, needle):
    out = problems(SMALL + ZERO + extra)
    assert any(needle in p for p in out), out


def test_dropping_an_argument_that_is_carried_over_is_refused():
    out = problems(SMALL + ZERO, drop=("lr",))
    assert any(p.startswith("--drop lr: --lr is carried over") for p in out), out


@pytest.mark.parametrize("given", [["--frobnicate=7"], ["--frobnicate", "7"], ["--num-experts=8"]])
def test_an_argument_is_dropped_as_its_refusal_says_in_either_form(given):
    flag = given[0].split("=", 1)[0]
    advice = f"--drop {flag.lstrip('-')} to go on without it"
    assert any(p.startswith(flag) and advice in p for p in problems(SMALL + ZERO + given))
    conv = convert(SMALL + ZERO + given, drop=(flag.lstrip("-"),))
    assert [f for f, _, _ in conv.dropped] == [flag]


@pytest.mark.parametrize("given, shown", [
    (["--moe-router-topk", "2"], "--moe-router-topk 2"),
    (["--frobnicate", "3", "4", "5"], "--frobnicate 3 4 5"),
    (["--frobnicate", "-3", "x y"], "--frobnicate -3 'x y'"),
    (["--frobnicate=7"], "--frobnicate=7"),
    (["--frobnicate"], "--frobnicate"),
    (["--frobnicate", "a\nb"], "--frobnicate 'a\\nb'"),
    (["--num-experts", "8"], "--num-experts 8"),
    (["--rampup-batch-size", "32", "32", "1000"], "--rampup-batch-size 32 32 1000"),
    (["--finetune"], "--finetune"),
    (["--adam-beta2", "0.98"], "--adam-beta2 0.98"),
])
def test_a_dropped_argument_is_recorded_exactly_as_given(given, shown):
    from phoenix_hpc.cli.from_megatron import render

    flag = given[0].split("=", 1)[0]
    tokens = SMALL + (ZERO[:4] if flag == "--adam-beta2" else ZERO) + given
    conv = convert(tokens, drop=(flag.lstrip("-"),))
    assert [f for f, _, _ in conv.dropped] == [flag]
    text = render(conv)
    assert f"\n#   {shown}: " in text, text
    assert yaml.safe_load(text)["model"]["layers"] == 2  # the comment is one line, whatever the value holds
    r = _invoke("--drop", flag.lstrip("-"), "--", *tokens)
    assert r.exit_code == 0 and f"dropped: {shown}: " in r.output, r.output


def test_an_unknown_arguments_values_are_its_own_not_stray_and_strays_are_still_refused():
    assert any(p.startswith("--frobnicate: not known to phoenix (given as --frobnicate 3 4 5)")
               for p in problems(SMALL + ZERO + ["--frobnicate", "3", "4", "5"]))
    out = problems(SMALL + ZERO + ["--num-layers", "2", "9"] + ["--frobnicate", "3"], drop=("frobnicate",))
    assert out == ["Megatron-LM arguments: '9' follows no argument (allowed: values after their argument)"]


def test_dropping_a_carried_over_argument_given_as_flag_equals_value_is_refused():
    out = problems(SMALL[:-2] + ZERO + ["--vocab-size=256"], drop=("vocab-size",))
    assert any(p.startswith("--drop vocab-size: --vocab-size is carried over") for p in out), out


def test_a_missing_required_argument_and_global_batch_are_named():
    pairs = list(zip(SMALL[::2], SMALL[1::2]))
    tokens = [t for f, v in pairs if f not in ("--lr", "--global-batch-size") for t in (f, v)] + ZERO
    out = problems(tokens)
    assert any(p.startswith("--lr: missing") for p in out), out
    assert any(p.startswith("--global-batch-size: missing") for p in out), out


def test_an_argument_that_does_not_parse_is_refused():
    out = problems(SMALL + ZERO + ["--num-layers", "two"])
    assert "--num-layers" in out[0] and "two" in out[0]


@pytest.mark.parametrize("words, blend", [
    (["a"], [{"path": "a"}]),
    (["a", "b"], [{"path": "a"}, {"path": "b"}]),
    (["0.3", "a", "0.7", "b"], [{"path": "a", "weight": 0.3}, {"path": "b", "weight": 0.7}]),
    (["a", "b", "c"], [{"path": "a"}, {"path": "b"}, {"path": "c"}]),
])
def test_data_path_becomes_a_blend_as_megatron_core_reads_it(words, blend):
    tokens = [t for f, v in zip(SMALL[::2], SMALL[1::2]) if f != "--data-path" for t in (f, v)]
    conv = convert(tokens + ZERO + ["--data-path", *words])
    assert conv.config["data"] == {"blend": blend}


def test_derived_values_are_megatron_lms():
    assert swiglu_ffn(4096) == 10880  # int(4 x 4096 x 2/3 / 64) x 64; Llama-2 passes 11008 explicitly
    assert padded_vocab(50257, 128, 1) == 50304 and padded_vocab(32000, 128, 4) == 32256
    conv = convert(SMALL + ZERO + ["--swiglu", "--lr-warmup-fraction", "0.2", "--use-rotary-position-embeddings"])
    assert conv.config["model"]["ffn_hidden_size"] == swiglu_ffn(64)
    assert conv.config["model"]["activation"] == "swiglu"
    assert conv.config["model"]["position_embedding_type"] == "rope"
    assert conv.config["training"]["warmup_steps"] == 2  # 0.2 x 10 decay steps
    assert warmup_steps_of_fraction(0.29, 100) == 29  # 0.29 x 100 == 28.999999999999996 in floating point
    assert warmup_steps_of_fraction(0.07, 800) == 56 and warmup_steps_of_fraction(0.2, 10) == 2
    assert warmup_steps_of_fraction(0.25, 10) is None  # 2.5 iterations: no whole number of steps
    assert conv.config["training"]["lr_schedule"] == "linear"  # Megatron-LM's default decay
    assert conv.config["model"]["untie_embeddings_and_output_weights"] is False  # Megatron-LM ties by default


def test_a_decay_over_fewer_iterations_than_the_run_is_carried_over():
    """Megatron-LM's GPT-3 example decays over 430000 of 500000 iterations: --lr-decay-iters is
    training.lr_decay_steps, and a --lr-warmup-fraction is of the decay iterations, as Megatron-LM computes it."""
    from phoenix_hpc.cli.from_megatron import render
    from phoenix_hpc.config.schema import JobConfig

    conv = convert(SMALL + ZERO + ["--lr-decay-iters", "8", "--lr-warmup-iters", "2"])
    assert ("--lr-decay-iters", "training.lr_decay_steps", 8) in conv.carried
    t = JobConfig.model_validate(yaml.safe_load(render(conv))).training
    assert (t.steps, t.warmup_steps, t.lr_decay_steps, t.decay_steps) == (10, 2, 8, 8)
    conv = convert(SMALL + ZERO + ["--lr-decay-iters", "20", "--lr-warmup-fraction", "0.25"])
    assert conv.config["training"]["lr_decay_steps"] == 20
    assert conv.config["training"]["warmup_steps"] == 5  # 0.25 x 20 decay iterations, not x 10 train iterations
    assert "lr_decay_steps" not in convert(SMALL + ZERO).config["training"]  # absent: training.steps


def test_init_method_std_is_carried_over():
    """Megatron-LM's Llama-3 example initialises with 0.0134, GPT-3's with 0.006: model.init_method_std."""
    from phoenix_hpc.cli.from_megatron import render
    from phoenix_hpc.config.schema import JobConfig

    conv = convert(SMALL + ZERO + ["--init-method-std", "0.0134"])
    assert ("--init-method-std", "model.init_method_std", 0.0134) in conv.carried
    assert JobConfig.model_validate(yaml.safe_load(render(conv))).model.init_method_std == 0.0134
    cfg = convert(SMALL + ZERO).config  # absent: Megatron-LM's 0.02, phoenix's default, not written
    assert "init_method_std" not in cfg["model"] and JobConfig.model_validate(cfg).model.init_method_std == 0.02


def test_a_warmup_fraction_of_no_whole_number_of_steps_is_refused_naming_the_argument():
    with pytest.raises(ConfigError) as exc:
        convert(SMALL + ZERO + ["--lr-warmup-fraction", "0.25"])  # of 10 decay iterations: 2.5
    (line,) = [p for p in exc.value.problems if p.startswith("--lr-warmup-fraction")]
    assert "0.25 of 10 decay iterations is 2.5 warm-up iterations" in line and "--lr-warmup-iters N" in line


def test_a_fragment_gives_its_arrays_and_option_lines_in_order():
    text = ("GPUS_PER_NODE=4\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\nA=(--num-layers 2 # two\n  --lr 1)\n"
            "--seq-length 8 \\\n  --bf16\nA+=( --lr 2 )\n")
    args, left = split_args_text(text)
    assert args == ["--num-layers", "2", "--lr", "1", "--lr", "2", "--seq-length", "8", "--bf16"]
    assert left == ["GPUS_PER_NODE=4", "export CUDA_DEVICE_MAX_CONNECTIONS=1"]


def test_a_launch_script_gives_its_command_with_the_arrays_expanded():
    text = """
MODEL_ARGS=( --num-layers 2 --hidden-size 64 )
OPT_ARGS=( --lr 9e-9 )      # defined, not passed: not an argument
TRAIN=(
    --lr 3e-4
)
srun -N 4 python pretrain_gpt.py "${MODEL_ARGS[@]}" ${TRAIN[@]} --bf16 2>&1 | tee log.txt
echo done
"""
    args, left = split_args_text(text)
    assert args == ["--num-layers", "2", "--hidden-size", "64", "--lr", "3e-4", "--bf16"]
    assert left == ["echo done"]


@pytest.mark.parametrize("text, needle", [
    ("--data-path $DATA", "'$DATA' holds a shell variable"),
    ("python pretrain_gpt.py ${NOPE[@]}", "'${NOPE[@]}' holds a shell variable"),
    ("--save $(pwd)/ckpt", "holds a shell variable"),
    ("A=( --lr 1\n--bf16\n", "A=( is never closed"),
    ("--name 'unclosed", "cannot split as shell words"),
])
def test_args_text_refuses_what_it_cannot_know(text, needle):
    with pytest.raises(ConfigError) as exc:
        split_args_text(text)
    assert needle in str(exc.value), str(exc.value)


def test_vocabulary_read_from_tokenizer_files(tmp_path):
    (tmp_path / "vocab.json").write_text(json.dumps({"a": 0, "b": 1, "c": 2}))
    assert read_vocab({"--vocab-file": str(tmp_path / "vocab.json")}) == 3
    (tmp_path / "tokenizer.json").write_text(json.dumps(
        {"model": {"vocab": {"a": 0, "b": 1}}, "added_tokens": [{"id": 5, "content": "<s>"}]}))
    assert read_vocab({"--tokenizer-model": str(tmp_path)}) == 6
    assert read_vocab({"--tokenizer-model": str(tmp_path / "missing.model")}) is None
    conv = convert(SMALL[:-2] + ZERO +
                   ["--vocab-file", str(tmp_path / "vocab.json")], read_vocab=read_vocab)
    assert conv.config["model"]["vocab_size"] == 128  # 3 padded to a multiple of 128


def test_relative_paths_name_the_same_files(tmp_path):
    cfg = {"data": {"blend": [{"path": "data/ds"}]},
           "resilience": {"checkpoint": {"path": "ckpt", "save_megatron": "ckpt", "load_megatron": "base"}}}
    relocate_paths(cfg, tmp_path / "out" / "job.yaml", tmp_path / "launch")
    got = (tmp_path / "out" / cfg["data"]["blend"][0]["path"]).resolve()
    assert got == (tmp_path / "launch" / "data" / "ds").resolve()
    ck = cfg["resilience"]["checkpoint"]
    assert ck["path"] == ck["save_megatron"] == str((tmp_path / "launch" / "ckpt").resolve())
    assert ck["load_megatron"] == str((tmp_path / "launch" / "base").resolve())


def test_load_and_save_map_to_the_megatron_checkpoint_fields():
    conv = convert(SMALL + ZERO + ["--load", "/lustre/base", "--save", "/lustre/run", "--no-load-rng"],
                   has_tracker=lambda folder: folder == "/lustre/base")
    ck = conv.config["resilience"]["checkpoint"]
    assert ck == {"path": "/lustre/run", "save_megatron": "/lustre/run", "load_megatron": "/lustre/base"}
    assert ("--load", "resilience.checkpoint.load_megatron", "/lustre/base") in conv.carried
    assert any(flag == "--no-load-rng" for flag, _, _ in conv.not_carried)


@pytest.mark.parametrize("save, load", [("/lustre/ckpt", "/lustre/ckpt"), ("/lustre/ckpt/", "/lustre/ckpt"),
                                         ("ckpt", "./ckpt")])
def test_megatrons_auto_resume_idiom_starts_from_scratch_and_says_so(save, load):
    # --save DIR --load DIR with no tracker in DIR yet: Megatron-LM's load_checkpoint warns and starts at
    # iteration 0; the first run of such a script must be submittable
    conv = convert(SMALL + ZERO + ["--save", save, "--load", load], has_tracker=lambda folder: False)
    ck = conv.config["resilience"]["checkpoint"]
    assert ck == {"path": save, "save_megatron": save}
    (why,) = [w for f, v, w in conv.not_carried if f == "--load" and v == load]
    assert "auto-resume" in why and "from scratch" in why and "phoenix submit --resume" in why
    assert "save_megatron" in why


def test_a_load_folder_with_megatrons_tracker_is_loaded_also_when_it_is_the_save_folder():
    conv = convert(SMALL + ZERO + ["--save", "/lustre/ckpt", "--load", "/lustre/ckpt"],
                   has_tracker=lambda folder: True)
    assert conv.config["resilience"]["checkpoint"]["load_megatron"] == "/lustre/ckpt"
    assert not any(f == "--load" for f, _, _ in conv.not_carried)


@pytest.mark.parametrize("extra", [["--load", "/lustre/base", "--save", "/lustre/run"], ["--load", "/lustre/base"]])
def test_a_load_folder_without_megatrons_tracker_other_than_save_is_refused(extra):
    out = problems(SMALL + ZERO + extra, has_tracker=lambda folder: False)
    (p,) = [p for p in out if p.startswith("--load")]
    assert p.startswith("--load: '/lustre/base' holds no latest_checkpointed_iteration.txt") and "allowed:" in p
    assert out == problems(SMALL + ZERO + extra)  # nothing read: no tracker found


@pytest.mark.parametrize("flag", ["--save", "--load", "--tensorboard-dir"])
def test_an_empty_folder_argument_is_refused_not_read_as_the_launch_folder(flag):
    # relocate_paths would join '' to the launch folder: the checkpoint or event files would land there
    assert f"{flag}: '' (allowed: a non-empty path)" in problems(SMALL + ZERO + [f"{flag}="])


def test_every_argument_is_in_the_docs_table():
    doc = (ROOT / "docs" / "megatron-args.md").read_text()
    assert markdown_table() in doc
    assert len({a.flag for a in ARGS}) == len(ARGS)


def _invoke(*args):
    return CliRunner().invoke(cli, ["config", "from-megatron", *map(str, args)])


def test_cli_refusal_exits_2_and_writes_nothing(tmp_path):
    out = tmp_path / "job.yaml"
    r = _invoke("-o", out, "--", *SMALL)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and "--adam-beta2" in r.output
    assert not out.exists() and list(tmp_path.iterdir()) == []


def _prepared_launch(tmp_path, monkeypatch, extra: str = "") -> None:
    """tmp_path as a launch folder: a dataset data/ds and args.sh, the Llama script reading it (+ extra)."""
    from phoenix_hpc.data.prepare import prepare_dataset

    src = tmp_path / "text"
    src.mkdir()
    for i in range(1000):  # documents enough for every part of --split 949,50,1 (0.1 % of 1000: one)
        (src / f"d{i:04d}.py").write_text(f"print('hello world {i}')\n" * 3)
    prepare_dataset(src, tmp_path / "data" / "ds")
    (tmp_path / "args.sh").write_text(LLAMA_SCRIPT.replace("--data-path ds", "--data-path data/ds") + extra)
    monkeypatch.chdir(tmp_path)


def test_cli_writes_a_config_that_submit_accepts(tmp_path, monkeypatch):
    _prepared_launch(tmp_path, monkeypatch)
    (tmp_path / "cfg").mkdir()
    r = _invoke("--args-file", "args.sh", "--nodes", 16, "--spares", 2, "-o", "cfg/job.yaml")
    assert r.exit_code == 0, r.output
    assert "not carried over: --use-distributed-optimizer" in r.output
    from phoenix_hpc.config.load import load_job_config

    cfg = load_job_config(tmp_path / "cfg" / "job.yaml")
    assert (cfg.training.eval_interval, cfg.training.eval_iters) == (1000, 10)
    assert cfg.logging.tensorboard and cfg.logging.tensorboard_dir == str((tmp_path / "tb").resolve())
    assert cfg.data.prefixes == [str((tmp_path / "data" / "ds").resolve())]
    s = CliRunner().invoke(cli, ["submit", "--site", "perlmutter", "cfg/job.yaml", "--dry-run", "--run-dir",
                                 str(tmp_path / "run")])
    assert s.exit_code == 0, s.output
    assert "#SBATCH" in s.output


def test_cli_a_converted_auto_resume_script_is_submittable_and_a_written_tracker_is_loaded(tmp_path, monkeypatch):
    _prepared_launch(tmp_path, monkeypatch, "CKPT_ARGS=( --save ckpt --load ckpt )\n")
    r = _invoke("--args-file", "args.sh", "--nodes", 16, "--spares", 2, "-o", "job.yaml")
    assert r.exit_code == 0, r.output
    assert "not carried over: --load 'ckpt': the same folder as --save" in r.output
    assert "#   --load 'ckpt': the same folder as --save" in (tmp_path / "job.yaml").read_text()
    ck = yaml.safe_load((tmp_path / "job.yaml").read_text())["resilience"]["checkpoint"]
    assert "load_megatron" not in ck and ck["save_megatron"] == str(tmp_path.resolve() / "ckpt")
    s = CliRunner().invoke(cli, ["submit", "--site", "perlmutter", "job.yaml", "--dry-run", "--run-dir",
                                 str(tmp_path / "run")])
    assert s.exit_code == 0, s.output
    (tmp_path / "ckpt").mkdir()  # an earlier Megatron-LM run wrote a checkpoint there: this job starts from it
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("100")
    r = _invoke("--args-file", "args.sh", "--nodes", 16, "--spares", 2, "-o", "job.yaml")
    assert r.exit_code == 0, r.output
    ck = yaml.safe_load((tmp_path / "job.yaml").read_text())["resilience"]["checkpoint"]
    assert ck["load_megatron"] == str(tmp_path.resolve() / "ckpt")


def test_cli_submit_data_on_cluster_covers_a_load_folder_not_here(tmp_path, monkeypatch):
    _prepared_launch(tmp_path, monkeypatch, "CKPT_ARGS=( --save ckpt --load base )\n")
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "latest_checkpointed_iteration.txt").write_text("100")
    r = _invoke("--args-file", "args.sh", "--nodes", 16, "--spares", 2, "-o", "job.yaml")
    assert r.exit_code == 0, r.output
    data = yaml.safe_load((tmp_path / "job.yaml").read_text())
    data["resilience"]["checkpoint"]["load_megatron"] = "/pscratch/sd/u/user/base"  # only the cluster sees it
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(data))
    submit = ["submit", "--site", "perlmutter", "job.yaml", "--dry-run", "--run-dir", str(tmp_path / "run")]
    s = CliRunner().invoke(cli, submit)
    assert s.exit_code == 2 and "resilience.checkpoint.load_megatron: /pscratch/sd/u/user/base is not a directory" \
        in s.output, s.output
    s = CliRunner().invoke(cli, [*submit, "--data-on-cluster"])
    assert s.exit_code == 0, s.output
    assert "#SBATCH" in s.output and ("resilience.checkpoint.load_megatron: /pscratch/sd/u/user/base is not a "
                                      "directory here") in s.output and "not checked" in s.output


def test_cli_a_load_folder_without_tracker_is_refused_naming_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "base").mkdir()
    r = _invoke("-o", "job.yaml", "--", *SMALL, *ZERO, "--load", "base", "--save", "run")
    assert r.exit_code == 2 and "--load: 'base' holds no latest_checkpointed_iteration.txt" in r.output, r.output
    assert not (tmp_path / "job.yaml").exists()


def _eval_and_logging(extra):
    conv = convert(SMALL + ZERO + extra)
    return conv.config["training"], conv.config.get("logging"), {f: why for f, _, why in conv.not_carried}


def test_evaluation_is_megatrons_effective_one():
    training, logging, _ = _eval_and_logging([])  # defaults: every 1000 iterations, 100 batches, split 969,30,1
    assert (training["eval_interval"], training["eval_iters"]) == (1000, 100)
    assert logging is None
    training, _, skipped = _eval_and_logging(["--eval-iters", "0", "--eval-interval", "5"])
    assert "eval_interval" not in training and "eval_iters" not in training
    assert "--eval-iters is 0" in skipped["--eval-iters"] and "--eval-iters is 0" in skipped["--eval-interval"]
    training, _, skipped = _eval_and_logging(["--split", "100,0,0", "--eval-iters", "7"])
    assert "eval_interval" not in training and "validation part" in skipped["--eval-iters"]
    assert any("--eval-iters: -1" in p for p in problems(SMALL + ZERO + ["--eval-iters", "-1"]))


def test_tensorboard_and_wandb_are_carried_over_as_megatron_turns_them_on():
    _, logging, _ = _eval_and_logging(["--tensorboard-dir", "runs/tb", "--wandb-project", "p",
                                       "--wandb-exp-name", "n"])
    assert logging == {"tensorboard": True, "tensorboard_dir": "runs/tb", "wandb": {"project": "p", "name": "n"}}
    _, logging, skipped = _eval_and_logging(["--wandb-exp-name", "n"])
    assert logging is None and "--wandb-project" in skipped["--wandb-exp-name"]


def test_the_llama3_example_s_performance_and_profiling_arguments_are_listed_not_refused():
    # the words of Megatron-LM's examples/llama/train_llama3_8b_h100_fp8.sh that do not change what is trained
    perf = ["--manual-gc-interval", "100", "--empty-unused-memory-level", "1", "--cross-entropy-loss-fusion",
            "--use-nccl-ub", "--no-mmap-bin-files", "--profile-step-start", "4", "--profile-step-end", "6",
            "--profile-ranks", "0", "1", "--log-params-norm", "--logging-level", "20", "--record-memory-history",
            "--memory-snapshot-path", "s.pickle", "--tiktoken-pattern", "v2"]
    conv = convert(SMALL + ZERO + perf)
    listed = {flag for flag, _, _ in conv.not_carried} | {flag for flag, _ in conv.records}
    assert {w for w in perf if w.startswith("--")} <= listed
    assert ("--tiktoken-pattern", "v2") in conv.records


@pytest.mark.parametrize("words, why", [
    (["--fp8-format", "hybrid"], "fp8 training is not implemented"),
    (["--grad-reduce-in-bf16"], "reduces gradients in fp32"),
    (["--calculate-per-token-loss"], "phoenix's loss"),
    (["--decoupled-lr", "5e-4"], "input and output layers"),
])
def test_arguments_that_change_the_training_are_refused_with_why(words, why):
    (line,) = [p for p in problems(SMALL + ZERO + words) if p.startswith(words[0])]
    assert why in line and f"--drop {words[0][2:]}" in line


def test_exit_on_missing_checkpoint_refuses_the_auto_resume_idiom_and_changes_nothing_with_a_checkpoint():
    idiom = SMALL + ZERO + ["--save", "/lustre/ckpt", "--load", "/lustre/ckpt", "--exit-on-missing-checkpoint"]
    (p,) = [p for p in problems(idiom, has_tracker=lambda folder: False)
            if p.startswith("--exit-on-missing-checkpoint")]
    assert "Megatron-LM would exit instead of training" in p and "'/lustre/ckpt'" in p
    conv = convert(idiom, has_tracker=lambda folder: True)
    assert conv.config["resilience"]["checkpoint"]["load_megatron"] == "/lustre/ckpt"
    assert any(f == "--exit-on-missing-checkpoint" for f, _, _ in conv.not_carried)


def test_a_step_batch_size_schedule_is_refused_as_given():
    words = ["--step-batch-size-schedule", "0:16", "2.4B:320"]
    (p,) = [p for p in problems(SMALL + ZERO + words) if p.startswith("--step-batch-size-schedule")]
    assert "ramp-up is not implemented" in p
    conv = convert(SMALL + ZERO + words, drop=["step-batch-size-schedule"])
    assert [v for f, v, _ in conv.dropped if f == "--step-batch-size-schedule"] == [tuple(words)]


def _without_data_path(words):
    i = words.index("--data-path")
    return words[:i] + words[i + 2:]


def test_data_args_path_gives_the_blend_as_data_path_would():
    base = _without_data_path(SMALL) + ZERO
    files = {"blend.txt": "0.3 /d/a_text_document\n0.7\t/d/b_text_document\n", "empty.txt": "  \n"}
    conv = convert(base + ["--data-args-path", "blend.txt"], read_data_args=lambda p: files[p].split())
    want = convert(base + ["--data-path", "0.3", "/d/a_text_document", "0.7", "/d/b_text_document"])
    assert conv.config["data"] == want.config["data"]
    assert ("--data-args-path", "data.blend", want.config["data"]["blend"]) in conv.carried
    out = problems(base + ["--data-args-path", "nope.txt"], read_data_args=lambda p: None)
    assert any(p.startswith("--data-args-path: 'nope.txt' cannot be read here") for p in out)
    assert not any(p.startswith("--data-path: missing") for p in out)
    out = problems(base + ["--data-args-path", "empty.txt"], read_data_args=lambda p: files[p].split())
    assert any("holds no word" in p for p in out)
    out = problems(SMALL + ZERO + ["--data-args-path", "blend.txt"], read_data_args=lambda p: files[p].split())
    assert any(p.startswith("--data-path and --data-args-path: both given") for p in out)


def test_cli_reads_a_data_args_path_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "blend.txt").write_text("40 data/a_text_document 60 data/b_text_document\n")
    r = _invoke("-o", "job.yaml", "--", *_without_data_path(SMALL), *ZERO, "--data-args-path", "blend.txt")
    assert r.exit_code == 0, r.output
    cfg = yaml.safe_load((tmp_path / "job.yaml").read_text())
    assert [e["weight"] for e in cfg["data"]["blend"]] == [40.0, 60.0]


def test_sequence_parallel_at_tp_1_is_off_as_megatron_lm_turns_it_off():
    conv = convert(SMALL + ZERO + ["--sequence-parallel"])
    assert "sequence_parallel" not in conv.config.get("megatron", {})
    (why,) = [w for f, _, w in conv.not_carried if f == "--sequence-parallel"]
    assert "turns sequence parallelism off" in why
    conv = convert(SMALL + ZERO + ["--sequence-parallel", "--tensor-model-parallel-size", "2"])
    assert conv.config["megatron"]["sequence_parallel"] is True


def test_a_tokenizer_built_from_files_sizes_the_vocabulary_as_megatron_lm_does():
    read = lambda given: 50257  # noqa: E731 - the GPT-2 vocab.json's size
    bpe = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "vocab.json"]
    conv = convert(SMALL + ZERO + bpe, read_vocab=read)  # SMALL gives --vocab-size 256
    assert conv.config["model"]["vocab_size"] == 50304  # 50257 padded to a multiple of 128, not 256
    assert any("not --vocab-size 256" in n for n in conv.notes)
    conv = convert(SMALL + ZERO + ["--tokenizer-type", "NullTokenizer"], read_vocab=read)
    assert conv.config["model"]["vocab_size"] == 256  # the NullTokenizer's size is --vocab-size
    conv = convert(SMALL + ZERO + bpe, read_vocab=lambda given: None)  # files not here: --vocab-size, said
    assert conv.config["model"]["vocab_size"] == 256 and any("check that it is 256" in n for n in conv.notes)
