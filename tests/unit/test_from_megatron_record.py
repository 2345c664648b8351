"""What `phoenix config from-megatron` left out of a Megatron-LM launch stays with the run: the config's
converted_from section (dropped and skipped arguments, commands not run, the script's environment), which the
run directory's config.yaml keeps; the schema's refusals name the Megatron-LM argument and line a field came
from; a script that launches another python entry point is named as such."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from phoenix_hpc.cli.main import cli
from phoenix_hpc.cli.submit import resolved_config_yaml
from phoenix_hpc.config.launch_script import python_commands, read_script
from phoenix_hpc.config.load import load_job_config
from phoenix_hpc.config.resolve import resolve
from phoenix_hpc.config.schema import JobConfig
from phoenix_hpc.profiles import load_profile

ROOT = Path(__file__).resolve().parents[2]
ENV = {"PATH": "/usr/bin:/bin", "HOME": "/"}

SCRIPT = """#!/bin/bash
export CUDA_DEVICE_MAX_CONNECTIONS=1
export NCCL_IB_HCA=mlx5_0,mlx5_1
mkdir -p logs
ARGS=(
  --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32
  --micro-batch-size 4
  --global-batch-size {gbs}
  --train-iters 10 --lr 1e-3 --data-path ds --vocab-size 256
  --attention-dropout 0 --hidden-dropout 0 --use-distributed-optimizer
)
OMP_NUM_THREADS=4 torchrun --nproc_per_node 4 pretrain_gpt.py "${{ARGS[@]}}"
"""


def _convert(tmp_path, monkeypatch, text, *extra):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.sh").write_text(text)
    return CliRunner().invoke(cli, ["config", "from-megatron", "--args-file", "run.sh", "-o", "job.yaml",
                                    "--drop", "adam-beta2", *extra])


def test_the_run_directory_s_config_keeps_what_the_conversion_left_out(tmp_path, monkeypatch):
    r = _convert(tmp_path, monkeypatch, SCRIPT.format(gbs=32), "--nodes", "2")  # dp 8 on Perlmutter
    assert r.exit_code == 0, r.output
    cfg = load_job_config(tmp_path / "job.yaml")
    job = resolve(cfg, load_profile("perlmutter"), run_dir=str(tmp_path / "run"), default_python=sys.executable)
    written = yaml.safe_load(resolved_config_yaml(job))  # what phoenix submit writes into RUN_DIR/config.yaml
    rec = written["converted_from"]
    assert rec["source"] == "--args-file run.sh"
    assert rec["launcher"] == "OMP_NUM_THREADS=4 torchrun --nproc_per_node 4"
    assert rec["dropped"] == ["--adam-beta2 0.999 (Megatron-LM's default when absent): phoenix's AdamW uses beta2 "
                              "0.95 (allowed: 0.95)"]
    assert [n.split(":")[0] for n in rec["not_carried"]] == ["--use-distributed-optimizer True"]
    assert rec["not_run"] == ["line 4: mkdir -p logs"]
    assert rec["environment"] == {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_IB_HCA": "mlx5_0,mlx5_1",
                                  "OMP_NUM_THREADS": "4"}
    # phoenix submit --resume reads that file back: the record survives it
    assert JobConfig.model_validate(written).converted_from == cfg.converted_from


def test_a_config_without_the_record_dumps_as_before():
    for src in ("gpt-small.yaml", "perlmutter-7b.yaml", "vista-7b.yaml"):
        cfg = load_job_config(ROOT / "examples" / src)
        assert cfg.converted_from is None
        dumped = cfg.model_dump(mode="json")
        assert "converted_from" not in dumped
        assert list(dumped) == [f for f in JobConfig.model_fields if f != "converted_from"]


def test_the_script_s_environment_is_listed_in_the_comments_and_on_stderr(tmp_path, monkeypatch):
    r = _convert(tmp_path, monkeypatch, SCRIPT.format(gbs=8))
    assert r.exit_code == 0, r.output
    text = (tmp_path / "job.yaml").read_text()
    assert "# Environment the script set for its launch, NOT set in the job by this config:" in text
    assert "#   NCCL_IB_HCA='mlx5_0,mlx5_1': a job config has no environment of its own" in text
    assert "#   CUDA_DEVICE_MAX_CONNECTIONS='1': phoenix sets it to 1 itself" in text
    assert "not carried over: the script's environment OMP_NUM_THREADS=4" in r.output


def test_the_environment_is_what_the_script_changed_at_its_launch(tmp_path):
    text = ("export A=1\nB=2\nexport B\nexport HOME=/\nexport C=$(hostname)\nexport D=x; unset D\n"
            "env E=5 python pretrain_gpt.py --lr 1\n")
    reading = read_script(text, path="s.sh", env=ENV)
    assert reading.environment == {"A": "1", "B": "2", "C": "<not known when the script was read>"}
    assert reading.launch.environment == {"A": "1", "B": "2", "C": "<not known when the script was read>",
                                          "E": "5"}
    assert reading.launch.launcher == ["env", "E=5", "python"]


def test_a_fragment_s_exports_are_recorded_too(tmp_path, monkeypatch):
    frag = ("export NCCL_DEBUG=INFO\nARGS=( --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 "
            "--micro-batch-size 1 --global-batch-size 4 --train-iters 10 --lr 1e-3 --data-path ds --vocab-size 256 "
            "--attention-dropout 0 --hidden-dropout 0 )\n")
    r = _convert(tmp_path, monkeypatch, frag)
    assert r.exit_code == 0, r.output
    assert load_job_config(tmp_path / "job.yaml").converted_from.environment == {"NCCL_DEBUG": "INFO"}


# --- the schema's refusals name the argument and line

def test_a_schema_refusal_names_the_megatron_argument_and_its_line(tmp_path, monkeypatch):
    r = _convert(tmp_path, monkeypatch, SCRIPT.format(gbs=6))
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert ("training.global_batch_size (from --global-batch-size on line 8 of run.sh) (6) must be a multiple of "
            "training.micro_batch_size (from --micro-batch-size on line 7 of run.sh) (4)") in r.output, r.output
    assert not (tmp_path / "job.yaml").exists()


def test_an_argument_after_dashdash_is_named_as_given_on_the_command_line(tmp_path, monkeypatch):
    r = _convert(tmp_path, monkeypatch, SCRIPT.format(gbs=8), "--", "--global-batch-size", "10")
    assert r.exit_code == 2
    assert "training.global_batch_size (from --global-batch-size on the command line) (10)" in r.output, r.output


def test_a_field_of_the_tokenizer_files_is_named_so():
    from phoenix_hpc.cli.from_megatron import name_sources

    out = name_sources(["model.vocab_size: value 1 -- Input should be greater than or equal to 2",
                        "data.blend.0.weight: value -1.0 -- Input should be greater than 0"],
                       {"model.vocab_size": ["the tokenizer files"], "data.blend": ["--data-path on line 3 of a.sh"]})
    assert out == ["model.vocab_size (from the tokenizer files): value 1 -- Input should be greater than or equal to 2",
                   "data.blend.0.weight (from --data-path on line 3 of a.sh): value -1.0 -- Input should be greater "
                   "than 0"]


# --- a script that launches another python entry point

@pytest.mark.parametrize("launch", ["torchrun --nproc_per_node 8 train.py \"${ARGS[@]}\"",
                                    "srun python3 -m mytrainer \"${ARGS[@]}\""])
def test_a_script_that_launches_another_entry_point_says_so(tmp_path, monkeypatch, launch):
    text = "export X=1\nARGS=( --num-layers 2 --lr 1 )\nmkdir -p out\n" + launch + "\n"
    r = _convert(tmp_path, monkeypatch, text)
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "--args-file run.sh: no pretrain_gpt.py launch was found; the python command it runs: line 4: " in r.output
    assert launch.split()[0] in r.output and "missing" not in r.output, r.output
    assert not (tmp_path / "job.yaml").exists()


def test_python_commands_are_told_from_other_commands_and_option_lines():
    assert python_commands(["line 1: mkdir -p x", "line 2: /opt/conda/bin/python3.11 run.py", "line 3: echo a.py",
                            "line 4: deepspeed x", "line 5: srun hostname"]) == [
        "line 2: /opt/conda/bin/python3.11 run.py", "line 3: echo a.py", "line 4: deepspeed x"]
