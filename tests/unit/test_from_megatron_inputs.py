"""`phoenix config from-megatron` refuses bad input with exit 2 and a message that says why: a tokenizer file
that cannot be read, a current folder that no longer exists, a warm-up Megatron-LM's scheduler refuses."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from phoenix_hpc.cli.from_megatron import read_vocab
from phoenix_hpc.cli.main import cli
from phoenix_hpc.config.launch_script import read_launch
from phoenix_hpc.config.megatron_args import Unreadable, convert
from phoenix_hpc.errors import ConfigError

SMALL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
         "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "10", "--lr", "1e-3",
         "--data-path", "ds", "--attention-dropout", "0", "--hidden-dropout", "0", "--adam-beta2", "0.95"]


def _invoke(*args):
    return CliRunner().invoke(cli, ["config", "from-megatron", *map(str, args)])


# --- a tokenizer file that is here but cannot be read says why

def test_a_broken_vocab_json_gives_the_json_error(tmp_path):
    vf = tmp_path / "vocab.json"
    vf.write_text('{"a": 0, "b": ')
    got = read_vocab({"--vocab-file": str(vf)})
    assert isinstance(got, Unreadable) and "not JSON" in got.reason and "Expecting value" in got.reason
    assert str(vf) in got.reason


def test_a_vocab_json_that_is_no_mapping_says_what_it_holds(tmp_path):
    vf = tmp_path / "vocab.json"
    vf.write_text("[1, 2]")
    got = read_vocab({"--vocab-file": str(vf)})
    assert isinstance(got, Unreadable) and "holds a JSON list" in got.reason


def test_an_unreadable_vocab_file_gives_the_os_error(tmp_path, monkeypatch):
    vf = tmp_path / "vocab.json"
    vf.write_text(json.dumps({"a": 0}))
    real = Path.read_text

    def failing(self, *a, **kw):
        if self == vf:
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(self))
        return real(self, *a, **kw)

    monkeypatch.setattr(Path, "read_text", failing)
    got = read_vocab({"--vocab-file": str(vf)})
    assert isinstance(got, Unreadable) and got.reason == f"--vocab-file {str(vf)!r}: {os.strerror(errno.EIO)}"


def test_a_tokenizer_json_without_a_vocabulary_says_so(tmp_path):
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE"}}))
    got = read_vocab({"--tokenizer-model": str(tmp_path)})
    assert isinstance(got, Unreadable) and "no Hugging Face vocabulary" in got.reason and "'vocab'" in got.reason


def test_a_broken_sentencepiece_model_gives_the_library_s_reason(tmp_path):
    m = tmp_path / "tokenizer.model"
    m.write_bytes(b"not a model")
    got = read_vocab({"--tokenizer-model": str(m)})
    assert isinstance(got, Unreadable) and str(m) in got.reason
    assert "sentencepiece" in got.reason  # the library's load error, or that it is not installed here


def test_a_file_that_is_not_here_is_no_reason():
    assert read_vocab({"--vocab-file": "/nonexistent/vocab.json"}) is None


def test_cli_names_the_reason_when_the_vocabulary_is_needed(tmp_path):
    vf = tmp_path / "vocab.json"
    vf.write_text("{oops")
    out = tmp_path / "job.yaml"
    r = _invoke("-o", out, "--", *SMALL, "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vf)
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "--vocab-size: missing, and the tokenizer's vocabulary could not be read here: --vocab-file" in r.output
    assert "not JSON (Expecting property name" in r.output, r.output
    assert not out.exists()


def test_the_note_names_the_reason_when_vocab_size_is_used_instead(tmp_path):
    conv = convert(SMALL + ["--vocab-size", "256", "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "v"],
                   read_vocab=lambda given: Unreadable("--vocab-file 'v': not JSON (boom)"))
    assert conv.config["model"]["vocab_size"] == 256
    assert any("could not be read here: --vocab-file 'v': not JSON (boom)" in n for n in conv.notes), conv.notes


# --- the current folder deleted

def test_a_deleted_current_folder_is_refused_without_a_traceback(tmp_path, monkeypatch):
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    r = _invoke("--", *SMALL, "--vocab-size", "256")
    assert r.exit_code == 2, r.output
    assert "current folder: it no longer exists" in r.output and "Traceback" not in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)


def test_read_launch_refuses_a_deleted_current_folder(tmp_path, monkeypatch):
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    with pytest.raises(ConfigError, match="the current folder no longer exists"):
        read_launch("python pretrain_gpt.py --lr 1\n", path="run.sh")


# --- a warm-up Megatron-LM's scheduler refuses (lr_warmup_steps < lr_decay_steps)

def _problems(tokens):
    with pytest.raises(ConfigError) as exc:
        convert(tokens)
    return exc.value.problems


@pytest.mark.parametrize("extra, needle", [
    (["--lr-warmup-iters", "5", "--lr-decay-iters", "5"], "--lr-warmup-iters 5 and --lr-decay-iters 5: the warm-up "
                                                          "is not shorter than the decay"),
    (["--lr-warmup-iters", "10"], "--lr-warmup-iters 10 and --train-iters 10 (no --lr-decay-iters)"),
    (["--lr-warmup-iters", "12"], "--lr-warmup-iters 12 and --train-iters 10 (no --lr-decay-iters)"),
    (["--lr-warmup-fraction", "1.0"], "--lr-warmup-fraction 1.0 (10 iterations) and --train-iters 10"),
])
def test_a_warmup_not_shorter_than_the_decay_is_refused_as_megatron_lm_refuses_it(extra, needle):
    out = _problems(SMALL + ["--vocab-size", "256"] + extra)
    hit = [p for p in out if needle in p]
    assert len(hit) == 1, out
    assert "lr_warmup_steps < lr_decay_steps" in hit[0] and "allowed:" in hit[0]


@pytest.mark.parametrize("extra", [["--lr-warmup-iters", "4", "--lr-decay-iters", "5"], ["--lr-warmup-iters", "9"],
                                   ["--lr-warmup-fraction", "0.5"]])
def test_a_warmup_shorter_than_the_decay_is_carried_over(extra):
    conv = convert(SMALL + ["--vocab-size", "256"] + extra)
    assert conv.config["training"]["warmup_steps"] < conv.config["training"].get("lr_decay_steps", 10)


def test_cli_refuses_an_equal_warmup_and_decay_with_exit_2_and_writes_nothing(tmp_path):
    out = tmp_path / "job.yaml"
    r = _invoke("-o", out, "--", *SMALL, "--vocab-size", "256", "--lr-warmup-iters", "6", "--lr-decay-iters", "6")
    assert r.exit_code == 2 and "--lr-warmup-iters 6 and --lr-decay-iters 6" in r.output and not out.exists()


def test_a_decay_shorter_than_the_warmup_says_a_longer_one_is_allowed():
    out = _problems(SMALL + ["--vocab-size", "256", "--lr-warmup-iters", "5", "--lr-decay-iters", "3"])
    hit = [p for p in out if p.startswith("--lr-decay-iters: 3")]
    assert len(hit) == 1 and "(allowed: > 5:" in hit[0], out
    assert not any("not shorter than the decay" in p for p in out), out  # named once, not twice
