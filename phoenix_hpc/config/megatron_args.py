"""Megatron-LM ``pretrain_gpt.py`` arguments -> a phoenix job config (``phoenix config from-megatron``).

One table, :data:`ARGS`, says for every Megatron-LM argument phoenix knows what becomes of it:

* ``map``: carried over into a config field (``field``), possibly through a conversion;
* ``same``: carried over only when its effective value equals what phoenix does (``allowed``); any other value
  changes the training's meaning, so the conversion is refused unless the user drops the argument;
* ``record``: kept in the config as a comment (tokenizer, checkpoint format): phoenix does not use it;
* ``skip``: performance, logging or launch options that do not change what is trained; listed with why;
* ``refuse``: a feature phoenix does not implement and that changes the training (a mixture of experts,
  ``--finetune``): refused unless dropped.

Effective values are Megatron-LM's: an argument left out takes Megatron-LM's default, which is what its
``pretrain_gpt.py`` would train with. The defaults and derived values are those of Megatron-LM's
``megatron/training/arguments.py`` and the config dataclasses it builds its arguments from
(``TransformerConfig``: ``hidden_dropout = attention_dropout = 0.1``, ``init_method_std = 0.02``; the
optimizer's ``adam_beta2 = 0.999``; ``--split`` ``969, 30, 1`` when a ``--data-path`` is given without one;
``ffn_hidden_size = int(4 h 2/3 / 64) x 64`` with ``--swiglu``, else ``4 h``), and the padded vocabulary is
``megatron/training/vocab_utils.py``'s: ``ceil(vocab / (make_vocab_size_divisible_by x tp)) x`` that multiple.

:func:`convert` is pure: token list in, :class:`Conversion` out (reading a tokenizer's vocabulary file goes
through the ``read_vocab`` callable it is given). Errors: :class:`phoenix_hpc.errors.ConfigError` (exit 2) for
an argument list that does not parse, a missing required argument, or arguments that change the training's
meaning and were not dropped; every problem is listed, each naming the argument, its value and what is allowed.
"""

from __future__ import annotations

import argparse
import ast
import math
import os
import re
import shlex
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from phoenix_hpc.config import megatron_torch
from phoenix_hpc.config.schema import MEGATRON_DEFAULT_SPLIT, MegatronOptions, TrainingConfig
from phoenix_hpc.data.split import split_vector
from phoenix_hpc.errors import ConfigError

#: What phoenix's engines do where Megatron-LM has an argument (engines/zero.py, engines/megatron_engine.py,
#: engines/megatron_spec.py, engines/torch_gpt.py).
PHOENIX_FIXED = {
    "adam_beta1": 0.9, "adam_beta2": 0.95, "adam_eps": 1e-8, "norm_epsilon": 1e-5,
    "rotary_percent": 1.0, "lr_warmup_init": 0.0,
}

FLAG = "flag"  # a store_true argument


@dataclass(frozen=True)
class Arg:
    """One Megatron-LM argument: its flag, what phoenix does with it, and Megatron-LM's default.

    ``type``: ``int``/``float``/``str`` for a valued argument, :data:`FLAG` for a switch, ``"list"`` for
    ``nargs='+'``. ``field``: the config field (``section.name``) for ``map``; ``allowed``: the value phoenix
    implements for ``same``; ``why``: the reason shown for anything not carried over."""

    flag: str
    kind: str
    type: Any = str
    default: Any = None
    field: str | None = None
    allowed: Any = None
    why: str = ""

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


_PERF = "performance or memory only: does not change what is trained"
_LOG = "logging or profiling: phoenix logs to RUN_DIR (docs/engines.md)"
_LAUNCH = "launch and process set-up: phoenix launches the job itself (phoenix submit)"

