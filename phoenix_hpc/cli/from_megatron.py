"""``phoenix config from-megatron``: a Megatron-LM ``pretrain_gpt.py`` argument list -> a phoenix job config.

The conversion itself is :func:`phoenix_hpc.config.megatron_args.convert` (pure); this module reads the
argument list (command line or ``--args-file``), the tokenizer's vocabulary when its file is readable, renders
the YAML with what was not carried over as comments and in its ``converted_from`` section (the record the run
directory's ``config.yaml`` keeps: :class:`phoenix_hpc.config.schema.ConversionRecord`), validates it as a job
config (a refusal names each field with the Megatron-LM argument and line it came from; an argument left out as
Megatron-LM's default; for ``--engine torch`` also the arguments that meet each of the torch engine's refusals,
:mod:`phoenix_hpc.config.megatron_torch`) and writes it atomically. Exit codes: 0 written; 2 bad input (an argument that does not parse, a missing required one, one
that changes the training and was not dropped, a --drop that matches no such argument, a script that launches
another python entry point or launches pretrain_gpt.py twice with other words, a current
folder that no longer exists, a config the schema refuses), nothing written.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import yaml

from phoenix_hpc.config.megatron_torch import ENGINES, ways_note
from phoenix_hpc.errors import ConfigError

if TYPE_CHECKING:
    from phoenix_hpc.config.megatron_args import Unreadable


_UNREAD = object()  # what _json_file returns for a file it could not read


def _json_file(path: Path, label: str, why: list[str]) -> Any:
    """The JSON value of the file at ``path``, or ``_UNREAD`` with the reason appended to ``why`` (``label:
    ...``: the OSError's text, not UTF-8, not JSON)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        why.append(f"{label}: {exc.strerror or exc}")
    except UnicodeDecodeError as exc:
        why.append(f"{label}: not UTF-8 text ({exc})")
    except ValueError as exc:
        why.append(f"{label}: not JSON ({exc})")
    return _UNREAD


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
        data = _json_file(Path(vf), f"--vocab-file {vf!r}", why)
        if isinstance(data, dict):
            return len(data)
        if data is not _UNREAD:
            why.append(f"--vocab-file {vf!r}: holds a JSON {type(data).__name__}, not an object of token: id")
    tm = given.get("--tokenizer-model")
    p = Path(tm) if tm else None
    tj = (p / "tokenizer.json" if p.is_dir() else p) if p is not None else None
    if tj is not None and tj.is_file() and tj.suffix == ".json":
        data = _json_file(tj, f"--tokenizer-model {str(tj)!r}", why)
        if data is not _UNREAD:
            try:
                vocab = data["model"]["vocab"]
                ids = set(vocab.values()) if isinstance(vocab, dict) else set(range(len(vocab)))
                ids |= {t["id"] for t in data.get("added_tokens", [])}
                return max(ids) + 1
            except ValueError as exc:  # max() of no ids
                why.append(f"--tokenizer-model {str(tj)!r}: an empty vocabulary ({exc})")
            except (KeyError, TypeError, AttributeError) as exc:
                why.append(f"--tokenizer-model {str(tj)!r}: no Hugging Face vocabulary in it (model.vocab, and the "
                           f"id of every added_tokens entry; {type(exc).__name__}: {exc})")
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


def site_environment() -> dict[str, list[tuple[str, str]]]:
    """Variable -> ``(site, value)`` of every site profile found (:func:`phoenix_hpc.profiles.load.available_sites`:
    ``$PHOENIX_SITE_PATH``, then ``sites/``) whose ``environment.env`` sets it: the job's sbatch script exports
    those itself, so they win over a value exported before ``phoenix submit``. The conversion does not know the
    site the job will be submitted to, so every profile is read; one that cannot be loaded is left out (``phoenix
    submit --site`` names its problems)."""
    from phoenix_hpc.errors import ProfileError
    from phoenix_hpc.profiles.load import available_sites, load_profile

    out: dict[str, list[tuple[str, str]]] = {}
    for site in available_sites():
        try:
            profile = load_profile(site)
        except ProfileError:
            continue
        for var, value in profile.environment.env.items():
            out.setdefault(var, []).append((site, value))
    return out


def environment_why(var: str, sites: dict[str, list[tuple[str, str]]] | None = None) -> str:
    """Why a variable the launch script set for its launch is not set in the job by the converted config.
    ``sites``: :func:`site_environment` (None: no site profile is looked at)."""
    from phoenix_hpc.engines.megatron_env import MAX_CONNECTIONS

    if var == MAX_CONNECTIONS:
        return ("phoenix sets it to 1 itself where megatron-core needs it (tensor parallelism on GPUs before "
                "Blackwell: phoenix_hpc/engines/megatron_env.py)")
    setters = (sites or {}).get(var)
    if setters:
        said = ", ".join(f"{site} ({var}={value!r})" for site, value in setters)
        return (f"a job config has no environment of its own, and the site profile{'s' if len(setters) > 1 else ''} "
                f"{said} set{'' if len(setters) > 1 else 's'} it in the job's sbatch script (environment.env), so "
                "on such a site the site's value wins over one exported before phoenix submit: change it in the "
                "site profile's environment.env (or in a copy of the profile given to phoenix submit --site); on "
                "another site, set it there or export it before phoenix submit")
    return ("a job config has no environment of its own: set it in the site profile's environment.env, or export "
            "it before phoenix submit (sbatch passes the submitting environment on)")


def conversion_record(conv, source: str, not_run: list[str], environment: dict[str, str],
                      launcher: list[str]) -> dict[str, Any]:
    """The config's ``converted_from`` section (:class:`phoenix_hpc.config.schema.ConversionRecord`): what was
    converted and everything not carried over, as the header comments of :func:`render` say it, so that the run
    directory's ``config.yaml`` keeps it. Empty lists are left out. Pure."""
    from phoenix_hpc.config.megatron_args import as_given

    record: dict[str, Any] = {"source": source}
    if launcher:
        record["launcher"] = shlex.join(launcher)
    for key, items in (("dropped", [f"{as_given(flag, v)}: {why}" for flag, v, why in conv.dropped]),
                       ("not_carried", [f"{flag} {v!r}: {why}" for flag, v, why in conv.not_carried]),
                       ("kept_for_record", [f"{flag} {v!r}" for flag, v in conv.records]),
                       ("notes", list(conv.notes)),
                       ("not_run", [" ".join(cmd.split()) for cmd in not_run])):
        if items:
            record[key] = items
    if environment:
        record["environment"] = dict(environment)
    return record


def argument_sources(conv, on_command_line: set[str], script_text: str | None,
                     args_file: Path | None, given: set[str] | None = None) -> dict[str, list[str]]:
    """Config field -> where its value came from, for the schema's refusals: ``--global-batch-size on line 12 of
    run.sh`` (every line of the --args-file text that holds the argument's word, comment lines left out),
    ``--global-batch-size on the command line`` (after ``--``, which comes after the file's words and so wins, as
    argparse keeps the last), ``--untie-embeddings-and-output-weights, absent: Megatron-LM's default`` (an
    argument not among ``given``, the option words of the whole argument list, when that is given), or ``the
    tokenizer files``. Pure."""
    out: dict[str, list[str]] = {}
    for flag, dotted, _ in conv.carried:
        if not dotted or dotted.startswith("("):
            continue
        if flag.startswith("--"):
            if given is not None and flag not in given:
                where = f"{flag}, absent: Megatron-LM's default"
            else:
                where = where_given(flag, on_command_line, script_text, args_file)
        elif flag == "(tokenizer files)":
            where = "the tokenizer files"
        else:
            continue
        if where not in out.setdefault(dotted, []):
            out[dotted].append(where)
    return out


def where_given(flag: str, on_command_line: set[str], script_text: str | None, args_file: Path | None) -> str:
    """Where the argument ``flag`` was given: ``--lr on the command line`` (a word of ``on_command_line``, the
    words after ``--``), ``--lr on lines 4, 9 of run.sh`` (every line of ``script_text`` that holds the
    argument's word, comment lines left out), ``--lr of run.sh`` (no such line: built by the script's
    variables), or the flag alone. Pure."""
    if flag in on_command_line or any(t.startswith(flag + "=") for t in on_command_line):
        return f"{flag} on the command line"
    if script_text is None:
        return flag
    word = re.compile(rf"(?<![\w-]){re.escape(flag)}(?![\w-])")
    lines = [str(n) for n, line in enumerate(script_text.splitlines(), 1)
             if not line.lstrip().startswith("#") and word.search(line)]
    return (f"{flag} on line{'s' if len(lines) > 1 else ''} {', '.join(lines)} of {args_file}" if lines
            else f"{flag} of {args_file}")


def locate_problems(problems: list[str], given: set[str], on_command_line: set[str], script_text: str | None,
                    args_file: Path | None) -> list[str]:
    """The conversion's refusals (each starting with the Megatron-LM arguments it is about, ``--lr-decay-iters:
    50 beside --train-samples (allowed: ...)``) with where every argument it names before ``(allowed`` and that
    was given (``given``: the option words of the whole list) came from, as :func:`argument_sources` names
    them for the schema's refusals: ``--lr-decay-iters (from --lr-decay-iters on line 7 of run.sh and
    --train-samples on line 6 of run.sh): 50 beside ...``, the note before the problem's first ``: ``. Only
    for an ``--args-file`` (``script_text``), whose lines there are to name; arguments after ``--`` are said
    to be on the command line. Pure."""
    if script_text is None:
        return list(problems)
    out = []
    for p in problems:
        head = p.split(" (allowed", 1)[0]
        flags = list(dict.fromkeys(f for f in re.findall(r"(?<![\w-])--[a-z0-9][a-z0-9-]*", head) if f in given))
        if flags:
            note = f" (from {' and '.join(where_given(f, on_command_line, script_text, args_file) for f in flags)})"
            at = p.find(": ")
            p = p + note if at < 0 else p[:at] + note + p[at:]
        out.append(p)
    return out


def name_sources(problems: list[str], sources: dict[str, list[str]]) -> list[str]:
    """``problems`` (the schema's, naming config fields) with every field that came from a Megatron-LM argument
    followed by where (:func:`argument_sources`): ``training.global_batch_size (from --global-batch-size on line
    12 of run.sh): ...``. A field path's deeper parts (``data.blend.0.weight``) stay before the note. Pure."""
    out = []
    for p in problems:
        for dotted in sorted(sources, key=len, reverse=True):
            m = re.search(rf"(?<![\w.]){re.escape(dotted)}(?!\w)(?:\.\w+)*", p)
            if m is not None:
                p = f"{p[:m.end()]} (from {' and '.join(sources[dotted])}){p[m.end():]}"
        out.append(p)
    return out


def launch_notes(launch, args_file: Path | None) -> list[str]:
    """What the config's notes say of a script's launches (:class:`phoenix_hpc.config.launch_script.Launch`):
    later ``pretrain_gpt.py`` commands with the same words (converted once, from the first), and a script whose
    rest after the launch did not end within the reading's time limit (a later launch there was not looked
    for). Empty for none. Pure."""
    if launch is None:
        return []
    out = []
    if launch.same_at:
        lines = ", ".join(map(str, launch.same_at))
        out.append(f"--args-file {args_file} launches pretrain_gpt.py on line {launch.line} and again with the same "
                   f"words on line{'s' if len(launch.same_at) > 1 else ''} {lines}: converted once, from line "
                   f"{launch.line}: the job runs once")
    if not launch.read_to_end:
        out.append(f"--args-file {args_file}: read up to its pretrain_gpt.py command on line {launch.line}; the rest "
                   "did not end within the reading's time limit (a loop that waits on a command not run here), so "
                   "a later pretrain_gpt.py command there was not looked for")
    return out


def _is_option_line(entry: str) -> bool:
    """Whether a not-run entry (``line N: text``) or a line of a fragment is an option line (``--lr 1``), not a
    command."""
    return re.sub(r"^line \d+: ", "", entry).lstrip().startswith("-")


def render(conv, not_run: list[str] = (), environment: dict[str, str] | None = None,
           sites: dict[str, list[tuple[str, str]]] | None = None) -> str:
    """The config file's text: a header naming the source and everything not carried over (a dropped argument
    exactly as given, every value included), the commands of an ``--args-file`` script that were not run
    (``not_run``) and the variables it set for its launch (``environment``), then the YAML, whose
    ``converted_from`` section (:func:`conversion_record`) records the same for the run directory."""
    from phoenix_hpc.config.megatron_args import as_given

    head = ["# phoenix job config converted from Megatron-LM pretrain_gpt.py arguments (phoenix config from-megatron).",
            "# Every argument carried over and its field: docs/megatron-args.md. What was not carried over is also",
            "# in converted_from at the end, which phoenix submit keeps in the run directory's config.yaml.",
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
    if environment:
        head.append("# Environment the script set for its launch, NOT set in the job by this config:")
        head += [f"#   {var}={value!r}: {environment_why(var, sites)}" for var, value in environment.items()]
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
@click.option("--engine", type=click.Choice(ENGINES), default=ENGINES[0], show_default=True,
              help="The config's engine. torch: the torch engine's built-in GPT (CPU or GPU: the local cluster, "
                   "drills), the same model, training, data and parallelism without the megatron performance "
                   "options (listed as not carried over); what it cannot train (tp > 1, a tied output head, "
                   "--fp16) is refused, naming the argument.")
@click.option("--nodes", type=click.IntRange(min=1), default=None, help="resources.nodes: active nodes.")
@click.option("--spares", type=click.IntRange(min=0), default=None, help="resources.spares: spare nodes.")
@click.argument("megatron_args", nargs=-1, type=click.UNPROCESSED)
def from_megatron(args_file, script_args, output, drop, name, engine, nodes, spares, megatron_args) -> None:
    """Convert a Megatron-LM pretrain_gpt.py argument list into a phoenix job config (engine megatron, or torch
    with --engine torch).

    Give the arguments after `--` (phoenix config from-megatron -o job.yaml --nodes 16 -- --num-layers 32 ...)
    or in --args-file (a launch script: its pretrain_gpt.py command with the script's bash arrays expanded, or
    a fragment of arrays and option lines). Every argument not carried over is listed with why; one that
    changes the training (Megatron-LM's default adam-beta2 0.999, a mixture of experts, ...) is
    refused unless dropped with --drop. --data-path becomes data.blend.
    """
    from phoenix_hpc.config.launch_script import python_commands, read_script
    from phoenix_hpc.config.megatron_args import as_given, convert, split_args_text
    from phoenix_hpc.config.schema import JobConfig
    from phoenix_hpc.files import read_text, write_private_file
    from pydantic import ValidationError

    tokens = list(megatron_args)
    cwd = current_folder()
    left_out: list[str] = []
    launch = script_text = None
    environment: dict[str, str] = {}
    if script_args and args_file is None:
        raise ConfigError(f"--script-arg {script_args[0]!r}: given without --args-file (allowed: the positional "
                          "arguments of the --args-file script)")
    if args_file is not None:
        script_text = read_text(args_file, "--args-file")
        reading = read_script(script_text, path=str(args_file), script_args=script_args)
        launch = reading.launch if reading is not None else None
        if launch is not None:
            from_file, left_out, environment = launch.args, launch.not_run, launch.environment
        else:
            other = re.search(r"\b(pretrain_(?!gpt\.py)\w+\.py)\b", script_text)
            if other and "pretrain_gpt.py" not in script_text:
                raise ConfigError(f"--args-file {args_file}: its command runs {other.group(1)}, and phoenix converts "
                                  "Megatron-LM GPT jobs (allowed: a script that runs pretrain_gpt.py)")
            if "pretrain_gpt.py" not in script_text:
                commands = python_commands([c for c in (reading.not_run if reading is not None else
                                                         script_text.splitlines()) if not _is_option_line(c)])
                if commands:
                    raise ConfigError(f"--args-file {args_file}: no pretrain_gpt.py launch was found; the python "
                                      f"command{'s' if len(commands) > 1 else ''} it runs: {'; '.join(commands)} "
                                      "(allowed: a script that launches Megatron-LM's pretrain_gpt.py, through "
                                      "torchrun, srun or python; or a fragment of its arguments alone, bash arrays "
                                      "and option lines; a train.py that takes pretrain_gpt.py's arguments: give "
                                      "them after --)")
            environment = reading.environment if reading is not None else {}
            from_file, left_out = split_args_text(script_text, launch_not_reached=True)
        tokens = from_file + tokens
    if not tokens:
        raise ConfigError("no Megatron-LM arguments given (allowed: arguments after --, or --args-file FILE)")
    if output is not None and not output.resolve().parent.is_dir():
        raise ConfigError(f"-o/--output: folder {str(output.parent)!r} does not exist (allowed: a file in an "
                          "existing folder)")
    given = {t.split("=", 1)[0] for t in tokens if t.startswith("--")}
    try:
        conv = convert(tokens, drop=drop, name=name, nodes=nodes, spares=spares, read_vocab=read_vocab,
                       has_tracker=has_tracker, read_data_args=read_data_args, engine=engine)
    except ConfigError as exc:
        located = locate_problems(exc.problems, given, set(megatron_args), script_text, args_file)
        if located == exc.problems:
            raise
        raise ConfigError(located, source=exc.source, note=exc.note) from None
    relocate_paths(conv.config, output, cwd)
    conv.notes += launch_notes(launch, args_file)
    not_run = left_out if launch is not None else []
    source = " and ".join(
        ([f"--args-file {args_file}" + "".join(f" --script-arg {shlex.quote(a)}" for a in script_args)]
         if args_file is not None else []) + (["the arguments after --"] if megatron_args else []))
    conv.config["converted_from"] = conversion_record(conv, source, not_run, environment,
                                                      launch.launcher if launch is not None else [])
    try:
        JobConfig.model_validate(conv.config)
    except ValidationError as exc:
        from phoenix_hpc.validation import format_validation_error

        sources = argument_sources(conv, set(megatron_args), script_text, args_file, given=given)
        problems = name_sources(format_validation_error(exc), sources)
        raise ConfigError(problems, source="the converted config",
                          note=(engine == "torch" and ways_note(problems)) or
                          "nothing was written (each field names the Megatron-LM argument it came from)") from None
    sites = site_environment() if environment else {}
    text = render(conv, not_run, environment, sites)
    for note in launch_notes(launch, args_file):
        click.echo(f"note: {note}", err=True)
    for line in left_out:
        click.echo(f"left out of --args-file (a shell command, not run; not pretrain_gpt.py's arguments): {line}",
                   err=True)
    for flag, v, why in conv.dropped:
        click.echo(f"dropped: {as_given(flag, v)}: {why}", err=True)
    for flag, v, why in conv.not_carried:
        click.echo(f"not carried over: {flag} {v!r}: {why}", err=True)
    for var, value in environment.items():
        click.echo(f"not carried over: the script's environment {var}={value}: {environment_why(var, sites)}", err=True)
    if output is None:
        click.echo(text, nl=False)
    else:
        write_private_file(output, text)
        os.chmod(output, 0o644)
        click.echo(f"wrote {output} ({len(conv.carried)} arguments carried over, {len(conv.not_carried)} not, "
                   f"{len(conv.dropped)} dropped)", err=True)
