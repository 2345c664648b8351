"""The ``pretrain_gpt.py`` arguments of a Megatron-LM launch script, with its variables expanded by bash, while
no command of the script runs.

Launch scripts set their values in shell variables (``CHECKPOINT_PATH=$1``, ``TP=${TP:-4}``,
``WORLD_SIZE=$(($GPUS_PER_NODE*$NUM_NODES))``), choose arguments in ``if`` blocks and pass bash arrays
unquoted, so the words ``pretrain_gpt.py`` receives are only known after bash's own expansion. This module
reads the script with bash itself (``bash --norc --noprofile``), with a ``DEBUG`` trap under ``shopt -s
extdebug`` in front of every simple command (bash(1), *SHELL BUILTIN COMMANDS*, ``trap`` and ``shopt``: with
``extdebug`` a non-zero return of the ``DEBUG`` trap skips the command; ``set -T`` hands the trap on to shell
functions, command substitutions and subshells). The trap lets run only what sets variables or tests them:

- assignments (``NAME=word``, arrays ``NAME=( ... )``, ``NAME+=...``) and ``declare``/``typeset``/
  ``local``/``export``/``readonly``/``unset`` without a redirection, ``shift``;
- the tests and loops' own steps (``[[ ]]``, ``[ ]``, ``test``, ``(( ))``, ``let``, ``for``, ``case``,
  ``true``, ``false``, ``:``, ``break``, ``continue``), without a redirection;
- calls of functions the script defined (their bodies pass the same gate).

Every other command (``mkdir``, ``cd``, ``source``, ``echo``, ``exit``, ``srun``, ...) is not run and is
reported with its line. A command substitution in an assignment runs in bash, its commands gated the same way;
one that would have to run a command leaves a mark in the value, so a launch word that holds such a value is
refused naming the command. The first command whose words, expanded (without running a command substitution),
contain a word ``pretrain_gpt.py`` or ``.../pretrain_gpt.py`` is the launch: the words after it are the arguments, and the
script is read no further. A variable the launch words use that is not set (``$DATA_PATH`` from ``$5``
without a fifth script argument) is refused with bash's message, as ``set -u`` would.

bash reads the script in restricted mode (``set -r``, bash(1) *RESTRICTED SHELL*): no redirection can create,
truncate or append to a file, not even one of a compound command (``done > log``, ``{ ...; } > log``), which
runs before any trap; such a command is not run, and is listed too. The script is sourced by a name without a
slash from a private folder on ``PATH``; bash's working directory is the caller's; functions exported in the
environment (``BASH_FUNC_*``) and ``BASH_ENV`` are not passed on. Assignments to the variables restricted
mode protects (``PATH``, ``SHELL``, ``ENV``, ``BASH_ENV``, ``HISTFILE``) are not run.

Errors: :class:`phoenix_hpc.errors.ConfigError` (exit 2), naming the file and the line.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from phoenix_hpc.errors import ConfigError

#: seconds bash may take to reach the launch or the script's end (a loop whose exit is a command not run)
TIMEOUT_S = 10.0
#: what a command substitution's skipped command writes into the value it gives
NOT_RUN_MARK = "\x1fphoenix-not-run:"
#: what a variable assigned from one that is not set holds instead of the empty string bash gives it
UNSET_MARK = "\x1fphoenix-unset:"

_GATE = r"""
__phoenix_report=$1; shift
exec 3>>"$__phoenix_report" 5>/dev/null
PATH=$PWD
cd "$__phoenix_cwd" || exit 4
unset __phoenix_cwd
__phoenix_started=
__phoenix_word='([^[:space:]"'\''\\$]|\\.|"([^"\\]|\\.)*"|'\''[^'\'']*'\''|\$\(\([^)]*\)\)|\$\([^)]*\)|\$\{[^}]*\}|\$)*'
__phoenix_assign='^[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?='
__phoenix_restricted='^((export|declare|typeset|local|readonly)[[:space:]]+(-[A-Za-z]+[[:space:]]+)*)?(PATH|SHELL|ENV|BASH_ENV|HISTFILE)(\+?=|[[:space:]]|$)'
__phoenix_redirect='(^|[[:space:]])[0-9]*(&>>|&>|>>|>&|>\||<<<|<>|>|<)[[:space:]]*[^[:space:]]+'
__phoenix_subst='\$\([^(]|`|<\(|>\('
__phoenix_put() { printf '%s\037%s\037%s\0' "$1" "$2" "$3" >&3; }
__phoenix_pure() {
  local c=$1 rest w
  if [[ $c =~ $__phoenix_restricted ]]; then return 1; fi
  if [[ $c == '[['* || $c == '(('* || $c == 'for (('* ]]; then return 0; fi
  if [[ $c == *[\<\>]* ]]; then return 1; fi
  case $c in
    '[ '*|'test '*|true|false|:|': '*|'let '*|shift|'shift '*|break|continue|'break '*|'continue '*) return 0 ;;
    'for '*|'case '*) return 0 ;;
  esac
  w=${c%%[[:space:]]*}
  case $w in declare|typeset|local|export|readonly|unset) return 0 ;; esac
  if declare -F -- "$w" >&5 2>&5; then return 0; fi
  if [[ $c =~ ^[A-Za-z_][A-Za-z0-9_]*\+?=\( ]]; then return 0; fi
  rest=$c
  while [[ $rest =~ $__phoenix_assign$__phoenix_word([[:space:]]+|$) ]]; do
    rest=${rest:${#BASH_REMATCH[0]}}
    if [[ -z $rest ]]; then return 0; fi
  done
  return 1
}
__phoenix_end() {
  if (( BASH_SUBSHELL > 0 )); then kill -KILL $$; fi
  exit "$1"
}
__phoenix_gate() {
  local c=$BASH_COMMAND n=$1 e i err name
  shift
  if [[ -z $__phoenix_started || -n $__phoenix_checking ]]; then __phoenix_started=1; return 0; fi
  if __phoenix_pure "$c"; then
    if [[ $c =~ ^([A-Za-z_][A-Za-z0-9_]*)(\[[^]]*\])?\+?= ]]; then name=${BASH_REMATCH[1]}; fi
    if [[ -n $name && $c == *'$'* && ! $c =~ $__phoenix_subst ]]; then
      if ! err=$( ( __phoenix_checking=1; set -u; eval "$c" ) 2>&1 ); then
        eval "$c"
        __phoenix_put unsetvar "$n" "$c"$'\036'"$err"
        if [[ $c =~ ^[A-Za-z_][A-Za-z0-9_]*\+?=\( ]]; then
          eval "$name+=( \"\037phoenix-unset:$n\037\" )"
        else
          printf -v "$name" '\037phoenix-unset:%s\037' "$n"
        fi
        return 1
      fi
    fi
    return 0
  fi
  if [[ $c =~ $__phoenix_subst ]]; then
    if [[ $c == *pretrain_gpt.py* ]]; then __phoenix_put subst "$n" "$c"; __phoenix_end 3; fi
    __phoenix_put skip "$n" "$c"
    if (( BASH_SUBSHELL > 0 )); then printf '\037phoenix-not-run:%s\037' "$n"; fi
    return 1
  fi
  e=$c
  while [[ $e =~ $__phoenix_redirect ]]; do e=${e/"${BASH_REMATCH[0]}"/ }; done
  local -a __phoenix_w=()
  if eval "__phoenix_w=( $e )" 2>&5; then
    for (( i = 0; i < ${#__phoenix_w[@]}; i++ )); do
      if [[ ${__phoenix_w[i]} == pretrain_gpt.py || ${__phoenix_w[i]} == */pretrain_gpt.py ]]; then
        if ! err=$( ( __phoenix_checking=1; set -u; eval "__phoenix_w=( $e )" ) 2>&1 ); then
          __phoenix_put unset "$n" "$err"; __phoenix_end 3
        fi
        for w in "${__phoenix_w[@]:i+1}"; do __phoenix_put word "$n" "$w"; done
        __phoenix_put launch "$n" "$c"
        __phoenix_end 0
      fi
    done
  fi
  __phoenix_put skip "$n" "$c"
  if (( BASH_SUBSHELL > 0 )); then printf '\037phoenix-not-run:%s\037' "$n"; fi
  return 1
}
shopt -s extdebug
set -T
set -r
trap '__phoenix_gate "$LINENO" "$@"' DEBUG
source script.sh "$@"
"""


@dataclass(frozen=True)
class Launch:
    """A launch script's ``pretrain_gpt.py`` command. ``args``: its words after ``pretrain_gpt.py``, expanded;
    ``line``: the line it is on (for a command over several lines, the line bash reports: its last);
    ``not_run``: ``"line N: text"`` of every command before it that was not run (bash's text of the command)."""

    args: list[str]
    line: int
    not_run: list[str]


def _records(raw: bytes) -> list[tuple[str, int, str]]:
    out = []
    for rec in raw.split(b"\0"):
        if not rec:
            continue
        kind, line, text = rec.decode("utf-8", "replace").split("\x1f", 2)
        out.append((kind, int(line) if line.isdigit() else 0, text))
    return out


def read_launch(text: str, *, path: str, script_args: Sequence[str] = (),
                env: Mapping[str, str] | None = None, timeout_s: float = TIMEOUT_S) -> Launch | None:
    """The ``pretrain_gpt.py`` command of the launch script ``text`` (read from ``path``: ``$0``), run as
    ``bash path script_args...`` would reach it with ``env`` as its environment (default: this process's), no
    command of the script run (module docstring). ``None`` when the script ends without reaching one (a fragment
    of arrays and option lines; or a launch in a branch not taken), or when there is no bash here.

    Raises ConfigError (naming ``path`` and the line) when a launch word uses a variable that is not set or a
    value that only a command the script did not run would give, when a launch command needs a command
    substitution to be expanded, when bash cannot parse the script, or when bash takes more than
    ``timeout_s`` seconds (a loop that waits on a command)."""
    bash = shutil.which("bash")
    if bash is None:
        return None
    with tempfile.TemporaryDirectory(prefix="phoenix-launch-") as tmp:
        (Path(tmp) / "script.sh").write_text(text, encoding="utf-8")
        report = Path(tmp) / "report"
        report.write_bytes(b"")
        run_env = {k: v for k, v in (os.environ if env is None else env).items()
                   if not k.startswith("BASH_FUNC_") and k not in ("BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS")}
        run_env["__phoenix_cwd"] = os.getcwd()
        try:
            proc = subprocess.run([bash, "--norc", "--noprofile", "-c", _GATE, path, str(report), *script_args],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  env=run_env, cwd=tmp, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise ConfigError(f"--args-file {path}: bash read the script for {timeout_s:g} s without reaching "
                              "its pretrain_gpt.py command or its end (a loop that waits on a command, which is "
                              "not run here; allowed: a script whose loops end on their own values)") from None
        records = _records(report.read_bytes())
    stderr = proc.stderr.decode("utf-8", "replace")
    skipped = [(line, t) for kind, line, t in records if kind == "skip"]
    for m in re.finditer(r"line (\d+): (.*): restricted: cannot redirect output", stderr):
        skipped.append((int(m.group(1)), f"a redirection to {m.group(2)} (the command it belongs to was not run)"))
    skipped.sort(key=lambda item: item[0])
    not_run = [f"line {line}: {t}" for line, t in skipped]
    for kind, line, t in records:
        if kind == "unset":
            said = re.sub(r"^.*?line \d+: ", "", t.strip().splitlines()[-1]) if t.strip() else t
            raise ConfigError(f"--args-file {path} line {line}: the pretrain_gpt.py command uses a variable that "
                              f"is not set: {said} (allowed: values the script sets; give its positional "
                              "arguments with --script-arg, or set the variable in the environment)")
        if kind == "subst":
            raise ConfigError(f"--args-file {path} line {line}: the pretrain_gpt.py command needs a command run "
                              f"to give its words ({t!r}), and no command of the script is run here (allowed: "
                              "literal values and variables)")
    launch_lines = [line for kind, line, _ in records if kind == "launch"]
    if not launch_lines:
        if proc.returncode not in (0, 1) or (proc.returncode and "syntax error" in stderr):
            first = stderr.strip().splitlines()[0] if stderr.strip() else f"exit status {proc.returncode}"
            raise ConfigError(f"--args-file {path}: bash could not read the script: {first}")
        return None
    launch_line = launch_lines[0]
    args = [t for kind, _, t in records if kind == "word"]
    unset_at = {str(line): t for kind, line, t in records if kind == "unsetvar"}
    problems: list[str] = []
    for w in args:
        for mark in re.findall("\x1f(phoenix-(?:unset|not-run):\\d+)\x1f", w):
            kind, _, marked = mark.partition(":")
            if kind == "phoenix-unset":
                command, _, said = unset_at.get(marked, "\x1e").partition("\x1e")
                said = re.sub(r"^.*?line \d+: ", "", said.strip().splitlines()[-1]) if said.strip() else "not set"
                problem = (f"--args-file {path} line {launch_line}: an argument of the pretrain_gpt.py command takes "
                           f"its value from line {marked} ({command!r}), which uses a variable that is not set: "
                           f"{said} (allowed: values the script sets; give its positional arguments with "
                           "--script-arg, or set the variable in the environment)")
            else:
                cmds = [t for line, t in skipped if str(line) == marked] or ["a command"]
                problem = (f"--args-file {path} line {launch_line}: an argument of the pretrain_gpt.py command takes "
                           f"its value from {cmds[0]!r} (line {marked}), a command that is not run here (allowed: "
                           "literal values and variables the script sets; set the value in the script or the "
                           "environment)")
            if problem not in problems:
                problems.append(problem)
    if problems:
        raise ConfigError(problems)
    return Launch(args=args, line=launch_line, not_run=not_run)
