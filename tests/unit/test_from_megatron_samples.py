"""phoenix config from-megatron with Megatron-LM's sample-based training (--train-samples, --lr-warmup-samples,
--lr-decay-samples): converted into training.train_samples, lr_warmup_samples and lr_decay_samples, and refused
where Megatron-LM's validate_args or OptimizerParamScheduler assert."""

from __future__ import annotations

import pytest

from phoenix_hpc.config.load import parse_model
from phoenix_hpc.config.megatron_args import convert
from phoenix_hpc.config.schema import JobConfig
from phoenix_hpc.engines.schedule import lr_for
from phoenix_hpc.errors import ConfigError

G = 16

BASE = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
        "--micro-batch-size", "4", "--global-batch-size", str(G), "--lr", "1.0", "--min-lr", "0.1",
        "--data-path", "ds", "--vocab-size", "256", "--attention-dropout", "0", "--hidden-dropout", "0",
        "--adam-beta2", "0.95", "--lr-decay-style", "linear"]


def test_a_script_line_with_sample_arguments_converts_to_the_sample_counted_schedule():
    line = BASE + ["--train-samples", "1000", "--lr-warmup-samples", "100", "--lr-decay-samples", "900"]
    conv = convert(line)
    t = conv.config["training"]
    assert (t["train_samples"], t["steps"], t["lr_warmup_samples"], t["lr_decay_samples"]) == (1000, 62, 100, 900)
    assert "warmup_steps" not in t and "lr_decay_steps" not in t
    cfg = parse_model(JobConfig, conv.config, source="converted")
    # the update of step s at (s - 1) x 16 samples: step 7 at 96 of the 100 warm-up samples, step 8 at 112
    assert lr_for(cfg.training, 7) == pytest.approx(0.96) and lr_for(cfg.training, 8) == pytest.approx(0.9865)


def test_a_warmup_fraction_is_of_the_decay_samples():
    conv = convert(BASE + ["--train-samples", "1000", "--lr-warmup-fraction", "0.1"])
    assert conv.config["training"]["lr_warmup_samples"] == 100  # 0.1 x 1000 train samples
    conv = convert(BASE + ["--train-samples", "1000", "--lr-decay-samples", "900", "--lr-warmup-fraction", "0.1"])
    assert conv.config["training"]["lr_warmup_samples"] == 90
    with pytest.raises(ConfigError) as exc:
        convert(BASE + ["--train-samples", "1001", "--lr-warmup-fraction", "0.25"])
    assert any("--lr-warmup-fraction: 0.25 of 1001 decay samples is 250.25 warm-up samples" in p
               for p in exc.value.problems), exc.value.problems


def test_a_zero_warmup_of_the_other_unit_is_accepted_as_megatron_lm_does():
    conv = convert(BASE + ["--train-samples", "1000", "--lr-warmup-iters", "0"])
    assert conv.config["training"]["train_samples"] == 1000
    conv = convert(BASE + ["--train-iters", "10", "--lr-warmup-samples", "0"])
    assert conv.config["training"]["steps"] == 10 and "lr_warmup_samples" not in conv.config["training"]


@pytest.mark.parametrize("words, needle", [
    (["--train-samples", "1000", "--train-iters", "62"], "--train-iters and --train-samples: both given"),
    (["--train-samples", "1000", "--lr-decay-iters", "50"], "--lr-decay-iters: 50 beside --train-samples"),
    (["--train-samples", "1000", "--lr-warmup-iters", "5"], "--lr-warmup-iters: 5 beside --train-samples"),
    (["--train-iters", "62", "--lr-decay-samples", "900"], "--lr-decay-samples: 900 beside --train-iters"),
    (["--train-iters", "62", "--lr-warmup-samples", "100"], "--lr-warmup-samples: 100 beside --train-iters"),
    (["--train-samples", "-1000"], "--train-samples: -1000 (allowed: a positive number of samples)"),
    (["--train-samples", "1000", "--lr-warmup-samples", "-3"], "--lr-warmup-samples: -3 (allowed: a non-negative"),
    (["--train-samples", "1000", "--lr-decay-samples", "900", "--lr-warmup-samples", "900"],
     "--lr-warmup-samples: 900 gives 900 warm-up samples, not less than the 900 decay samples"),
    (["--train-samples", "1000", "--lr-warmup-fraction", "1.0"],
     "--lr-warmup-fraction: 1.0 gives 1000 warm-up samples, not less than the 1000 decay samples"),
    (["--train-samples", "1000", "--lr-warmup-samples", "10", "--lr-warmup-fraction", "0.1"],
     "--lr-warmup-fraction and --lr-warmup-samples: both given"),
    (["--train-samples", "8"], "--train-samples: 8 is less than one --global-batch-size (16)"),
    ([], "--train-iters: missing (pretrain_gpt.py needs it or --train-samples"),
])
def test_sample_arguments_megatron_lm_refuses_are_refused_with_exit_2(words, needle):
    with pytest.raises(ConfigError) as exc:
        convert(BASE + words)
    assert exc.value.exit_code == 2
    assert any(needle in p for p in exc.value.problems), exc.value.problems
    assert all("allowed" in p for p in exc.value.problems if needle in p)


SCRIPT = """
GPT_ARGS=( --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --vocab-size 256
           --attention-dropout 0 --hidden-dropout 0 --adam-beta2 0.95 )
TRAINING_ARGS=(
    --micro-batch-size 4 --global-batch-size 16 --lr 1.0 --min-lr 0.1 --lr-decay-style linear
    --train-samples 1000 --lr-warmup-samples 100 --lr-decay-samples 900
)
torchrun --nproc-per-node 4 pretrain_gpt.py "${GPT_ARGS[@]}" "${TRAINING_ARGS[@]}" --data-path ds
"""


def _invoke(*args):
    from click.testing import CliRunner

    from phoenix_hpc.cli.main import cli

    return CliRunner().invoke(cli, ["config", "from-megatron", *map(str, args)])


def test_cli_converts_a_launch_script_counted_in_samples(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "args.sh").write_text(SCRIPT)
    r = _invoke("--args-file", "args.sh", "-o", "job.yaml")
    assert r.exit_code == 0, r.output
    from phoenix_hpc.config.load import load_job_config

    t = load_job_config(tmp_path / "job.yaml").training
    assert (t.train_samples, t.steps, t.lr_warmup_samples, t.lr_decay_samples) == (1000, 62, 100, 900)
    assert lr_for(t, 7) == pytest.approx(0.96) and lr_for(t, 58) == pytest.approx(0.1)  # 96 and 912 samples
    assert lr_for(t, 57) == pytest.approx(0.1045)  # 896 samples: 4 before the decay ends


def test_cli_refuses_samples_mixed_with_iterations_with_exit_2_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "args.sh").write_text(SCRIPT.replace("--lr-decay-samples 900", "--lr-decay-iters 50"))
    r = _invoke("--args-file", "args.sh", "-o", "job.yaml")
    assert r.exit_code == 2, r.output
    assert ("--lr-decay-iters (from --lr-decay-iters on line 6 of args.sh and --train-samples on line 6 of "
            "args.sh): 50 beside --train-samples") in r.output and "Traceback" not in r.output
    assert not (tmp_path / "job.yaml").exists()
