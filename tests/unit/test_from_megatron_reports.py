"""phoenix config from-megatron: every input refused or obeyed exactly, and every refusal or report says where
it comes from (the warm-up fraction beside --lr-warmup-iters 0, the script lines of the conversion's refusals,
one bullet per torch-engine refusal, a --drop that matches nothing, a value argparse cannot read, a variable a
site profile sets, a not-run command reached several times)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from phoenix_hpc.cli.main import cli
from phoenix_hpc.config.launch_script import read_script
from phoenix_hpc.config.megatron_args import convert
from phoenix_hpc.errors import ConfigError

SITES = Path(__file__).resolve().parents[2] / "sites"

BASE = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
        "--micro-batch-size", "4", "--global-batch-size", "16", "--lr", "1.0", "--data-path", "ds",
        "--vocab-size", "256", "--attention-dropout", "0", "--hidden-dropout", "0", "--adam-beta2", "0.95"]


def _invoke(*args, env=None):
    return CliRunner().invoke(cli, ["config", "from-megatron", *map(str, args)], env=env)


def _bullets(output: str) -> list[str]:
    return [line[4:] for line in output.splitlines() if line.startswith("  - ")]


# --- the warm-up fraction beside --lr-warmup-iters 0 (Megatron-LM asserts lr_warmup_iters == 0 then) ---

def test_a_warmup_fraction_beside_a_zero_warmup_iters_is_accepted_as_megatron_lm_does():
    conv = convert(BASE + ["--train-iters", "10", "--lr-warmup-fraction", "0.1", "--lr-warmup-iters", "0"])
    assert conv.config["training"]["warmup_steps"] == 1  # 0.1 x 10 decay iterations
    assert ("--lr-warmup-iters", 0) in [(f, v) for f, v, _ in conv.not_carried]


def test_a_warmup_fraction_beside_a_non_zero_warmup_iters_is_refused():
    with pytest.raises(ConfigError) as exc:
        convert(BASE + ["--train-iters", "10", "--lr-warmup-fraction", "0.1", "--lr-warmup-iters", "2"])
    assert any(p.startswith("--lr-warmup-fraction and --lr-warmup-iters: both given (0.1 and 2)")
               for p in exc.value.problems), exc.value.problems


# --- the conversion's refusals name the script lines of their arguments ---

SCRIPT = """\
ARGS=( --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --vocab-size 256
       --attention-dropout 0 --hidden-dropout 0 --adam-beta2 0.95 --data-path ds )