ARGS: tuple[Arg, ...] = (
    # --- model shape ---
    Arg("--num-layers", "map", int, None, "model.layers"),
    Arg("--hidden-size", "map", int, None, "model.hidden_size"),
    Arg("--num-attention-heads", "map", int, None, "model.heads"),
    Arg("--group-query-attention", "map", FLAG, False, "model.num_query_groups",
        why="switches --num-query-groups on"),
    Arg("--num-query-groups", "map", int, 1, "model.num_query_groups"),
    Arg("--ffn-hidden-size", "map", int, None, "model.ffn_hidden_size"),
    Arg("--kv-channels", "same", int, None, allowed="hidden-size / num-attention-heads",
        why="phoenix's attention heads have hidden_size / heads channels"),
    Arg("--seq-length", "map", int, None, "model.seq_length"),
    Arg("--max-position-embeddings", "record", int, None,
        why="phoenix's position table has seq_length rows; must be at least --seq-length"),
    Arg("--position-embedding-type", "map", str, "learned_absolute", "model.position_embedding_type"),
    Arg("--use-rotary-position-embeddings", "map", FLAG, False, "model.position_embedding_type",
        why="the same as --position-embedding-type rope"),
    Arg("--rotary-base", "map", int, 10000, "model.rotary_base"),
    Arg("--rotary-percent", "same", float, 1.0, allowed=1.0, why="phoenix rotates every channel of a head"),
    Arg("--swiglu", "map", FLAG, False, "model.activation"),
    Arg("--normalization", "map", str, "LayerNorm", "model.normalization"),
    Arg("--norm-epsilon", "same", float, 1e-5, allowed=1e-5, why="phoenix's norms use epsilon 1e-5"),
    Arg("--disable-bias-linear", "map", FLAG, False, "model.add_bias_linear"),
    Arg("--untie-embeddings-and-output-weights", "map", FLAG, False, "model.untie_embeddings_and_output_weights"),
    Arg("--bf16", "map", FLAG, False, "model.dtype"),
    Arg("--fp16", "map", FLAG, False, "model.dtype"),
    Arg("--vocab-size", "map", int, None, "model.vocab_size"),
    Arg("--make-vocab-size-divisible-by", "map", int, 128, "model.vocab_size",
        why="pads the vocabulary as Megatron-LM does"),
    Arg("--attention-dropout", "map", float, 0.1, "model.attention_dropout",
        why="Megatron-LM's 0.1 when absent; the masks' random state is reseeded every step from the seed, step, "
            "pp and dp (so a replayed step draws the same masks; not Megatron-LM's masks)"),
    Arg("--hidden-dropout", "map", float, 0.1, "model.hidden_dropout",
        why="Megatron-LM's 0.1 when absent; masks drawn as --attention-dropout's"),
    Arg("--init-method-std", "map", float, 0.02, "model.init_method_std",
        why="weights ~ N(0, std), the residual output projections N(0, std / sqrt(2 x layers)), as Megatron-LM; "
            "absent: 0.02, phoenix's default as well"),
    Arg("--apply-layernorm-1p", "refuse", FLAG, False, why="not implemented by phoenix's models"),
    Arg("--add-qkv-bias", "refuse", FLAG, False, why="not implemented by phoenix's models"),
    Arg("--qk-layernorm", "refuse", FLAG, False, why="not implemented by phoenix's models"),
    Arg("--squared-relu", "refuse", FLAG, False, why="phoenix's models have gelu or swiglu"),
    Arg("--num-experts", "refuse", int, None, why="mixture of experts is not implemented by phoenix's models"),
    Arg("--use-mcore-models", "skip", FLAG, False, why="phoenix always builds megatron-core models"),
    Arg("--transformer-impl", "map", str, "transformer_engine", "megatron.transformer_impl"),
    Arg("--attention-backend", "map", str, "auto", "megatron.attention_backend"),
    Arg("--use-flash-attn", "skip", FLAG, False, why=_PERF + " (use --attention-backend)"),
    # --- parallelism ---
    Arg("--tensor-model-parallel-size", "map", int, 1, "parallelism.tp"),
    Arg("--pipeline-model-parallel-size", "map", int, 1, "parallelism.pp"),
    Arg("--sequence-parallel", "map", FLAG, False, "megatron.sequence_parallel",
        why="not at --tensor-model-parallel-size 1, where Megatron-LM turns it off with a warning"),
    Arg("--recompute-activations", "map", FLAG, False, "megatron.recompute_granularity",
        why="the same as --recompute-granularity selective"),
    Arg("--recompute-granularity", "map", str, None, "megatron.recompute_granularity"),
    Arg("--recompute-method", "skip", str, None, why=_PERF + " (phoenix's full recompute is method uniform)"),
    Arg("--recompute-num-layers", "skip", int, None, why=_PERF + " (phoenix's full recompute: 1 layer per chunk)"),
    Arg("--num-layers-per-virtual-pipeline-stage", "skip", int, None,
        why=_PERF + " (phoenix's pipeline schedule is not interleaved)"),
    Arg("--virtual-pipeline-model-parallel-size", "skip", int, None,
        why=_PERF + " (phoenix's pipeline schedule is not interleaved)"),
    Arg("--context-parallel-size", "same", int, 1, allowed=1, why="context parallelism is not implemented"),
    Arg("--expert-model-parallel-size", "same", int, 1, allowed=1, why="mixture of experts is not implemented"),
    Arg("--use-distributed-optimizer", "skip", FLAG, False,
        why="phoenix always shards the optimizer over DP (the shards are what it replicates)"),
    Arg("--overlap-grad-reduce", "skip", FLAG, False, why=_PERF),
    Arg("--overlap-param-gather", "skip", FLAG, False, why=_PERF),
    Arg("--accumulate-allreduce-grads-in-fp32", "skip", FLAG, False,
        why="phoenix always reduces gradients in fp32"),
    Arg("--no-gradient-accumulation-fusion", "skip", FLAG, False, why=_PERF),
    Arg("--no-masked-softmax-fusion", "skip", FLAG, False, why=_PERF),
    Arg("--no-bias-gelu-fusion", "skip", FLAG, False, why=_PERF),
    Arg("--no-bias-swiglu-fusion", "skip", FLAG, False, why=_PERF),
    Arg("--no-bias-dropout-fusion", "skip", FLAG, False, why=_PERF),
    Arg("--no-rope-fusion", "skip", FLAG, False, why=_PERF),
    Arg("--attention-softmax-in-fp32", "skip", FLAG, False, why=_PERF),
    Arg("--manual-gc", "skip", FLAG, False, why=_PERF),
    Arg("--manual-gc-interval", "skip", int, 0, why=_PERF),
    Arg("--empty-unused-memory-level", "skip", int, 0, why=_PERF),
    Arg("--cross-entropy-loss-fusion", "skip", FLAG, False, why=_PERF + " (a fused kernel of the same loss)"),
    Arg("--use-nccl-ub", "skip", FLAG, False, why=_PERF),
    Arg("--grad-reduce-in-bf16", "refuse", FLAG, False, why="phoenix always reduces gradients in fp32"),
    Arg("--fp8-format", "refuse", str, None, why="fp8 training is not implemented (phoenix trains in bf16, fp16 "
        "or fp32)"),
    Arg("--fp8-param-gather", "refuse", FLAG, False, why="fp8 training is not implemented"),
    Arg("--fp8-amax-history-len", "refuse", int, 1, why="fp8 training is not implemented"),
    Arg("--fp8-amax-compute-algo", "refuse", str, "most_recent", why="fp8 training is not implemented"),
    Arg("--calculate-per-token-loss", "refuse", FLAG, False,
        why="not implemented: phoenix's loss is Megatron-LM's default one"),
    Arg("--distributed-backend", "skip", str, "nccl", why=_LAUNCH),
    Arg("--distributed-timeout-minutes", "skip", int, 10,
        why="phoenix bounds collectives with resilience.collective_timeout_s"),
    # --- batch and optimisation ---
    Arg("--micro-batch-size", "map", int, None, "training.micro_batch_size"),
    Arg("--global-batch-size", "map", int, None, "training.global_batch_size"),
    Arg("--rampup-batch-size", "refuse", "list", None, why="batch-size ramp-up is not implemented"),
    Arg("--train-iters", "map", int, None, "training.steps",
        why="or --train-samples: one of them, as Megatron-LM asks"),
    Arg("--train-samples", "map", int, None, "training.train_samples",
        why="instead of --train-iters: training.steps is train-samples // global-batch-size (an incomplete last "
            "batch is not trained, as Megatron-LM's update_train_iters), the learning-rate schedule counts samples, "
            "and a data blend is built for train-samples samples; refused beside --train-iters, --lr-decay-iters or "
            "a non-zero --lr-warmup-iters, as Megatron-LM asserts"),
    Arg("--lr-decay-samples", "map", int, None, "training.lr_decay_samples",
        why="with --train-samples only: the decay ends at this sample, counted from 0 with the warm-up in it "
            "(absent: --train-samples)"),
    Arg("--lr-warmup-samples", "map", int, 0, "training.lr_warmup_samples",
        why="with --train-samples only (0 is accepted beside --train-iters, as Megatron-LM does); refused unless "
            "below the decay samples, as Megatron-LM's scheduler asserts"),
    Arg("--decoupled-lr", "refuse", float, None,
        why="a learning rate of its own for the input and output layers is not implemented"),
    Arg("--decoupled-min-lr", "refuse", float, None,
        why="a learning rate of its own for the input and output layers is not implemented"),
    Arg("--lr", "map", float, None, "training.lr"),
    Arg("--min-lr", "map", float, 0.0, "training.min_lr"),
    Arg("--lr-decay-style", "map", str, "linear", "training.lr_schedule"),
    Arg("--lr-decay-iters", "map", int, None, "training.lr_decay_steps",
        why="the decay from --lr to --min-lr ends at this iteration, counted from 0 with the warm-up in it; "
            "--min-lr after it (absent: --train-iters, training.lr_decay_steps unset); refused unless above the "
            "warm-up iterations, as Megatron-LM's scheduler asserts"),
    Arg("--lr-warmup-iters", "map", int, 0, "training.warmup_steps"),
    Arg("--lr-warmup-fraction", "map", float, None, "training.warmup_steps",
        why="warm-up steps = fraction x decay steps, as Megatron-LM computes them; refused when that is not a "
            "whole number of steps. With --train-samples: training.lr_warmup_samples = fraction x decay samples, "
            "refused when not a whole number of samples"),
    Arg("--lr-warmup-init", "same", float, 0.0, allowed=0.0, why="phoenix warms up from 0"),
    Arg("--weight-decay", "map", float, 0.01, "training.weight_decay"),
    Arg("--weight-decay-incr-style", "same", str, "constant", allowed="constant",
        why="phoenix's weight decay is constant"),
    Arg("--clip-grad", "map", float, 1.0, "training.grad_clip"),
    Arg("--optimizer", "same", str, "adam", allowed="adam", why="phoenix's optimizer is AdamW"),
    Arg("--adam-beta1", "same", float, 0.9, allowed=0.9, why="phoenix's AdamW uses beta1 0.9"),
    Arg("--adam-beta2", "same", float, 0.999, allowed=0.95, why="phoenix's AdamW uses beta2 0.95"),
    Arg("--adam-eps", "same", float, 1e-8, allowed=1e-8, why="phoenix's AdamW uses eps 1e-8"),
    Arg("--seed", "map", int, 1234, "training.seed"),
    Arg("--log-interval", "map", int, 100, "training.log_interval"),
    # --- data ---
    Arg("--data-path", "map", "list", None, "data.blend",
        why="weights and prefixes (W1 P1 W2 P2 ...) or prefixes alone, read as megatron-core's get_blend_from_list"),
    Arg("--data-args-path", "map", str, None, "data.blend",
        why="a file holding --data-path's words (weights and prefixes), split on white space as Megatron-LM reads "
            "it; instead of --data-path"),
    Arg("--split", "map", str, None, "data.split", why="absent: Megatron-LM's '969, 30, 1'"),
    Arg("--mock-data", "refuse", FLAG, False, why="phoenix trains on a dataset: give --data-path"),
    Arg("--train-data-path", "refuse", "list", None, why="per-split data paths are not implemented: give --data-path"),
    Arg("--valid-data-path", "skip", "list", None,
        why="per-split data paths are not implemented: evaluation reads the validation part of --split"),
    Arg("--test-data-path", "skip", "list", None, why="phoenix does no test-split evaluation"),
    Arg("--data-cache-path", "skip", str, None, why="phoenix builds no GPTDataset index cache"),
    Arg("--num-workers", "skip", int, 2, why=_PERF),
    Arg("--no-mmap-bin-files", "skip", FLAG, False, why=_PERF + " (how the .bin files are read)"),
    Arg("--dataloader-type", "same", str, "single", allowed="single",
        why="phoenix reads the samples of a step as Megatron-LM's single (pretraining) sampler orders them"),
    Arg("--reset-position-ids", "refuse", FLAG, False, why="not implemented by phoenix's data path"),
    Arg("--reset-attention-mask", "refuse", FLAG, False, why="not implemented by phoenix's data path"),
    Arg("--eod-mask-loss", "refuse", FLAG, False, why="not implemented by phoenix's data path"),
    Arg("--no-create-attention-mask-in-dataloader", "skip", FLAG, False, why=_PERF),
    Arg("--tokenizer-type", "record", str, None, why="phoenix reads token ids; the tokenizer is kept for the record"),
    Arg("--tokenizer-model", "record", str, None, why="phoenix reads token ids; the tokenizer is kept for the record"),
    Arg("--vocab-file", "record", str, None, why="phoenix reads token ids; the tokenizer is kept for the record"),
    Arg("--merge-file", "record", str, None, why="phoenix reads token ids; the tokenizer is kept for the record"),
    Arg("--tiktoken-pattern", "record", str, None,
        why="phoenix reads token ids; the tokenizer is kept for the record"),
    # --- evaluation and logging ---
    Arg("--eval-interval", "map", int, 1000, "training.eval_interval",
        why="Megatron-LM evaluates every --eval-interval iterations, and once more after the last iteration (on "
            "the next --eval-iters batches; also with --train-iters below the interval), when --eval-iters > 0 and "
            "the validation part of --split is not empty; phoenix does both; otherwise no evaluation (null)"),
    Arg("--eval-iters", "map", int, 100, "training.eval_iters", why="with an evaluation only"),
    Arg("--tensorboard-dir", "map", str, None, "logging.tensorboard_dir",
        why="also logging.tensorboard: true (a relative folder made absolute against the launch folder); the scalars phoenix writes are docs/engines.md's"),
    Arg("--wandb-project", "map", str, None, "logging.wandb.project",
        why="W&B logging is on when given, as in Megatron-LM (the ranks need the wandb package)"),
    Arg("--wandb-exp-name", "map", str, None, "logging.wandb.name", why="with --wandb-project only"),
    Arg("--log-throughput", "skip", FLAG, False, why=_LOG),
    Arg("--log-timers-to-tensorboard", "skip", FLAG, False, why=_LOG),
    Arg("--log-validation-ppl-to-tensorboard", "skip", FLAG, False, why=_LOG),
    Arg("--log-memory-to-tensorboard", "skip", FLAG, False, why=_LOG),
    Arg("--log-num-zeros-in-grad", "skip", FLAG, False, why=_LOG),
    Arg("--timing-log-level", "skip", int, 0, why=_LOG),
    Arg("--profile", "skip", FLAG, False, why=_LOG),
    Arg("--profile-step-start", "skip", int, 10, why=_LOG),
    Arg("--profile-step-end", "skip", int, 12, why=_LOG),
    Arg("--profile-ranks", "skip", "list", None, why=_LOG),
    Arg("--log-params-norm", "skip", FLAG, False, why=_LOG),
    Arg("--logging-level", "skip", int, None, why=_LOG),
    Arg("--record-memory-history", "skip", FLAG, False, why=_LOG),
    Arg("--memory-snapshot-path", "skip", str, "snapshot.pickle", why=_LOG),
    # --- checkpoints ---
    Arg("--save", "map", str, None, "resilience.checkpoint.path",
        why="also resilience.checkpoint.save_megatron: phoenix's checkpoints (step_NNNNNNNN/) and Megatron-LM's "
            "(iter_NNNNNNN/, latest_checkpointed_iteration.txt) side by side in that folder"),
    Arg("--save-interval", "map", int, None, "resilience.checkpoint.interval_steps"),
    Arg("--load", "map", str, None, "resilience.checkpoint.load_megatron",
        why="a torch_dist checkpoint directory holding latest_checkpointed_iteration.txt when converted: its "
            "weights, and its optimizer state and iteration when present. The same folder as --save without that "
            "file yet (Megatron-LM's auto-resume): not carried over, the job starts from scratch as Megatron-LM "
            "would, and a resubmitted job continues from its own checkpoints there. Another folder without it: "
            "refused"),
    Arg("--ckpt-format", "same", str, "torch_dist", allowed="torch_dist",
        why="phoenix reads and writes Megatron-LM checkpoints in the torch_dist format only"),
    Arg("--no-load-optim", "refuse", FLAG, False,
        why="phoenix loads the optimizer state of a --load checkpoint whenever it has one"),
    Arg("--exit-on-missing-checkpoint", "skip", FLAG, False,
        why="with a --load folder that holds a checkpoint it changes nothing; a --load folder without one (the "
            "auto-resume idiom) is refused with it, since Megatron-LM would exit instead of starting from scratch"),
    Arg("--step-batch-size-schedule", "refuse", "list", None, why="batch-size ramp-up is not implemented"),
    Arg("--no-load-rng", "skip", FLAG, False,
        why="the RNG states do not change what phoenix trains: dropout's are reseeded every step from the seed "
            "and the step"),
    Arg("--finetune", "refuse", FLAG, False,
        why="phoenix continues from a --load checkpoint's iteration when it holds optimizer state (a checkpoint "
            "without one starts at step 0)"),
    Arg("--exit-interval", "skip", int, None, why="phoenix ends a job at training.steps or its time limit"),
    Arg("--exit-duration-in-mins", "skip", int, None, why="phoenix ends a job at training.steps or its time limit"),
    Arg("--exit-signal-handler", "skip", FLAG, False, why="phoenix handles Slurm's signals itself"),
)

