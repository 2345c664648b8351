"""``phoenix config from-megatron``: a Megatron-LM ``pretrain_gpt.py`` argument list -> a phoenix job config.

The conversion itself is :func:`phoenix_hpc.config.megatron_args.convert` (pure); this module reads the
argument list (command line or ``--args-file``), the tokenizer's vocabulary when its file is readable, renders
the YAML with what was not carried over as comments, validates it as a job config and writes it atomically.
Exit codes: 0 written; 2 bad input (an argument that does not parse, a missing required one, one that changes
the training and was not dropped, a config the schema refuses), nothing written.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import yaml

from phoenix_hpc.errors import ConfigError

if TYPE_CHECKING:
    from phoenix_hpc.config.megatron_args import Unreadable


def read_vocab(given: dict[str, Any]) -> int | Unreadable | None:
    """The tokenizer's vocabulary size from its files; :class:`Unreadable` (why) when a file named is here but
    cannot be read; None when no file named is here.

    ``--vocab-file`` holding a JSON object (GPT-2's ``vocab.json``): its number of entries (Megatron-LM's
    ``GPT2BPETokenizer.vocab_size``). ``--tokenizer-model`` naming a folder or file ``tokenizer.json``
    (Hugging Face ``tokenizers``): the model's vocabulary plus added tokens not in it; naming a SentencePiece
    ``.model`` file: ``sentencepiece``'s piece count (needs that library). The first of them that gives a size
    is used; the reason of every one here that does not is returned (the OSError's, JSON decoder's or
    library's own text)."""
    from phoenix_hpc.config.megatron_args import Unreadable

    why: list[str] = []
    vf = given.get("--vocab-file")
    if vf and Path(vf).is_file():
        try:
            data = json.loads(Path(vf).read_text(encoding="utf-8"))
        except OSError as exc:
            why.append(f"--vocab-file {vf!r}: {exc.strerror or exc}")
        except UnicodeDecodeError as exc:
            why.append(f"--vocab-file {vf!r}: not UTF-8 text ({exc})")
        except ValueError as exc:
            why.append(f"--vocab-file {vf!r}: not JSON ({exc})")
        else:
            if isinstance(data, dict):
                return len(data)
            why.append(f"--vocab-file {vf!r}: holds a JSON {type(data).__name__}, not an object of token: id")
    tm = given.get("--tokenizer-model")
    p = Path(tm) if tm else None
    tj = (p / "tokenizer.json" if p.is_dir() else p) if p is not None else None
    if tj is not None and tj.is_file() and tj.suffix == ".json":
        try:
            data = json.loads(tj.read_text(encoding="utf-8"))
            vocab = data["model"]["vocab"]
            ids = set(vocab.values()) if isinstance(vocab, dict) else set(range(len(vocab)))
            ids |= {t["id"] for t in data.get("added_tokens", [])}
            return max(ids) + 1
        except OSError as exc:
            why.append(f"--tokenizer-model {str(tj)!r}: {exc.strerror or exc}")
        except UnicodeDecodeError as exc:
            why.append(f"--tokenizer-model {str(tj)!r}: not UTF-8 text ({exc})")
        except ValueError as exc:
            why.append(f"--tokenizer-model {str(tj)!r}: not JSON, or an empty vocabulary ({exc})")
        except (KeyError, TypeError, AttributeError) as exc:
            why.append(f"--tokenizer-model {str(tj)!r}: no Hugging Face vocabulary in it (model.vocab, and the id "
                       f"of every added_tokens entry; {type(exc).__name__}: {exc})")
    elif p is not None and p.is_file() and p.suffix == ".model":
        try:
            import sentencepiece
        except ImportError:
            why.append(f"--tokenizer-model {tm!r}: a SentencePiece model, and the sentencepiece package that reads "
                       "it is not installed here")
        else:
            try:
                return int(sentencepiece.SentencePieceProcessor(model_file=str(p)).get_piece_size())
            except Exception as exc:  # noqa: BLE001 - the library's own error, whatever its type, is the reason
                why.append(f"--tokenizer-model {tm!r}: sentencepiece could not load it ({type(exc).__name__}: "
                           f"{exc})")
    return Unreadable("; ".join(why)) if why else None


def read_data_args(path: str) -> list[str] | None:
    """The white-space separated words of a ``--data-args-path`` file (Megatron-LM reads it with
    ``f.read().split()``), or None when it cannot be read here as UTF-8 text."""
    try:
        return Path(path).read_text(encoding="utf-8").split()
    except (OSError, UnicodeDecodeError):
        return None


def has_tracker(folder: str) -> bool:
    """Whether ``folder`` (``--load``'s value; a relative one is the launch folder's, the current one) holds
    Megatron-LM's ``latest_checkpointed_iteration.txt`` here (:func:`phoenix_hpc.config.megatron_args.load_decision`)."""
    from phoenix_hpc.engines.megatron_layout import TRACKER

    return (Path.cwd() / folder / TRACKER).is_file()


def current_folder() -> Path:
    """The folder this command runs in (Megatron-LM's launch folder: relative paths are read against it).

    Raises ConfigError when it no longer exists (deleted while a shell was in it: ``os.getcwd`` fails)."""
    try:
        return Path(os.getcwd())
    except FileNotFoundError:
        raise ConfigError("current folder: it no longer exists (deleted after the shell entered it), so the "
                          "relative paths of the arguments and the launch folder of --load and --data-path cannot "
                          "be read (allowed: run from an existing folder, e.g. cd to it again)") from None


def relocate_paths(cfg: dict, out: Path | None, cwd: Path) -> None:
    """Megatron-LM reads a relative ``--data-path``, ``--save`` and ``--load`` against the launch folder
    (``cwd``); phoenix reads ``data.blend`` paths against the config file's folder, ``resilience.checkpoint.path``
    against the run directory and wants ``save_megatron`` / ``load_megatron`` absolute; Megatron-LM's relative
    ``--tensorboard-dir`` is the launch folder's, phoenix's ``logging.tensorboard_dir`` the run directory's. Rewrite them so that
    they name the same files: the data paths relative to the output file's folder (``cwd`` for standard
    output), the checkpoint and TensorBoard folders absolute."""
    base = (out.parent if out is not None else cwd).resolve()
    for entry in cfg.get("data", {}).get("blend", []):
        if not os.path.isabs(entry["path"]):
            entry["path"] = os.path.relpath(cwd.resolve() / entry["path"], base)
    ck = cfg.get("resilience", {}).get("checkpoint", {})
    for key in ("path", "save_megatron", "load_megatron"):
        if ck.get(key) is not None and not os.path.isabs(ck[key]):
            ck[key] = str(cwd.resolve() / ck[key])
    logging = cfg.get("logging", {})
    if logging.get("tensorboard_dir") is not None and not os.path.isabs(logging["tensorboard_dir"]):
        logging["tensorboard_dir"] = str(cwd.resolve() / logging["tensorboard_dir"])


def render(conv, not_run: list[str] = ()) -> str:
    """The config file's text: a header naming the source and everything not carried over (a dropped argument
    exactly as given, every value included), the commands of an ``--args-file`` script that were not run
    (``not_run``), then the YAML."""
    from phoenix_hpc.config.megatron_args import as_given

    head = ["# phoenix job config converted from Megatron-LM pretrain_gpt.py arguments (phoenix config from-megatron).",
            "# Every argument carried over and its field: docs/megatron-args.md.",
            "# Data: data.blend is built by megatron-core's BlendedMegatronDatasetBuilder, so every step trains on the "
            "samples Megatron-LM's step would."]
    head += [f"# {note}" for note in conv.notes]
    if conv.dropped:
        head.append("# DROPPED although they change the training (asked for with --drop):")
        head += [f"#   {as_given(flag, v)}: {why}" for flag, v, why in conv.dropped]
    if conv.not_carried:
        head.append("# Not carried over (they do not change what is trained):")
        head += [f"#   {flag} {v!r}: {why}" for flag, v, why in conv.not_carried]
    if conv.records:
        head.append("# Kept for the record (phoenix does not use them):")
        head += [f"#   {flag} {v!r}" for flag, v in conv.records]
    if not_run:
        head.append("# Commands of --args-file not run when it was read (as a condition, each counted as succeeded):")
        head += [f"#   {line}" for cmd in not_run for line in [" ".join(cmd.split())]]
    body = yaml.safe_dump(conv.config, sort_keys=False, default_flow_style=False)
    return "\n".join(head) + "\n" + body


@click.command("from-megatron", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--args-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="A launch script, read as bash runs it (variables, arrays, if blocks) without running any of "
                   "its commands: the words of its pretrain_gpt.py command; or a fragment of bash arrays "
                   "(NAME=( ... )) and option lines. Commands not run are listed.")
@click.option("--script-arg", "script_args", multiple=True, metavar="VALUE",
              help="A positional argument of the --args-file script ($1, $2, ... in order; repeatable), as it "
                   "would be launched with.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the config here (atomically); default: standard output.")
@click.option("--drop", "drop", multiple=True, metavar="ARG",
              help="Train without this argument although it changes the training (repeatable; e.g. "
                   "--drop adam-beta2). It is written into the config as a comment.")
@click.option("--name", default="megatron-gpt", show_default=True, help="Job name (config name).")
@click.option("--nodes", type=click.IntRange(min=1), default=None, help="resources.nodes: active nodes.")
@click.option("--spares", type=click.IntRange(min=0), default=None, help="resources.spares: spare nodes.")
@click.argument("megatron_args", nargs=-1, type=click.UNPROCESSED)
def from_megatron(args_file, script_args, output, drop, name, nodes, spares, megatron_args) -> None:
    """Convert a Megatron-LM pretrain_gpt.py argument list into a phoenix job config (engine megatron).

    Give the arguments after `--` (phoenix config from-megatron -o job.yaml --nodes 16 -- --num-layers 32 ...)
    or in --args-file (a launch script: its pretrain_gpt.py command with the script's bash arrays expanded, or
    a fragment of arrays and option lines). Every argument not carried over is listed with why; one that
    changes the training (Megatron-LM's default adam-beta2 0.999, a mixture of experts, ...) is
    refused unless dropped with --drop. --data-path becomes data.blend.
    """
    from phoenix_hpc.config.launch_script import read_launch
    from phoenix_hpc.config.megatron_args import as_given, convert, split_args_text
    from phoenix_hpc.config.schema import JobConfig
    from phoenix_hpc.files import read_text, write_private_file
    from phoenix_hpc.validation import parse_model

    tokens = list(megatron_args)
    cwd = current_folder()
    left_out: list[str] = []
    launch = None
    if script_args and args_file is None:
        raise ConfigError(f"--script-arg {script_args[0]!r}: given without --args-file (allowed: the positional "
                          "arguments of the --args-file script)")
    if args_file is not None:
        text = read_text(args_file, "--args-file")
        launch = read_launch(text, path=str(args_file), script_args=script_args)
        if launch is not None:
            from_file, left_out = launch.args, launch.not_run
        else:
            other = re.search(r"\b(pretrain_(?!gpt\.py)\w+\.py)\b", text)
            if other and "pretrain_gpt.py" not in text:
                raise ConfigError(f"--args-file {args_file}: its command runs {other.group(1)}, and phoenix converts "
                                  "Megatron-LM GPT jobs (allowed: a script that runs pretrain_gpt.py)")
            from_file, left_out = split_args_text(text, launch_not_reached=True)
        tokens = from_file + tokens
    if not tokens:
        raise ConfigError("no Megatron-LM arguments given (allowed: arguments after --, or --args-file FILE)")
    if output is not None and not output.resolve().parent.is_dir():
        raise ConfigError(f"-o/--output: folder {str(output.parent)!r} does not exist (allowed: a file in an "
                          "existing folder)")
    conv = convert(tokens, drop=drop, name=name, nodes=nodes, spares=spares, read_vocab=read_vocab,
                   has_tracker=has_tracker, read_data_args=read_data_args)
    relocate_paths(conv.config, output, cwd)
    parse_model(JobConfig, conv.config, source="the converted config")
    text = render(conv, left_out if launch is not None else [])
    for line in left_out:
        click.echo(f"left out of --args-file (a shell command, not run; not pretrain_gpt.py's arguments): {line}",
                   err=True)
    for flag, v, why in conv.dropped:
        click.echo(f"dropped: {as_given(flag, v)}: {why}", err=True)
    for flag, v, why in conv.not_carried:
        click.echo(f"not carried over: {flag} {v!r}: {why}", err=True)
    if output is None:
        click.echo(text, nl=False)
    else:
        write_private_file(output, text)
        os.chmod(output, 0o644)
        click.echo(f"wrote {output} ({len(conv.carried)} arguments carried over, {len(conv.not_carried)} not, "
                   f"{len(conv.dropped)} dropped)", err=True)