TRAIN=( --micro-batch-size 4 --global-batch-size 16 --lr 1.0 )
TRAIN+=( {extra} )
torchrun pretrain_gpt.py "${{ARGS[@]}}" "${{TRAIN[@]}}"
"""


@pytest.mark.parametrize("extra, needle", [
    ("--train-samples 1000 --lr-decay-iters 50",
     "--lr-decay-iters (from --lr-decay-iters on line 4 of run.sh and --train-samples on line 4 of run.sh): 50 "
     "beside --train-samples"),
    ("--train-samples 8", "--train-samples (from --train-samples on line 4 of run.sh and --global-batch-size on "
                          "line 3 of run.sh): 8 is less than one --global-batch-size"),
    ("--train-iters 10 --lr-warmup-iters 10",
     "--lr-warmup-iters 10 and --train-iters 10 (no --lr-decay-iters) (from --lr-warmup-iters on line 4 of run.sh "
     "and --train-iters on line 4 of run.sh): the warm-up is not shorter"),
])
def test_a_refusal_of_the_arguments_names_their_script_lines(tmp_path, monkeypatch, extra, needle):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.sh").write_text(SCRIPT.format(extra=extra))
    r = _invoke("--args-file", "run.sh", "-o", "job.yaml")
    assert r.exit_code == 2, r.output
    assert needle in r.output, r.output
    assert "nothing was written" in r.output and not (tmp_path / "job.yaml").exists()


def test_an_argument_after_dashdash_in_a_refusal_is_named_on_the_command_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.sh").write_text(SCRIPT.format(extra="--train-samples 1000"))
    r = _invoke("--args-file", "run.sh", "-o", "job.yaml", "--", "--lr-decay-iters", "50")
    assert r.exit_code == 2, r.output
    assert ("--lr-decay-iters (from --lr-decay-iters on the command line and --train-samples on line 4 of run.sh)"
            in r.output), r.output


# --- the torch engine's refusals, one bullet each ---

def test_each_torch_engine_refusal_is_a_bullet_of_its_own(tmp_path):
    r = _invoke("-o", tmp_path / "job.yaml", "--engine", "torch", "--", *BASE, "--train-iters", "10",
                "--tensor-model-parallel-size", "2", "--fp16")
    assert r.exit_code == 2, r.output
    bullets = _bullets(r.output)
    for field in ("model.untie_embeddings_and_output_weights", "model.dtype", "parallelism.tp"):
        assert sum(b.startswith(field) for b in bullets) == 1, r.output
    assert not any("; model." in b or "; parallelism." in b for b in bullets), r.output
    assert not (tmp_path / "job.yaml").exists()


# --- a --drop that matches no argument ---

def test_a_drop_of_an_argument_not_given_is_refused_naming_what_could_be_dropped(tmp_path):
    r = _invoke("-o", tmp_path / "job.yaml", "--drop", "qk-layernorm", "--drop", "foo", "--",
                *BASE, "--train-iters", "10", "--foo", "3")
    assert r.exit_code == 2, r.output
    assert any(b.startswith("--drop qk-layernorm: matches no argument that changes the training") and
               b.endswith("that change the training: foo)") for b in _bullets(r.output)), r.output
    assert not (tmp_path / "job.yaml").exists()


def test_a_drop_of_an_argument_given_with_phoenix_s_value_is_refused():
    with pytest.raises(ConfigError) as exc:
        convert(BASE + ["--train-iters", "10"], drop=["adam-beta2"])
    assert any(p.startswith("--drop adam-beta2: matches no argument") and "none in this list" in p
               for p in exc.value.problems), exc.value.problems


def test_a_drop_of_a_megatron_default_that_changes_the_training_still_drops_it():
    tokens = [t for t in BASE if t not in ("--adam-beta2", "0.95")] + ["--train-iters", "10"]
    conv = convert(tokens, drop=["adam-beta2"])
    assert [f for f, _, _ in conv.dropped] == ["--adam-beta2"]


# --- a value argparse's int or float refuses ---

@pytest.mark.parametrize("flag, value, needle", [
    ("--train-samples", "1e3", "--train-samples: '1e3' is not a whole number (allowed: a whole number, e.g. 1000)"),
    ("--num-layers", "2.5", "--num-layers: '2.5' is not a whole number (allowed: a whole number, e.g. 1000)"),
    ("--lr", "fast", "--lr: 'fast' is not a number (allowed: a number"),
])
def test_a_value_of_the_wrong_type_is_refused_in_the_project_s_form(tmp_path, flag, value, needle):
    r = _invoke("-o", tmp_path / "job.yaml", "--", *BASE, "--train-iters", "10", flag, value)
    assert r.exit_code == 2, r.output
    assert needle in _bullets(r.output)[0], r.output
    assert "nothing was written" in r.output and "invalid int value" not in r.output
    assert not (tmp_path / "job.yaml").exists()


# --- a variable the site profiles set ---

LAUNCH = ('export OMP_NUM_THREADS=4\nexport NCCL_DEBUG=INFO\nexport MY_SITE_VAR=a\n'
          'torchrun pretrain_gpt.py ' + " ".join(BASE) + " --train-iters 10\n")


def test_a_variable_a_site_profile_sets_says_the_site_s_value_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    extra = tmp_path / "mysites"
    extra.mkdir()
    profile = yaml.safe_load((SITES / "local.yaml").read_text())
    profile["environment"]["env"] = {"MY_SITE_VAR": "b"}
    (extra / "mysite.yaml").write_text(yaml.safe_dump(profile))
    (tmp_path / "run.sh").write_text(LAUNCH)
    r = _invoke("--args-file", "run.sh", "-o", "job.yaml", env={"PHOENIX_SITE_PATH": str(extra)})
    assert r.exit_code == 0, r.output
    text = (tmp_path / "job.yaml").read_text()
    omp = next(line for line in text.splitlines() if line.startswith("#   OMP_NUM_THREADS="))
    for site in ("local", "perlmutter", "vista"):  # every shipped profile sets it
        assert f"{site} (OMP_NUM_THREADS=" in omp, omp
    assert "the site's value wins" in omp
    mine = next(line for line in text.splitlines() if line.startswith("#   MY_SITE_VAR="))
    assert "site profile mysite (MY_SITE_VAR='b') sets it" in mine, mine
    nccl = next(line for line in text.splitlines() if line.startswith("#   NCCL_DEBUG="))
    assert "site's value wins" not in nccl and "export it before phoenix submit" in nccl
    assert "the site's value wins" in next(line for line in r.output.splitlines()
                                           if "environment OMP_NUM_THREADS=4" in line)


# --- a command not run, reached several times ---

def test_a_command_reached_in_a_loop_is_listed_once_with_a_count(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script = ("for x in a b c; do\n  echo $x\ndone\nmkdir -p out\n"
              "torchrun pretrain_gpt.py " + " ".join(BASE) + " --train-iters 10\n")
    reading = read_script(script, path="run.sh")
    assert reading.launch.not_run == ["line 2: echo $x (reached 3 times)", "line 4: mkdir -p out"]
    (tmp_path / "run.sh").write_text(script)
    r = _invoke("--args-file", "run.sh", "-o", "job.yaml")
    assert r.exit_code == 0, r.output
    text = (tmp_path / "job.yaml").read_text()
    assert text.count("echo $x") == 2, text  # the comment and converted_from.not_run
    record = yaml.safe_load(text)["converted_from"]["not_run"]
    assert record == ["line 2: echo $x (reached 3 times)", "line 4: mkdir -p out"]



# --- a script with more than one pretrain_gpt.py launch ---

ONE = "torchrun pretrain_gpt.py " + " ".join(BASE) + " --train-iters 10"


def test_a_second_launch_with_other_arguments_is_refused_naming_both_lines(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.sh").write_text(f"{ONE}\necho between\n{ONE.replace('--train-iters 10', '--train-iters 20')}\n")
    r = _invoke("--args-file", "run.sh", "-o", "job.yaml")
    assert r.exit_code == 2, r.output
    assert ("launches pretrain_gpt.py on line 1 and again on line 3 with other words (only on line 1: 10; only on "
            "line 3: 20)") in r.output, r.output
    assert "--script-arg" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "job.yaml").exists()


def test_a_second_launch_with_the_same_arguments_is_noted(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.sh").write_text(f"ARGS=( {' '.join(BASE)} --train-iters 10 )\nmkdir -p out\n"
                                     'torchrun pretrain_gpt.py "${ARGS[@]}"\necho again\n'
                                     'torchrun pretrain_gpt.py "${ARGS[@]}"\n')
    r = _invoke("--args-file", "run.sh", "-o", "job.yaml")
    assert r.exit_code == 0, r.output
    note = ("launches pretrain_gpt.py on line 3 and again with the same words on line 5: converted once, from line "
            "3")
    assert note in r.output
    record = yaml.safe_load((tmp_path / "job.yaml").read_text())["converted_from"]
    assert any(note in n for n in record["notes"]), record
    assert record["not_run"] == ["line 2: mkdir -p out"]  # what follows the first launch is not listed
    assert yaml.safe_load((tmp_path / "job.yaml").read_text())["training"]["steps"] == 10


def test_a_launch_in_a_retry_loop_is_read_once(tmp_path):
    reading = read_script(f"for i in 1 2 3; do\n  {ONE}\ndone\n", path="run.sh")
    assert reading.launch.line == 2 and reading.launch.same_at == [] and reading.launch.read_to_end
    assert reading.launch.args[-2:] == ["--train-iters", "10"]


def test_a_script_that_waits_after_its_launch_is_converted_from_the_launch(tmp_path):
    reading = read_script(f"{ONE}\nwhile [ ! -e /nonexistent-phoenix-file ]; do sleep 1; done\n", path="run.sh",
                          timeout_s=1.0)
    assert reading.launch.line == 1 and not reading.launch.read_to_end


def test_an_exit_after_the_launch_ends_the_reading_as_it_ends_the_script(tmp_path):
    text = (f'if [ "${{MODE:-a}}" = a ]; then\n  {ONE}\n  exit 0\nfi\n'
            f"{ONE.replace('--train-iters 10', '--train-iters 20')}\n")
    reading = read_script(text, path="run.sh", env={"PATH": "/usr/bin:/bin"})
    assert reading.launch.line == 2 and reading.launch.args[-1] == "10" and reading.launch.same_at == []
    with pytest.raises(ConfigError, match="on line 2 and again on line 5 with other words"):
        read_script(text.replace("  exit 0\n", "  echo done\n"), path="run.sh", env={"PATH": "/usr/bin:/bin"})


def test_a_stop_after_the_launch_is_not_the_launch_s_refusal(tmp_path):
    reading = read_script(f'{ONE}\n: "${{NOT_SET_PHOENIX_X:?needed after training}}"\n', path="run.sh",
                          env={"PATH": "/usr/bin:/bin"})
    assert reading.launch.line == 1 and reading.launch.args[-1] == "10"