BY_FLAG: dict[str, Arg] = {a.flag: a for a in ARGS}

#: Megatron-LM arguments without a default that ``pretrain_gpt.py`` needs.
REQUIRED = ("--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length", "--micro-batch-size",
            "--train-iters", "--lr", "--data-path")

#: Arguments of Megatron-LM's sample-based training, each with the iteration-based one it stands for.
SAMPLE_BASED = {"--train-samples": "--train-iters", "--lr-decay-samples": "--lr-decay-iters",
                "--lr-warmup-samples": "--lr-warmup-iters"}



def _schema_choices(model, name: str) -> tuple[str, ...]:
    """The values a ``Literal`` field of the job config's schema allows (Megatron-LM spells these the same)."""
    from typing import get_args

    return get_args(model.model_fields[name].annotation)


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting."""

    def error(self, message):  # noqa: D102 - argparse's hook
        raise ConfigError(_argparse_problem(message), source="the Megatron-LM arguments",
                          note="nothing was written (docs/megatron-args.md lists every argument and its field)")


def _argparse_problem(message: str) -> str:
    """argparse's error ``message`` in the project's form: a value argparse's ``int`` or ``float`` refuses
    (``argument --train-samples: invalid int value: '1e3'``) as ``--train-samples: '1e3' (allowed: a whole
    number, e.g. 1000)``; any other message as ``Megatron-LM arguments: <message>``. Pure."""
    m = re.fullmatch(r"argument (\S+?)(?:/\S+)?: invalid (int|float) value: (.*)", message, re.S)
    if m is None:
        return f"Megatron-LM arguments: {message}"
    flag, kind, shown = m.groups()
    try:
        value = float(ast.literal_eval(shown))
    except (ValueError, SyntaxError, TypeError):
        value = math.nan
    if kind == "int":
        example = int(value) if math.isfinite(value) and value == int(value) else 1000
        return f"{flag}: {shown} is not a whole number (allowed: a whole number, e.g. {example})"
    return f"{flag}: {shown} is not a number (allowed: a number, e.g. 0.0003 or 3e-4)"


def _parser() -> _Parser:
    p = _Parser(prog="pretrain_gpt.py", add_help=False, allow_abbrev=False)
    for a in ARGS:
        if a.type == FLAG:
            p.add_argument(a.flag, dest=a.dest, action="store_true", default=None)
        elif a.type == "list":
            p.add_argument(a.flag, dest=a.dest, nargs="+", default=None)
        else:
            p.add_argument(a.flag, dest=a.dest, type=a.type, default=None)
    return p


_PUNCT = set("();<>|&")
_VAR = re.compile(r"^\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?:\[[@*]\])?\}|([A-Za-z_][A-Za-z0-9_]*))$")


def _line_words(line: str, lineno: int) -> list[str]:
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    lex.commenters = "#"
    try:
        return list(lex)
    except ValueError as exc:
        raise ConfigError(f"--args-file line {lineno}: cannot split as shell words: {exc}") from None


def split_args_text(text: str, *, launch_not_reached: bool = False) -> tuple[list[str], list[str]]:
    """The ``pretrain_gpt.py`` arguments of a launch script or of a fragment of one, and the lines left out.

    Shell words with ``#`` comments and backslash continuations. Bash arrays (``NAME=( ... )``, ``NAME+=( ...
    )``) are collected. When a command runs ``...pretrain_gpt.py``, its words up to the first shell operator
    (``|``, ``;``, ``&&``, a redirection) are the arguments, ``"${NAME[@]}"`` / ``$NAME`` expanded from the
    arrays; every other line (the launcher's set-up, assignments, ``export``) is left out and returned. Without
    such a command, the arguments are the arrays' words in order of definition and the lines that start with
    an option (``--...``); other lines are left out and returned.

    A script with variables is read with bash first (:func:`phoenix_hpc.config.launch_script.read_launch`);
    this reading is for fragments and for scripts whose words are all literal. ``launch_not_reached``: bash read
    the script to its end without reaching a ``pretrain_gpt.py`` command, so one found here is in a branch the
    script does not take, and is refused.

    Returns ``(arguments, left-out lines)``. Raises ConfigError for a line the shell could not split, an array
    never closed, a variable whose value is not known here (``$DATA``, ``$(...)``), or a launch command that
    ``launch_not_reached`` says bash did not reach."""
    joined = re.sub(r"\\\r?\n", " ", text)
    arrays: dict[str, list[str]] = {}
    order: list[str] = []
    current: str | None = None
    command: list[str] | None = None
    loose: list[str] = []
    left_out: list[str] = []
    for lineno, line in enumerate(joined.splitlines(), 1):
        words = _line_words(line, lineno)
        i = 0
        while i < len(words):
            w = words[i]
            if current is not None:
                if w == ")":
                    current = None
                else:
                    arrays[current].append(w)
                i += 1
                continue
            m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(\+?)=", w)
            if m and i + 1 < len(words) and words[i + 1] == "(":
                name = m.group(1)
                if not m.group(2) or name not in arrays:
                    arrays[name] = []
                if name not in order:
                    order.append(name)
                current = name
                i += 2
                continue
            launch = next((k for k in range(i, len(words)) if words[k].endswith("pretrain_gpt.py")), None)
            if launch is not None:  # the launcher's own words before it (srun, torchrun, python) are not arguments
                command = []
                for j in range(launch + 1, len(words)):
                    nxt = words[j + 1] if j + 1 < len(words) else ""
                    if set(words[j]) <= _PUNCT or (words[j].isdigit() and nxt[:1] in "<>" and nxt):
                        break
                    command.append(words[j])
                break
            if i == 0 and not w.startswith("-"):
                left_out.append(line.strip())
                break
            loose.append(w)
            i += 1
    if current is not None:
        raise ConfigError(f"--args-file: the array {current}=( is never closed with ')' (allowed: closed arrays)")
    if command is not None and launch_not_reached:
        raise ConfigError("--args-file: its pretrain_gpt.py command is not reached when bash reads the script with "
                          "the values here (a branch not taken: an if, case or loop whose condition is false; "
                          "allowed: a script that reaches it with its --script-arg values and environment)")
    if command is not None:
        args: list[str] = []
        for w in command:
            v = _VAR.match(w)
            name = v and (v.group(1) or v.group(2))
            if name and name in arrays:
                args += arrays[name]
            else:
                args.append(w)
    else:
        args = [w for name in order for w in arrays[name]] + loose
    unexpanded = [w for w in args if "$" in w]
    if unexpanded:
        raise ConfigError(f"--args-file: {', '.join(map(repr, unexpanded))} holds a shell variable whose value is "
                          "not known here (allowed: literal values, or the file's own bash arrays; expand the "
                          "variables first)")
    return args, left_out


@dataclass(frozen=True)
class Unreadable:
    """What a ``read_vocab`` callable of :func:`convert` returns for a tokenizer file that is here but cannot be
    read: ``reason`` names the file and says why (the OSError's, JSON decoder's or library's own text)."""

    reason: str


@dataclass
class Conversion:
    """The result of :func:`convert`. ``config``: the job config as a plain mapping (JobConfig's shape);
    ``carried``: ``(flag, field, value)`` of every argument carried over; ``not_carried``: ``(flag, value, why)``
    of every argument given (or defaulted by Megatron-LM to a value phoenix cannot take) that is not;
    ``dropped``: the subset of those the user dropped although they change the training, ``(flag, value,
    why)`` with ``value`` the argument's words exactly as given (a tuple, the option word first: every value
    of an argument phoenix does not know is kept) or, for one left out, Megatron-LM's default (shown with
    :func:`as_given`); ``records``:
    ``(flag, value)`` kept as comments; ``notes``: derived values worth a comment (the padded vocabulary)."""

    config: dict[str, Any]
    carried: list[tuple[str, str, Any]] = field(default_factory=list)
    not_carried: list[tuple[str, Any, str]] = field(default_factory=list)
    dropped: list[tuple[str, Any, str]] = field(default_factory=list)
    records: list[tuple[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def blend_from_list(items: list[str]) -> tuple[list[dict[str, Any]], str | None]:
    """``--data-path``'s words -> ``data.blend`` entries, read as megatron-core's ``get_blend_from_list``
    (``megatron/core/datasets/utils.py``): an even number of words whose every other word, from the first, is a
    number are weights and prefixes (``30 A 70 B``); otherwise every word is a prefix, without weights.
    Returns ``(entries, None)`` or ``([], problem)`` for a list whose weights are partly numbers."""
    if len(items) % 2 == 0:
        pairs = [(items[i], items[i + 1]) for i in range(0, len(items), 2)]
        weights = []
        for w, _ in pairs:
            try:
                weights.append(float(w))
            except ValueError:
                weights.append(None)
        if all(w is not None for w in weights):
            return [{"path": p, "weight": w} for (_, p), w in zip(pairs, weights)], None
        if any(w is not None for w in weights):
            return [], (f"--data-path: {' '.join(items)!r} mixes weights and prefixes (allowed: 'W1 P1 W2 P2 ...' "
                        "with a number before every prefix, or prefixes alone)")
    numeric = [p for p in items if _is_number(p)]
    if numeric:
        return [], (f"--data-path: {' '.join(items)!r}: {', '.join(map(repr, numeric))} would be read as a dataset "
                    "prefix (megatron-core takes every word of a list that is not 'W1 P1 W2 P2 ...' as a prefix); "
                    "allowed: a number before every prefix, or prefixes alone")
    return [{"path": p} for p in items], None


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def padded_vocab(vocab: int, divisible_by: int, tp: int) -> int:
    """Megatron-LM's padded vocabulary (``megatron/training/vocab_utils.py``): the smallest multiple of
    ``divisible_by x tp`` that is at least ``vocab``."""
    multiple = divisible_by * tp
    return int(math.ceil(vocab / multiple) * multiple)


def warmup_steps_of_fraction(fraction: float, decay_iters: int) -> int | None:
    """Warm-up steps for Megatron-LM's ``--lr-warmup-fraction``: ``fraction x decay_iters`` (Megatron-LM's
    ``lr_warmup_steps = lr_warmup_fraction x lr_decay_steps``, ``megatron/training/training.py``, kept as a
    float there) when that is a whole number of steps as a checkpoint's scheduler is compared
    (:func:`phoenix_hpc.engines.megatron_schedule.whole`: 0.29 x 100, 28.999999999999996 in binary floating
    point, is 29); None when it is not (0.25 x 10: Megatron-LM warms up over 2.5 iterations, which
    ``training.warmup_steps`` cannot say). Pure."""
    from phoenix_hpc.engines.megatron_schedule import whole

    return whole(float(fraction) * int(decay_iters))


def warmup_not_before_decay(given: dict[str, Any], cfg: dict[str, Any]) -> list[str]:
    """Megatron-LM's refusal of an iteration-counted warm-up that is not shorter than its decay, as a problem
    naming the arguments (empty when there is none). megatron-core's ``OptimizerParamScheduler`` asserts
    ``lr_warmup_steps < lr_decay_steps`` (``megatron/core/optimizer_param_scheduler.py``), both in samples:
    ``--lr-warmup-iters`` (or ``--lr-warmup-fraction`` x the decay) x global batch against ``--lr-decay-iters``
    (absent: ``--train-iters``) x global batch (``get_optimizer_param_scheduler``, ``megatron/training/
    training.py``), so pretrain_gpt.py stops before its first step when the two are equal. phoenix's own schema
    allows them equal (min_lr right after the warm-up); a converted job is refused as Megatron-LM would refuse
    it. ``cfg``: the converted config so far; a warm-up or decay refused already, and a sample-counted run,
    are left to their own checks. Pure."""
    training = cfg.get("training", {})
    warmup = training.get("warmup_steps")
    if warmup is None or "--train-samples" in given or "train_samples" in training:
        return []
    if "--lr-decay-iters" in given:
        if "lr_decay_steps" not in training:
            return []
        decay, decay_arg = training["lr_decay_steps"], f"--lr-decay-iters {training['lr_decay_steps']}"
    elif "steps" in training:
        decay, decay_arg = training["steps"], f"--train-iters {training['steps']} (no --lr-decay-iters)"
    else:
        return []
    if warmup < decay:
        return []
    if "--lr-warmup-fraction" in given:
        warmup_arg = f"--lr-warmup-fraction {given['--lr-warmup-fraction']} ({warmup} iterations)"
        allowed = "a fraction below 1"
    else:
        warmup_arg, allowed = f"--lr-warmup-iters {warmup}", f"--lr-warmup-iters below {decay}"
    return [f"{warmup_arg} and {decay_arg}: the warm-up is not shorter than the decay, and Megatron-LM's scheduler "
            f"asserts that it is (lr_warmup_steps < lr_decay_steps, megatron/core/optimizer_param_scheduler.py), so "
            f"pretrain_gpt.py would stop before its first step (allowed: {allowed}, or a longer decay)"]


def swiglu_ffn(hidden: int) -> int:
    """Megatron-LM's FFN size with ``--swiglu`` and no ``--ffn-hidden-size``: ``int(4 h x 2/3 / 64) x 64``
    (``megatron/training/arguments.py``)."""
    return int((4 * hidden * 2 / 3) / 64) * 64


def _set(cfg: dict, dotted: str, value: Any) -> None:
    node = cfg
    *parents, last = dotted.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value


def _normalise_drop(names: tuple[str, ...] | list[str]) -> set[str]:
    return {"--" + n.lstrip("-") for n in names}


def _is_option(word: str) -> bool:
    """An option word (``--x``, ``--x=V``), not a value: a negative number is a value, as argparse reads it."""
    return word.startswith("-") and not _is_number(word)


def arguments_as_given(tokens: list[str]) -> list[tuple[str, tuple[str, ...]]]:
    """Every option of ``tokens`` in order with its words exactly as given: ``(flag, words)``, ``words``
    holding the option word itself (``--x`` or ``--x=V``) and the values that follow it. An option of
    :data:`ARGS` takes the values argparse gives it (none for a switch or the ``--x=V`` form, one for a
    valued argument, every following value for a list); an option phoenix does not know takes every value up
    to the next option (its arity is not known here). Values no option takes are not in any entry. Pure."""
    out: list[tuple[str, tuple[str, ...]]] = []
    i = 0
    while i < len(tokens):
        word = tokens[i]
        i += 1
        if not _is_option(word):
            continue
        flag = word.split("=", 1)[0]
        a = BY_FLAG.get(flag)
        j = i
        while j < len(tokens) and not _is_option(tokens[j]):
            j += 1
        if a is not None and a.type != "list":
            j = i if a.type == FLAG or "=" in word else min(j, i + 1)
        elif a is not None and "=" in word:
            j = i
        out.append((flag, (word, *tokens[i:j])))
        i = j
    return out


def as_given(flag: str, value: Any) -> str:
    """A dropped argument as the config's comment and standard error show it (:attr:`Conversion.dropped`):
    its words as given (shell-quoted where a shell would need it), or, for one left out, Megatron-LM's default
    it stands for. A word a comment line cannot hold (a newline, a control character) is written with Python's
    escapes instead."""
    if isinstance(value, tuple):
        return " ".join(shlex.quote(w) if w.isprintable() else repr(w) for w in value)
    return f"{flag} {value!r} (Megatron-LM's default when absent)"


def _same(value: Any, allowed: Any) -> bool:
    if isinstance(allowed, float):
        return isinstance(value, (int, float)) and math.isclose(float(value), allowed, rel_tol=1e-9, abs_tol=0.0)
    return value == allowed


def _carry_eval_and_logging(given: dict[str, Any], eff: Callable[[str], Any], carry: Callable[[str, str, Any], None],
                            conv: Conversion, problems: list[str]) -> None:
    """Evaluation and metrics logging as Megatron-LM's ``pretrain_gpt.py`` does them (``training.py``: an
    evaluation after every iteration that is a multiple of ``--eval-interval`` when ``--eval-iters > 0`` and the
    validation part of ``--split`` is not empty; TensorBoard when ``--tensorboard-dir`` is given; W&B when
    ``--wandb-project`` is given)."""
    interval, iters = eff("--eval-interval"), eff("--eval-iters")
    for flag, value in (("--eval-interval", interval), ("--eval-iters", iters)):
        if value is not None and value < 0:
            problems.append(f"{flag}: {value} (allowed: a non-negative integer)")
    split = given.get("--split", MEGATRON_DEFAULT_SPLIT)
    try:
        valid = split_vector(split)[1] > 0
    except ValueError:
        valid = False  # the config's own check names a bad --split (data.split)
    if interval is not None and interval > 0 and iters > 0 and valid:
        carry("--eval-interval", "training.eval_interval", interval)
        carry("--eval-iters", "training.eval_iters", iters)
    elif "--eval-interval" in given or "--eval-iters" in given:
        why = ("--eval-iters is 0" if not iters else "--eval-interval is 0" if not interval
               else f"the validation part of --split {split!r} is empty")
        for flag in ("--eval-interval", "--eval-iters"):
            if flag in given:
                conv.not_carried.append((flag, given[flag], f"Megatron-LM would not evaluate: {why}"))
    if "--tensorboard-dir" in given:
        carry("--tensorboard-dir", "logging.tensorboard", True)
        carry("--tensorboard-dir", "logging.tensorboard_dir", given["--tensorboard-dir"])
    if "--wandb-project" in given:
        carry("--wandb-project", "logging.wandb.project", given["--wandb-project"])
        if "--wandb-exp-name" in given:
            carry("--wandb-exp-name", "logging.wandb.name", given["--wandb-exp-name"])
    elif "--wandb-exp-name" in given:
        conv.not_carried.append(("--wandb-exp-name", given["--wandb-exp-name"],
                                 "Megatron-LM logs to W&B only with --wandb-project"))


def convert(tokens: list[str], *, drop: tuple[str, ...] | list[str] = (), name: str = "megatron-gpt",
            nodes: int | None = None, spares: int | None = None,
            read_vocab: Callable[[dict[str, Any]], int | Unreadable | None] | None = None,
            has_tracker: Callable[[str], bool] | None = None,
            read_data_args: Callable[[str], list[str] | None] | None = None,
            engine: str = "megatron") -> Conversion:
    """Convert a ``pretrain_gpt.py`` argument list into a job config mapping for ``engine`` (``megatron``, or
    ``torch``: the same model, training, data and parallelism, without the ``megatron`` section and the
    Megatron-LM checkpoint fields, :mod:`phoenix_hpc.config.megatron_torch`; what the torch engine cannot train is
    left to the job schema to refuse).

    ``drop``: argument names (with or without ``--``) the user accepts to lose although they change the
    training. ``nodes`` / ``spares``: ``resources.nodes`` / ``resources.spares`` (phoenix's, not Megatron-LM's).
    ``read_vocab(args)``: the tokenizer's vocabulary size from its files, :class:`Unreadable` when a file is here
    but cannot be read (its reason is in the note or problem), or None when no file is here; used when
    ``--vocab-size`` is not given. ``has_tracker(folder)``: whether ``--load``'s folder (as given) holds
    Megatron-LM's ``latest_checkpointed_iteration.txt`` where the conversion runs (None: no file is read, so
    none is found); see :func:`load_decision`. ``read_data_args(path)``: the white-space separated words of
    ``--data-args-path``'s file, or None when it cannot be read here (None: no file is read). Raises ConfigError listing every problem (see the module
    docstring), and ValueError for an ``engine`` not in :data:`phoenix_hpc.config.megatron_torch.ENGINES`."""
    if engine not in megatron_torch.ENGINES:
        raise ValueError(f"engine: {engine!r} (allowed: {', '.join(megatron_torch.ENGINES)})")
    for_torch = engine == "torch"
    drops = _normalise_drop(drop)
    named = {t.split("=", 1)[0] for t in tokens if t.startswith("--")}  # --x V and --x=V alike
    unknown_drops = sorted(d for d in drops if d not in BY_FLAG and d not in named)
    ns, rest = _parser().parse_known_args(tokens)
    given = {a.flag: getattr(ns, a.dest) for a in ARGS if getattr(ns, a.dest) is not None}
    problems: list[str] = []
    conv = Conversion(config={"name": name, "engine": engine})
    if for_torch:
        conv.notes.append(megatron_torch.NOTE)

    occurrences = arguments_as_given(tokens)
    words_of = dict(occurrences)  # the last one of an argument given twice, as argparse keeps it
    unknown = [(flag, words) for flag, words in occurrences if flag not in BY_FLAG]
    claimed = Counter(v for _, words in unknown for v in words[1:])  # an unknown argument's values
    stray_words = []
    for t in rest:
        if _is_option(t):
            continue
        if claimed[t] > 0:
            claimed[t] -= 1
        else:
            stray_words.append(t)
    if stray_words:
        problems.append(f"Megatron-LM arguments: {' '.join(stray_words)!r} follows no argument (allowed: values "
                        "after their argument)")
    for flag, words in unknown:
        if flag in drops:
            conv.dropped.append((flag, words, "not known to phoenix; dropped as asked"))
        else:
            problems.append(f"{flag}: not known to phoenix (given as {shlex.join(words)}), so what it changes cannot "
                            f"be carried over (allowed: the arguments of docs/megatron-args.md; --drop "
                            f"{flag.lstrip('-')} to go on without it)")
    drop_reported = set(unknown_drops)
    for d in sorted(drops):
        a = BY_FLAG.get(d)
        if a is not None and a.kind not in ("same", "refuse") and d in named:
            drop_reported.add(d)
            problems.append(f"--drop {d.lstrip('-')}: {d} is carried over or listed, not refused, so there is nothing "
                            "to drop (allowed: arguments the conversion refuses)")
    for d in unknown_drops:
        problems.append(f"--drop {d.lstrip('-')}: not an argument of this list (allowed: arguments given, or "
                        "Megatron-LM arguments of docs/megatron-args.md)")
    droppable = [flag for flag, _ in unknown]  # every argument that changes the training, in order

    def eff(flag: str) -> Any:
        a = BY_FLAG[flag]
        return given.get(flag, a.default)

    for flag in REQUIRED:
        if flag == "--data-path" and "--data-args-path" in given:
            continue
        if flag == "--train-iters" and "--train-samples" in given:
            continue
        if flag not in given:
            also = " or --train-samples" if flag == "--train-iters" else ""
            problems.append(f"{flag}: missing (pretrain_gpt.py needs it{also}; allowed: any value of its type)")

    # arguments that change the training unless their effective value is phoenix's
    tp = eff("--tensor-model-parallel-size")
    heads, hidden = given.get("--num-attention-heads"), given.get("--hidden-size")
    for a in ARGS:
        value = eff(a.flag)
        if a.kind == "same":
            allowed = a.allowed
            if a.flag == "--kv-channels":
                allowed = hidden // heads if hidden and heads else None
                if value is None or allowed is None:
                    continue
            if _same(value, allowed):
                if a.flag in given:
                    conv.carried.append((a.flag, "(phoenix's own)", value))
                continue
            shown = f"{value!r}" + ("" if a.flag in given else " (Megatron-LM's default when absent)")
            why = f"{a.why} (allowed: {allowed!r})"
            droppable.append(a.flag if a.flag in given else f"{a.flag} (Megatron-LM's default {value!r})")
            if a.flag in drops:
                conv.dropped.append((a.flag, words_of.get(a.flag, value), why))
            else:
                problems.append(f"{a.flag}: {shown} changes the training: {why}; --drop {a.flag.lstrip('-')} to "
                                "train with phoenix's value knowingly")
        elif a.kind == "refuse" and a.flag in given:
            droppable.append(a.flag)
            if a.flag in drops:
                conv.dropped.append((a.flag, words_of[a.flag], a.why))
            else:
                problems.append(f"{a.flag}: {given[a.flag]!r} changes the training: {a.why}; --drop "
                                f"{a.flag.lstrip('-')} to go on without it")
        elif a.kind == "skip" and a.flag in given:
            conv.not_carried.append((a.flag, given[a.flag], a.why))
        elif a.kind == "record" and a.flag in given:
            conv.records.append((a.flag, given[a.flag]))

    dropped_flags = {flag for flag, _, _ in conv.dropped}
    for d in sorted(drops - dropped_flags - drop_reported):
        problems.append(f"--drop {d.lstrip('-')}: matches no argument that changes the training ({d} is not given, "
                        "or its value is phoenix's), so there is nothing to drop (allowed: the arguments given, or "
                        "left to a Megatron-LM default, that change the training: "
                        f"{', '.join(f.lstrip('-') for f in droppable) or 'none in this list'})")

    cfg = conv.config

    def carry(flag: str, dotted: str, value: Any) -> None:
        _set(cfg, dotted, value)
        conv.carried.append((flag, dotted, value))

    # model shape
    for flag, dotted in (("--num-layers", "model.layers"), ("--hidden-size", "model.hidden_size"),
                         ("--num-attention-heads", "model.heads"), ("--seq-length", "model.seq_length")):
        if flag in given:
            carry(flag, dotted, given[flag])
    if eff("--group-query-attention"):
        carry("--num-query-groups", "model.num_query_groups", eff("--num-query-groups"))
    elif "--num-query-groups" in given:
        conv.not_carried.append(("--num-query-groups", given["--num-query-groups"],
                                 "used by Megatron-LM only with --group-query-attention"))
    swiglu = bool(eff("--swiglu"))
    if "--ffn-hidden-size" in given:
        carry("--ffn-hidden-size", "model.ffn_hidden_size", given["--ffn-hidden-size"])
    elif hidden:
        carry("--swiglu" if swiglu else "--hidden-size", "model.ffn_hidden_size",
              swiglu_ffn(hidden) if swiglu else 4 * hidden)
    rotary = bool(eff("--use-rotary-position-embeddings"))
    pos = "rope" if rotary else eff("--position-embedding-type")
    if pos not in ("learned_absolute", "rope"):
        problems.append(f"--position-embedding-type: {pos!r} is not implemented (allowed: learned_absolute, rope)")
    else:
        carry("--use-rotary-position-embeddings" if rotary else "--position-embedding-type",
              "model.position_embedding_type", pos)
    if pos == "rope":
        carry("--rotary-base", "model.rotary_base", eff("--rotary-base"))
    mpe, seq = given.get("--max-position-embeddings"), given.get("--seq-length")
    if mpe is not None and seq is not None and mpe < seq:
        problems.append(f"--max-position-embeddings: {mpe} is below --seq-length {seq} (allowed: >= {seq})")
    carry("--swiglu", "model.activation", "swiglu" if swiglu else "gelu")
    norm = eff("--normalization")
    if norm not in ("LayerNorm", "RMSNorm"):
        problems.append(f"--normalization: {norm!r} is not implemented (allowed: LayerNorm, RMSNorm)")
    else:
        carry("--normalization", "model.normalization", norm)
    carry("--disable-bias-linear", "model.add_bias_linear", not eff("--disable-bias-linear"))
    carry("--untie-embeddings-and-output-weights", "model.untie_embeddings_and_output_weights",
          bool(eff("--untie-embeddings-and-output-weights")))
    if eff("--bf16") and eff("--fp16"):
        problems.append("--bf16 and --fp16: both given (allowed: one of them, or neither for float32)")
    dtype = "bfloat16" if eff("--bf16") else "float16" if eff("--fp16") else "float32"
    carry("--bf16" if dtype == "bfloat16" else "--fp16" if dtype == "float16" else "(neither --bf16 nor --fp16)",
          "model.dtype", dtype)
    for flag, dotted in (("--attention-dropout", "model.attention_dropout"), ("--hidden-dropout", "model.hidden_dropout")):
        prob = eff(flag)  # Megatron-LM's 0.1 when absent
        if not 0 <= prob < 1:
            problems.append(f"{flag}: {prob} (allowed: 0 <= p < 1)")
        elif prob == 0:  # phoenix's default: not written
            if flag in given:
                conv.carried.append((flag, "(phoenix's own)", prob))
        else:
            carry(flag, dotted, prob)
    if "--init-method-std" in given:  # absent: Megatron-LM's 0.02, phoenix's default (not written)
        std = given["--init-method-std"]
        if not (math.isfinite(std) and std > 0):
            problems.append(f"--init-method-std: {std} (allowed: a finite number > 0)")
        else:
            carry("--init-method-std", "model.init_method_std", std)

    # vocabulary: the model's (padded) size
    # Megatron-LM pads the tokenizer's own size for the tokenizers built from files (GPT-2 BPE, SentencePiece,
    # Hugging Face: megatron/core/tokenizers/utils/build_tokenizer.py); --vocab-size counts only for the
    # NullTokenizer and TikTokenizer, and when no --tokenizer-type is given
    vocab = given.get("--vocab-size")
    source = "--vocab-size"
    ttype = given.get("--tokenizer-type")
    from_files = ttype is not None and ttype not in ("NullTokenizer", "NullMultimodalTokenizer", "TikTokenizer")
    read = read_vocab(given) if read_vocab is not None and (vocab is None or from_files) else None
    unreadable = ""
    if isinstance(read, Unreadable):
        read, unreadable = None, f": {read.reason}"
    if read is not None:
        if vocab is not None and vocab != read:
            conv.notes.append(f"model.vocab_size: from the tokenizer's files ({read} tokens), not --vocab-size {vocab}: "
                              f"Megatron-LM sizes the embedding by the tokenizer's own vocabulary with "
                              f"--tokenizer-type {ttype}")
        vocab, source = read, "tokenizer files"
    elif vocab is not None and from_files:
        conv.notes.append(f"model.vocab_size: from --vocab-size {vocab}, since the tokenizer's files could not be read "
                          f"here{unreadable}; Megatron-LM sizes the embedding by the tokenizer's own vocabulary with "
                          f"--tokenizer-type {ttype}: check that it is {vocab}")
    if vocab is None:
        problems.append(f"--vocab-size: missing, and the tokenizer's vocabulary could not be read here{unreadable} "
                        "(allowed: --vocab-size N, or a readable --vocab-file / --tokenizer-model)")
    elif vocab < 1:
        problems.append(f"--vocab-size: {vocab} (allowed: a positive integer)")
    else:
        div = eff("--make-vocab-size-divisible-by")
        if div < 1:
            problems.append(f"--make-vocab-size-divisible-by: {div} (allowed: a positive integer)")
        else:
            t = tp if isinstance(tp, int) and tp > 0 else 1
            padded = padded_vocab(vocab, div, t)
            carry(source if source == "--vocab-size" else f"({source})", "model.vocab_size", padded)
            if padded != vocab:
                conv.notes.append(f"model.vocab_size: the vocabulary of {vocab} ({source}) padded to {padded}, a "
                                  f"multiple of make-vocab-size-divisible-by {div} x tp {t}, as Megatron-LM pads it")

    # megatron options: engine megatron's megatron section; engine torch has none, so each one given is listed
    options: list[tuple[str, str, Any]] = [("--transformer-impl", "megatron.transformer_impl",
                                            eff("--transformer-impl"))]
    if "--attention-backend" in given:
        options.append(("--attention-backend", "megatron.attention_backend", given["--attention-backend"]))
    if eff("--sequence-parallel") and eff("--tensor-model-parallel-size") == 1:
        # megatron/training/arguments.py: "Disabling sequence parallelism because tensor model parallelism is
        # disabled" -- Megatron-LM trains without it at tp 1, and so does phoenix
        conv.not_carried.append(("--sequence-parallel", True, "Megatron-LM turns sequence parallelism off at "
                                 "--tensor-model-parallel-size 1 (it warns), and so does this job"))
    elif eff("--sequence-parallel"):
        options.append(("--sequence-parallel", "megatron.sequence_parallel", True))
    gran = given.get("--recompute-granularity") or ("selective" if eff("--recompute-activations") else None)
    if gran is not None:
        allowed = [g for g in _schema_choices(MegatronOptions, "recompute_granularity") if g != "none"]
        if gran not in allowed:
            problems.append(f"--recompute-granularity: {gran!r} (allowed: {', '.join(allowed)})")
        else:
            options.append(("--recompute-granularity" if "--recompute-granularity" in given
                            else "--recompute-activations", "megatron.recompute_granularity", gran))
    for flag, dotted, value in options:
        if not for_torch:
            carry(flag, dotted, value)
    listed = {flag for flag, _, _ in conv.not_carried}
    for flag in megatron_torch.OPTION_ARGS if for_torch else ():
        if flag in given and flag not in listed:
            conv.not_carried.append((flag, given[flag], megatron_torch.NO_SUCH_OPTION))

    # parallelism
    carry("--tensor-model-parallel-size", "parallelism.tp", tp)
    carry("--pipeline-model-parallel-size", "parallelism.pp", eff("--pipeline-model-parallel-size"))

    # training
    for flag, dotted in (("--micro-batch-size", "training.micro_batch_size"), ("--lr", "training.lr")):
        if flag in given:
            carry(flag, dotted, given[flag])
    if "--global-batch-size" in given:
        carry("--global-batch-size", "training.global_batch_size", given["--global-batch-size"])
    elif "--micro-batch-size" in given:
        problems.append("--global-batch-size: missing (Megatron-LM's default is micro-batch-size x dp, which depends "
                        "on the job's nodes; allowed: give it explicitly)")
    for flag, dotted in (("--min-lr", "training.min_lr"), ("--weight-decay", "training.weight_decay"),
                         ("--clip-grad", "training.grad_clip"), ("--seed", "training.seed"),
                         ("--log-interval", "training.log_interval")):
        carry(flag, dotted, eff(flag))
    style = eff("--lr-decay-style")
    schedules = _schema_choices(TrainingConfig, "lr_schedule")
    if style not in schedules:
        problems.append(f"--lr-decay-style: {style!r} is not implemented (allowed: {', '.join(schedules)})")
    else:
        carry("--lr-decay-style", "training.lr_schedule", style)
    if "--train-samples" in given:
        _carry_sample_schedule(given, eff, carry, conv, problems)
    elif "--train-iters" in given:
        _carry_iteration_schedule(given, eff, carry, cfg, conv, problems)

    # data and checkpoints
    paths, source = given.get("--data-path"), "--data-path"
    if "--data-args-path" in given:
        source = "--data-args-path"
        file = given["--data-args-path"]
        if paths is not None:
            problems.append("--data-path and --data-args-path: both given (allowed: one of them, as Megatron-LM "
                            "asserts)")
            paths = None
        else:
            paths = read_data_args(file) if read_data_args is not None else None
            if paths is None:
                problems.append(f"--data-args-path: {file!r} cannot be read here (allowed: a readable text file of "
                                "weights and prefixes, W1 P1 W2 P2 ... or prefixes alone)")
            elif not paths:
                problems.append(f"--data-args-path: {file!r} holds no word (allowed: weights and prefixes, W1 P1 "
                                "W2 P2 ... or prefixes alone)")
                paths = None
    if paths is not None:
        blend, problem = blend_from_list(paths)
        if problem is not None:
            problems.append(problem if source == "--data-path" else f"{problem} (read from --data-args-path "
                            f"{given['--data-args-path']!r})")
        else:
            carry(source, "data.blend", blend)
    if "--split" in given:
        carry("--split", "data.split", given["--split"])
    for flag in ("--save", "--load", "--tensorboard-dir"):  # '' would be made the launch folder itself
        if given.get(flag) == "":
            problems.append(f"{flag}: '' (allowed: a non-empty path)")
    if "--save" in given:
        carry("--save", "resilience.checkpoint.path", given["--save"])
        if for_torch:
            conv.not_carried.append(("--save", given["--save"], megatron_torch.SAVE_WHY))
        else:
            carry("--save", "resilience.checkpoint.save_megatron", given["--save"])
    if given.get("--load"):
        tracker = has_tracker is not None and has_tracker(given["--load"])
        decision, why = load_decision(given["--load"], given.get("--save"), tracker)
        if for_torch and decision == "load":
            problems.append(megatron_torch.load_refusal(given["--load"]))
        elif for_torch and decision == "auto-resume" and not given.get("--exit-on-missing-checkpoint"):
            conv.not_carried.append(("--load", given["--load"], megatron_torch.AUTO_RESUME_WHY))
        elif decision == "load":
            carry("--load", "resilience.checkpoint.load_megatron", given["--load"])
        elif decision == "auto-resume" and given.get("--exit-on-missing-checkpoint"):
            problems.append(f"--exit-on-missing-checkpoint: the --load folder {given['--load']!r} holds no "
                            "latest_checkpointed_iteration.txt where this command runs, so Megatron-LM would exit "
                            "instead of training (allowed: a --load folder holding a checkpoint; or leave "
                            "--exit-on-missing-checkpoint out, to start from scratch and continue there)")
        elif decision == "auto-resume":
            conv.not_carried.append(("--load", given["--load"], why))
        else:
            problems.append(f"--load: {given['--load']!r} {why}")
    if "--save-interval" in given:
        carry("--save-interval", "resilience.checkpoint.interval_steps", given["--save-interval"])
    _carry_eval_and_logging(given, eff, carry, conv, problems)
    problems += warmup_not_before_decay(given, cfg)
    if nodes is not None:
        _set(cfg, "resources.nodes", nodes)
    if spares is not None:
        _set(cfg, "resources.spares", spares)

    if problems:
        raise ConfigError(problems, source="the Megatron-LM arguments",
                          note="nothing was written (docs/megatron-args.md lists every argument and its field)")
    return conv


def _carry_iteration_schedule(given: dict[str, Any], eff: Callable[[str], Any],
                              carry: Callable[[str, str, Any], None], cfg: dict, conv: Conversion,
                              problems: list[str]) -> None:
    """Iteration-based training (``--train-iters``): ``training.steps``, the warm-up and the decay in iterations.
    Megatron-LM's ``validate_args`` asserts that no sample-based argument is set beside it (a
    ``--lr-warmup-samples 0`` is Megatron-LM's default and changes nothing)."""
    carry("--train-iters", "training.steps", given["--train-iters"])
    for flag in ("--lr-decay-samples", "--lr-warmup-samples"):
        if flag in given and (flag == "--lr-decay-samples" or given[flag] != 0):
            problems.append(f"{flag}: {given[flag]} beside --train-iters (allowed: {SAMPLE_BASED[flag]} with "
                            "--train-iters, or --train-samples instead of --train-iters: Megatron-LM asserts one "
                            "unit for the run and its schedule)")
    if given.get("--lr-warmup-samples") == 0:
        conv.not_carried.append(("--lr-warmup-samples", 0, "Megatron-LM's default: no warm-up counted in samples"))
    if "--lr-warmup-fraction" in given and given.get("--lr-warmup-iters", 0) != 0:
        problems.append(f"--lr-warmup-fraction and --lr-warmup-iters: both given ({given['--lr-warmup-fraction']} "
                        f"and {given['--lr-warmup-iters']}) (allowed: one of them; --lr-warmup-iters 0, its default, "
                        "beside the fraction: Megatron-LM asserts lr_warmup_iters == 0 when a fraction is given)")
    elif "--lr-warmup-fraction" in given:
        if given.get("--lr-warmup-iters") == 0:
            conv.not_carried.append(("--lr-warmup-iters", 0, "Megatron-LM's default, accepted beside "
                                     "--lr-warmup-fraction: the warm-up is the fraction's"))
        frac = given["--lr-warmup-fraction"]
        decay = given.get("--lr-decay-iters") or given.get("--train-iters") or 0
        if not 0.0 <= frac <= 1.0:
            problems.append(f"--lr-warmup-fraction: {frac} (allowed: 0 .. 1)")
        else:
            steps = warmup_steps_of_fraction(frac, decay)
            if steps is None:
                problems.append(f"--lr-warmup-fraction: {frac} of {decay} decay iterations is "
                                f"{frac * decay!r} warm-up iterations, not a whole number (allowed: a fraction "
                                "giving whole iterations, or --lr-warmup-iters N)")
            else:
                carry("--lr-warmup-fraction", "training.warmup_steps", steps)
    else:
        carry("--lr-warmup-iters", "training.warmup_steps", eff("--lr-warmup-iters"))
    if "--lr-decay-iters" in given:
        decay_iters = given["--lr-decay-iters"]
        warmup = cfg.get("training", {}).get("warmup_steps")
        if decay_iters < 1:
            problems.append(f"--lr-decay-iters: {decay_iters} (allowed: a positive number of iterations)")
        elif warmup is not None and decay_iters < warmup:
            problems.append(f"--lr-decay-iters: {decay_iters} is shorter than the {warmup} warm-up iterations "
                            f"(allowed: > {warmup}: the decay counts from iteration 0, the warm-up in it, and "
                            "Megatron-LM's scheduler asserts warm-up < decay)")
        else:
            carry("--lr-decay-iters", "training.lr_decay_steps", decay_iters)


def _carry_sample_schedule(given: dict[str, Any], eff: Callable[[str], Any], carry: Callable[[str, str, Any], None],
                           conv: Conversion, problems: list[str]) -> None:
    """Sample-based training (``--train-samples``), as Megatron-LM's ``validate_args`` and
    ``get_optimizer_param_scheduler`` read it (``megatron/training/arguments.py``, ``training.py``): no
    ``--train-iters``, ``--lr-decay-iters`` or non-zero ``--lr-warmup-iters`` beside it; ``train_iters =
    train_samples // global_batch_size``; a decay of ``--lr-decay-samples`` (else ``--train-samples``) samples and a
    warm-up of ``--lr-warmup-samples``, or ``--lr-warmup-fraction`` x the decay samples (not with a non-zero
    ``--lr-warmup-samples``), shorter than the decay (megatron-core's scheduler asserts it)."""
    if "--train-iters" in given:
        problems.append(f"--train-iters and --train-samples: both given ({given['--train-iters']} and "
                        f"{given['--train-samples']}) (allowed: one of them, as Megatron-LM asserts)")
    for flag in ("--lr-decay-iters", "--lr-warmup-iters"):
        if flag in given and (flag == "--lr-decay-iters" or given[flag] != 0):
            sample_flag = next(k for k, v in SAMPLE_BASED.items() if v == flag)
            problems.append(f"{flag}: {given[flag]} beside --train-samples (allowed: {sample_flag} with "
                            "--train-samples, as Megatron-LM asserts one unit for the run and its schedule)")
    if given.get("--lr-warmup-iters") == 0:
        conv.not_carried.append(("--lr-warmup-iters", 0, "Megatron-LM's default: no warm-up counted in iterations"))
    samples = given["--train-samples"]
    g = given.get("--global-batch-size")
    bad = False
    for flag, low in (("--train-samples", 1), ("--lr-decay-samples", 1), ("--lr-warmup-samples", 0)):
        if flag in given and given[flag] < low:
            problems.append(f"{flag}: {given[flag]} (allowed: {'a positive' if low else 'a non-negative'} number "
                            "of samples)")
            bad = True
    if bad:
        return
    if g is not None and samples < g:
        problems.append(f"--train-samples: {samples} is less than one --global-batch-size ({g}): Megatron-LM would "
                        f"train {samples // g} iterations (allowed: >= {g})")
        return
    carry("--train-samples", "training.train_samples", samples)
    if g is not None:
        carry("--train-samples", "training.steps", samples // g)
    decay = given.get("--lr-decay-samples", samples)
    if "--lr-decay-samples" in given:
        carry("--lr-decay-samples", "training.lr_decay_samples", decay)
    warmup, flag = eff("--lr-warmup-samples"), "--lr-warmup-samples"
    if "--lr-warmup-fraction" in given:
        frac = given["--lr-warmup-fraction"]
        if warmup != 0:
            problems.append("--lr-warmup-fraction and --lr-warmup-samples: both given (allowed: one of them, as "
                            "Megatron-LM asserts)")
            return
        if not 0.0 <= frac <= 1.0:
            problems.append(f"--lr-warmup-fraction: {frac} (allowed: 0 .. 1)")
            return
        warmup, flag = warmup_steps_of_fraction(frac, decay), "--lr-warmup-fraction"
        if warmup is None:
            problems.append(f"--lr-warmup-fraction: {frac} of {decay} decay samples is {frac * decay!r} warm-up "
                            "samples, not a whole number (allowed: a fraction giving whole samples, or "
                            "--lr-warmup-samples N)")
            return
    if warmup >= decay:
        problems.append(f"{flag}: {given.get(flag, warmup)} gives {warmup} warm-up samples, not less than the {decay} "
                        "decay samples (allowed: fewer: Megatron-LM's scheduler asserts lr_warmup_steps < "
                        "lr_decay_steps, the decay counting from sample 0 with the warm-up in it)")
    elif flag in given:
        carry(flag, "training.lr_warmup_samples", warmup)


def load_decision(load: str, save: str | None, has_tracker: bool) -> tuple[str, str]:
    """What ``--load FOLDER`` becomes: ``(decision, why)``, decision ``"load"``, ``"auto-resume"`` or
    ``"refuse"``. Pure.

    Megatron-LM's ``load_checkpoint`` (``megatron/training/checkpointing.py``) starts from scratch, with a
    warning, when the ``--load`` folder holds no ``latest_checkpointed_iteration.txt``; launch scripts rely on
    it with ``--save DIR --load DIR``, so that the first run starts fresh and every later one continues
    (auto-resume). So:

    * the folder holds the tracker: ``"load"``, carried over as ``load_megatron`` (the job starts from that
      checkpoint);
    * no tracker and the same folder as ``--save`` (compared as normalised paths): ``"auto-resume"``, not
      carried over, ``why`` the reason: the job starts from scratch as Megatron-LM's first run would, and a
      resubmitted job (or ``phoenix submit --resume``) continues from phoenix's own newest checkpoint in that
      folder (``resilience.checkpoint.path``), where the Megatron-LM checkpoints of ``save_megatron`` appear too;
    * no tracker and another folder: ``"refuse"``, ``why`` the problem and what is allowed: most likely a
      wrong path, and a checkpoint directory without the tracker is bad input."""
    if has_tracker:
        return "load", ""
    if save is not None and os.path.normpath(load) == os.path.normpath(save):
        return "auto-resume", (
            "the same folder as --save, which holds no latest_checkpointed_iteration.txt yet: Megatron-LM starts "
            "from scratch then (its auto-resume idiom), and so does this job; a resubmitted job, or phoenix submit "
            "--resume RUN_DIR, continues from the newest checkpoint phoenix writes into that folder "
            "(resilience.checkpoint.path), where the Megatron-LM checkpoints (iter_NNNNNNN/, "
            "resilience.checkpoint.save_megatron) appear too")
    return "refuse", (
        "holds no latest_checkpointed_iteration.txt where this command runs, so it is not a Megatron-LM checkpoint "
        "directory to start from (allowed: a folder holding that file, e.g. the --save folder of an earlier "
        "Megatron-LM run; the same folder as --save, to start from scratch and continue there (auto-resume); or no "
        "--load, to start from scratch)")


def markdown_table() -> str:
    """docs/megatron-args.md's table: every argument of :data:`ARGS`, what becomes of it, and why."""
    kinds = {"map": "carried over", "same": "only phoenix's value", "record": "kept as a comment",
             "skip": "not carried over", "refuse": "refused unless dropped"}
    lines = ["| Megatron-LM argument | Megatron-LM default | phoenix | field or allowed value | why |",
             "|---|---|---|---|---|"]
    for a in ARGS:
        default = "switch" if a.type == FLAG else ("-" if a.default is None else f"`{a.default}`")
        target = (f"`{a.field}`" if a.kind == "map" else f"`{a.allowed}`" if a.kind == "same" else "")
        lines.append(f"| `{a.flag}` | {default} | {kinds[a.kind]} | {target} | {a.why} |")
    return "\n".join(lines) + "\n"
