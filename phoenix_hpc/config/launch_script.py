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
  ``local``/``export``/``readonly``/``unset``/``printf -v`` without a redirection, ``shift``, ``getopts``,
  ``read``/``mapfile`` from a here-string (``IFS=, read -ra A <<< "$LIST"``);
- the tests and loops' own steps (``[[ ]]``, ``[ ]``, ``test``, ``(( ))``, ``let``, ``for``, ``case``,
  ``true``, ``false``, ``:``, ``break``, ``continue``), without a redirection;
- calls of functions the script defined (their bodies pass the same gate).

Every other command (``mkdir``, ``cd``, ``source``, ``echo``, ``exit``, ``grep``, ``srun``, ...) is not run
and is reported with its line; bash counts it as succeeded (status 0), so ``if grep -q ...; then`` takes its
``then`` branch. Assignments to ``PATH``, ``SHELL``, ``ENV``, ``BASH_ENV`` and ``HISTFILE`` are not run either.
A command substitution runs in a subshell whose commands pass the same gate (also one bash evaluates inside
arithmetic, ``$((X))`` with ``X='a[$(cmd)]'``, or a prompt expansion); a command it would have to run leaves a
mark in the value instead of its output, so a launch word that holds such a value is refused naming the
command. An assignment that uses a variable that is not set (``CHECKPOINT_PATH=$1`` without a first script
argument) marks its variable the same way, with bash's message; ``: "${DATA:?message}"`` and
``X=${1:?message}`` stop the reading with that message, as the script would stop.

The first command whose words, expanded in a subshell behind the same gate, contain a word
``pretrain_gpt.py`` or ``.../pretrain_gpt.py`` is the launch: the words after it are the arguments; its words
before ``pretrain_gpt.py`` (the launcher) and the variables exported there (or at the script's end, when it
has no launch) are reported too (:class:`Reading`), so that what the script set in the launch's environment is
listed, not lost. The launch is not run either, and the script is read on, to its end, an ``exit`` outside a
subshell, or the same launch reached again (a retry loop): a later ``pretrain_gpt.py`` command with the same
words is reported (:attr:`Launch.same_at`), one with other words is refused, since one config cannot obey two
launches. A script still being read at the time limit after its launch (a loop waiting on a command) is
converted from the launch, and says so (:attr:`Launch.read_to_end`). Redirections at its end (``> log 2>&1``) are not part of its words; a ``<`` or
``>`` anywhere else, a here-document, or a command substitution in the launch command itself is refused rather
than guessed at. bash's own ``$LINENO``, ``$FUNCNAME``, ``$BASH_SOURCE`` and ``$_`` differ while the gate
reads the script, so a launch word or an assignment that uses them is refused (marked) the same way, and so is
``$PWD`` after a ``cd`` that was not run; ``set -- ...`` sets the positional arguments.

bash reads the script in restricted mode (``set -r``, bash(1) *RESTRICTED SHELL*): no redirection can create,
truncate or append to a file, not even one of a compound command (``done > log``, ``{ ...; } > log``), which
runs before any trap; such a command is not run, and is listed too. The script is sourced by a name without a
slash from a private folder on ``PATH``; bash's working directory is the caller's; functions exported in the
environment (``BASH_FUNC_*``) and ``BASH_ENV`` are not passed on. The reader's own variables and functions
(``__phoenix_*``) are read-only and its locals carry that prefix, so the script's ``n`` or ``i`` are its own.

bash runs in a session of its own; when the reading ends (the launch reached, the script's end, an error or the
time limit) its whole process group is killed, so no subshell outlives it, and the gate stops a subshell
nested deeper than 8 (a script that takes over ``return`` recursed through the gate's subshells without end).

This is a reader for the user's own scripts, not a sandbox: a script written to defeat it (defining functions
named like the bash builtins the gate itself calls, ``local``, ``printf``, ``eval``, or writing to the gate's
report descriptor) can run commands. Read only scripts you would run.

Errors: :class:`phoenix_hpc.errors.ConfigError` (exit 2), naming the file and the line.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from phoenix_hpc.errors import ConfigError

#: seconds bash may take to reach the launch or the script's end (a loop whose exit is a command not run)
TIMEOUT_S = 10.0
#: what a refusal for a value that is not set allows instead
_SET_IT = ("allowed: values the script sets; give its positional arguments with --script-arg, or set the variable "
           "in the environment")

_GATE = r"""
exec 3>>"$1" 5>/dev/null
shift
PATH=$PWD
cd "$__phoenix_cwd" || exit 4
unset __phoenix_cwd
readonly __phoenix_word='([^[:space:]"'\''\\$]|\\.|"([^"\\]|\\.)*"|'\''[^'\'']*'\''|\$\(\([^)]*\)\)|\$\([^)]*\)|\$\{[^}]*\}|\$)*'
readonly __phoenix_assign='^[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?\+?='
readonly __phoenix_restricted='(^|[[:space:]=])(PATH|SHELL|ENV|BASH_ENV|HISTFILE)(\+?=|[[:space:]]|$)'
readonly __phoenix_tail='[[:space:]]+[0-9]*(&>>|&>|>>|>&|>\||>|<)[[:space:]]*("[^"$`]*"|'\''[^'\'']*'\''|[^[:space:]"'\''<>$`]+)[[:space:]]*$'
readonly __phoenix_subst='\$\([^(]|`|<\(|>\('
readonly __phoenix_bashown='\$\{?(LINENO|FUNCNAME|BASH_SOURCE|BASH_LINENO|_)([^A-Za-z0-9_]|$)'
readonly __phoenix_too_deep
readonly __phoenix_mine='^__phoenix_(put|words|pure|end|exports)$'
__phoenix_put() { printf '%s\037%s\037%s\0' "$1" "$2" "$3" >&3; }
__phoenix_exports() {
  local __phoenix_v
  for __phoenix_v in ${!a@} ${!b@} ${!c@} ${!d@} ${!e@} ${!f@} ${!g@} ${!h@} ${!i@} ${!j@} ${!k@} ${!l@} ${!m@} ${!n@} ${!o@} ${!p@} ${!q@} ${!r@} ${!s@} ${!t@} ${!u@} ${!v@} ${!w@} ${!x@} ${!y@} ${!z@} ${!A@} ${!B@} ${!C@} ${!D@} ${!E@} ${!F@} ${!G@} ${!H@} ${!I@} ${!J@} ${!K@} ${!L@} ${!M@} ${!N@} ${!O@} ${!P@} ${!Q@} ${!R@} ${!S@} ${!T@} ${!U@} ${!V@} ${!W@} ${!X@} ${!Y@} ${!Z@} ${!_@}; do
    if [[ ${!__phoenix_v@a} == *x* ]]; then __phoenix_put env "${1:-0}" "$__phoenix_v=${!__phoenix_v-}"; fi
  done
}
__phoenix_pure() {
  local __phoenix_x=$1 __phoenix_rest __phoenix_first
  if [[ $__phoenix_x =~ $__phoenix_restricted ]]; then return 1; fi
  if [[ $__phoenix_x == '[['* || $__phoenix_x == '(('* || $__phoenix_x == 'for (('* ]]; then return 0; fi
  __phoenix_rest=$__phoenix_x
  while [[ $__phoenix_rest =~ ^[A-Za-z_][A-Za-z0-9_]*=[^[:space:]\$\`\<\>]*[[:space:]]+ ]]; do
    __phoenix_rest=${__phoenix_rest:${#BASH_REMATCH[0]}}
  done
  case ${__phoenix_rest%%[[:space:]]*} in
    read|mapfile|readarray) __phoenix_rest=${__phoenix_rest//<<</}; [[ $__phoenix_rest != *[\<\>]* ]]; return ;;
  esac
  __phoenix_first=${__phoenix_x%%[[:space:]]*}
  if [[ $__phoenix_x == *[\<\>]* ]]; then return 1; fi
  case $__phoenix_x in
    '[ '*|'test '*|true|false|:|': '*|'let '*|shift|'shift '*|break|continue|'break '*|'continue '*) return 0 ;;
    'getopts '*|'printf -v '*|'set --'|'set -- '*) return 0 ;;
    'for '*|'case '*) return 0 ;;
  esac
  case $__phoenix_first in declare|typeset|local|export|readonly|unset) return 0 ;; esac
  if declare -F -- "$__phoenix_first" >&5 2>&5; then return 0; fi
  if [[ $__phoenix_x =~ ^[A-Za-z_][A-Za-z0-9_]*\+?=\( ]]; then return 0; fi
  __phoenix_rest=$__phoenix_x
  while [[ $__phoenix_rest =~ $__phoenix_assign$__phoenix_word([[:space:]]+|$) ]]; do
    __phoenix_rest=${__phoenix_rest:${#BASH_REMATCH[0]}}
    if [[ -z $__phoenix_rest ]]; then return 0; fi
  done
  return 1
}
__phoenix_words() {
  local __phoenix_emit=$1 __phoenix_k __phoenix_at=-1
  shift
  for (( __phoenix_k = 1; __phoenix_k <= $#; __phoenix_k++ )); do
    if [[ ${!__phoenix_k} == pretrain_gpt.py || ${!__phoenix_k} == */pretrain_gpt.py ]]; then __phoenix_at=$__phoenix_k; break; fi
  done
  if (( __phoenix_at < 0 )); then return 1; fi
  if [[ -n $__phoenix_emit ]]; then
    for (( __phoenix_k = 1; __phoenix_k < __phoenix_at; __phoenix_k++ )); do
      __phoenix_put pre "$__phoenix_emit" "${!__phoenix_k}"
    done
    shift "$__phoenix_at"
    for __phoenix_k in "$@"; do __phoenix_put word "$__phoenix_emit" "$__phoenix_k"; done
  fi
  return 10
}
__phoenix_end() {
  if (( BASH_SUBSHELL > 0 )); then kill -KILL $$; fi
  exit "$1"
}
__phoenix_gate() {
  if (( BASH_SUBSHELL > 8 )); then [[ ${__phoenix_too_deep:?subshells nested deeper than 8} ]]; fi
  local __phoenix_c=$BASH_COMMAND __phoenix_n=$1 __phoenix_e __phoenix_name= __phoenix_err __phoenix_rc
  shift
  if [[ ${FUNCNAME[1]-} =~ $__phoenix_mine ]]; then return 0; fi
  if [[ ${FUNCNAME[1]-} == __phoenix_gate ]]; then
    case $__phoenix_c in
      'set -u'|'set +u'|'eval "$__phoenix_c"'|'eval "__phoenix_w=( $__phoenix_e )"'|'__phoenix_words "" "${__phoenix_w[@]}"'|'__phoenix_words "$__phoenix_n" "${__phoenix_w[@]}"'|'__phoenix_w=('*) return 0 ;;
    esac
    if __phoenix_pure "$__phoenix_c"; then return 0; fi
    __phoenix_put skip "$__phoenix_n" "$__phoenix_c"
    printf '\037phoenix-not-run:%s\037' "$__phoenix_n"
    return 1
  fi
  if [[ $__phoenix_c == 'source script.sh "$@"' ]]; then return 0; fi
  if __phoenix_pure "$__phoenix_c"; then
    if [[ $__phoenix_c =~ ^([A-Za-z_][A-Za-z0-9_]*)(\[[^]]*\])?\+?= ]]; then __phoenix_name=${BASH_REMATCH[1]}; fi
    if [[ -n $__phoenix_name && $__phoenix_c =~ $__phoenix_bashown ]]; then
      __phoenix_put own "$__phoenix_n" "$__phoenix_c"
      if [[ $__phoenix_c =~ ^[A-Za-z_][A-Za-z0-9_]*\+?=\( ]]; then
        eval "$__phoenix_name=( \"\037phoenix-own:$__phoenix_n\037\" )"
      else
        printf -v "$__phoenix_name" '\037phoenix-own:%s\037' "$__phoenix_n"
      fi
      return 1
    elif [[ -n $__phoenix_name && $__phoenix_c == *'$'* && ! $__phoenix_c =~ $__phoenix_subst ]]; then
      if ! __phoenix_err=$( ( set -u; eval "$__phoenix_c" ) 2>&1 ); then
        __phoenix_put unsetvar "$__phoenix_n" "$__phoenix_c"$'\036'"$__phoenix_err"
        if [[ $__phoenix_c =~ ^[A-Za-z_][A-Za-z0-9_]*\+=\( ]]; then
          eval "$__phoenix_name+=( \"\037phoenix-unset:$__phoenix_n\037\" )"
        elif [[ $__phoenix_c =~ ^[A-Za-z_][A-Za-z0-9_]*=\( ]]; then
          eval "$__phoenix_name=( \"\037phoenix-unset:$__phoenix_n\037\" )"
        else
          printf -v "$__phoenix_name" '\037phoenix-unset:%s\037' "$__phoenix_n"
        fi
        return 1
      fi
    elif [[ $__phoenix_c == *'$'* && ! $__phoenix_c =~ $__phoenix_subst && ( $__phoenix_c == ':'* || $__phoenix_c == '[ '* || $__phoenix_c == 'test '* ) ]]; then
      __phoenix_err=$( ( eval "$__phoenix_c" ) 2>&1 )
      if [[ -n $__phoenix_err ]]; then __phoenix_put stops "$__phoenix_n" "$__phoenix_c"$'\036'"$__phoenix_err"; __phoenix_end 3; fi
    fi
    return 0
  fi
  __phoenix_e=$__phoenix_c
  while [[ $__phoenix_e =~ $__phoenix_tail ]]; do __phoenix_e=${__phoenix_e:0:${#__phoenix_e}-${#BASH_REMATCH[0]}}; done
  if [[ $__phoenix_e =~ $__phoenix_subst || $__phoenix_e == *[\<\>]* || $__phoenix_e =~ $__phoenix_bashown ]]; then
    if [[ $__phoenix_c == *pretrain_gpt.py* ]]; then __phoenix_put unreadable "$__phoenix_n" "$__phoenix_c"; __phoenix_end 3; fi
  else
    ( set +u; eval "__phoenix_w=( $__phoenix_e )" && __phoenix_words "" "${__phoenix_w[@]}" ) 2>&5
    __phoenix_rc=$?
    if (( __phoenix_rc == 10 )); then
      if [[ $__phoenix_launched == *" $__phoenix_n "* ]]; then __phoenix_end 0; fi
      __phoenix_launched+="$__phoenix_n "
      if ! __phoenix_err=$( ( set -u; eval "__phoenix_w=( $__phoenix_e )" && __phoenix_words "$__phoenix_n" "${__phoenix_w[@]}" ) 2>&1 ); then
        if [[ -n $__phoenix_err ]]; then __phoenix_put unset "$__phoenix_n" "$__phoenix_err"; __phoenix_end 3; fi
      fi
      __phoenix_put launch "$__phoenix_n" "$__phoenix_c"
      __phoenix_exports "$__phoenix_n"
      return 1
    fi
  fi
  if [[ $__phoenix_launched != ' ' && ( $__phoenix_c == exit || $__phoenix_c == 'exit '* ) ]] && (( BASH_SUBSHELL == 0 )); then
    __phoenix_end 0
  fi
  __phoenix_put skip "$__phoenix_n" "$__phoenix_c"
  if (( BASH_SUBSHELL > 0 )); then printf '\037phoenix-not-run:%s\037' "$__phoenix_n"; fi
  case ${__phoenix_c%%[[:space:]]*} in cd|pushd|popd) printf -v PWD '\037phoenix-not-run:%s\037' "$__phoenix_n" ;; esac
  return 1
}
readonly -f __phoenix_put __phoenix_pure __phoenix_words __phoenix_end __phoenix_exports __phoenix_gate
__phoenix_launched=' '
shopt -s extdebug
set -T
set -r
trap '__phoenix_gate "$LINENO" "$@"' DEBUG
source script.sh "$@"
__phoenix_exports
"""


@dataclass(frozen=True)
class Launch:
    """A launch script's ``pretrain_gpt.py`` command. ``args``: its words after ``pretrain_gpt.py``, expanded;
    ``line``: the line it is on (for a command over several lines, the line bash reports: its last);
    ``not_run``: ``"line N: text"`` of every command before it that was not run (bash's text of the command);
    ``launcher``: its words before ``pretrain_gpt.py``, expanded (``torchrun --nproc_per_node 8``, or
    ``CUDA_DEVICE_MAX_CONNECTIONS=1 python``); ``environment``: the variables the command runs with that the
    script set (:attr:`Reading.environment`, then the launcher's leading ``NAME=VALUE`` words, also after
    ``env``); ``same_at``: the lines of later ``pretrain_gpt.py`` commands with the same words (the script is
    read on after the first to look for them; one with other words is refused); ``read_to_end``: False when the
    script did not end within the time limit after the launch (a loop waiting on a command), so a later launch
    was not looked for in the rest."""

    args: list[str]
    line: int
    not_run: list[str]
    launcher: list[str] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)
    same_at: list[int] = field(default_factory=list)
    read_to_end: bool = True


@dataclass(frozen=True)
class Reading:
    """What reading a launch script gave. ``launch``: its ``pretrain_gpt.py`` command, None when the script
    ended without reaching one; ``not_run``: ``"line N: text"`` of every command not run up to the launch or the
    end; ``environment``: the variables exported where the launch ran (or at the script's end) whose value is
    new or differs from the environment the script was read in (``export NCCL_IB_HCA=mlx5``; not PATH, PWD,
    OLDPWD, SHLVL or ``_``, which bash or the reader set); a value that only a command not run would give, or that
    uses a variable that is not set, is :data:`UNKNOWN_VALUE`."""

    launch: Launch | None
    not_run: list[str]
    environment: dict[str, str]


#: An exported value the reading cannot give (a command not run, a variable not set)
UNKNOWN_VALUE = "<not known when the script was read>"
#: Variables bash or the reader itself sets, never the script's export
_NOT_THE_SCRIPTS = frozenset({"PATH", "PWD", "OLDPWD", "SHLVL", "_"})
#: A word that runs python: an interpreter (a path to one too), a python launcher, or a script file
_PYTHON_WORD = re.compile(r"(?:.*/)?(?:python[0-9.]*|torchrun|deepspeed)|.*\.py")


def python_commands(not_run: Sequence[str]) -> list[str]:
    """The entries of ``not_run`` (``"line N: text"``, :attr:`Reading.not_run`) that run python: a word
    ``python``, ``python3``, ``python3.11`` (a path to one too), ``torchrun`` or ``deepspeed``, or a word ending
    in ``.py`` (``train.py``, ``srun python -m x`` included). Pure."""
    out = []
    for entry in not_run:
        text = entry.split(": ", 1)[-1]
        words = re.split(r"[\s;|&()]+", text)
        if any(_PYTHON_WORD.fullmatch(w.strip("\"'")) for w in words if w):
            out.append(entry)
    return out


def _records(raw: bytes) -> list[tuple[str, int, str]]:
    """The gate's records ``(kind, line, text)``; a malformed one (not three fields) is left out."""
    out = []
    for rec in raw.split(b"\0"):
        parts = rec.decode("utf-8", "replace").split("\x1f", 2)
        if len(parts) == 3:
            kind, line, text = parts
            out.append((kind, int(line) if line.isdigit() else 0, text))
    return out


def _listed_once(skipped: Sequence[tuple[int, str]]) -> list[str]:
    """``"line N: text"`` of every command not run, once each in order of its line: a command bash reached
    several times (in a loop, a function called twice) is listed once, with how many times
    (``line 4: echo $x (reached 3 times)``). Pure."""
    counts: dict[tuple[int, str], int] = {}
    for line, t in skipped:
        counts[(line, t)] = counts.get((line, t), 0) + 1
    return [f"line {line}: {t}" + (f" (reached {n} times)" if n > 1 else "") for (line, t), n in counts.items()]


def _later_launches(records: Sequence[tuple[str, int, str]], launch_lines: Sequence[int], *, path: str) -> list[int]:
    """The lines of the ``pretrain_gpt.py`` commands after the first (``launch_lines[0]``) that run with the same
    words (before and after ``pretrain_gpt.py``): one config obeys them all. Raises ConfigError naming both lines
    when one runs with other words: one config cannot obey two launches."""
    def words(kind: str, at: int) -> list[str]:
        return [t for k, line, t in records if k == kind and line == at]

    first = launch_lines[0]
    same = []
    for at in launch_lines[1:]:
        if words("word", at) == words("word", first) and words("pre", at) == words("pre", first):
            same.append(at)
            continue
        a, b = words("pre", first) + words("word", first), words("pre", at) + words("word", at)
        only_a = [_clean(w) for w in a if w not in b][:6]
        only_b = [_clean(w) for w in b if w not in a][:6]
        raise ConfigError(f"--args-file {path}: the script launches pretrain_gpt.py on line {first} and again on "
                          f"line {at} with other words (only on line {first}: {' '.join(only_a) or '(none)'}; only "
                          f"on line {at}: {' '.join(only_b) or '(none)'}), and one config holds one launch's "
                          "arguments (allowed: a script that launches it once, or every time with the same words: "
                          "edit the script to keep the launch you mean, or give the --script-arg values or "
                          "environment under which it takes one branch)")
    return same


def _said(message: str) -> str:
    """bash's message without its ``NAME: line N:`` prefix (the last line of ``message``)."""
    message = message.strip()
    return re.sub(r"^.*?line \d+: ", "", message.splitlines()[-1]) if message else "not set"


def _kill_group(proc: subprocess.Popen, wait_s: float = 5.0) -> None:
    """Kill the reader's process group until no member is left (a subshell forking while the first signal
    arrives is caught by a later one), then reap the top bash. Bounded by ``wait_s`` seconds."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            break
        if proc.poll() is None:
            proc.wait()
        if time.monotonic() > deadline:
            break
        time.sleep(0.01)
    proc.wait()


def read_launch(text: str, *, path: str, script_args: Sequence[str] = (),
                env: Mapping[str, str] | None = None, timeout_s: float = TIMEOUT_S) -> Launch | None:
    """The ``pretrain_gpt.py`` command of the launch script ``text`` (:func:`read_script`'s ``launch``); None when
    the script ends without reaching one, or when there is no bash here. Raises as :func:`read_script`."""
    reading = read_script(text, path=path, script_args=script_args, env=env, timeout_s=timeout_s)
    return None if reading is None else reading.launch


def _clean(value: str) -> str:
    """``value`` with the reader's marks (a command not run, a variable not set) shown as :data:`UNKNOWN_VALUE`."""
    return re.sub("\x1fphoenix-[a-z-]+:\\d+\x1f", UNKNOWN_VALUE, value)


def _launch_environment(launcher: list[str]) -> dict[str, str]:
    """The leading ``NAME=VALUE`` words of a launch command's words before ``pretrain_gpt.py`` (after an
    ``env`` word too): the variables bash, or ``env``, sets for that command alone. Pure."""
    words = launcher[1:] if launcher and launcher[0].rsplit("/", 1)[-1] == "env" else launcher
    out: dict[str, str] = {}
    for w in words:
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", w, re.S)
        if m is None:
            break
        out[m.group(1)] = _clean(m.group(2))
    return out


def read_script(text: str, *, path: str, script_args: Sequence[str] = (),
                env: Mapping[str, str] | None = None, timeout_s: float = TIMEOUT_S) -> Reading | None:
    """Read the launch script ``text`` (read from ``path``: ``$0``) as ``bash path script_args...`` would run it
    with ``env`` as its environment (default: this process's), no command of the script run (module
    docstring), up to its ``pretrain_gpt.py`` command or its end. ``launch`` is None when the script ends
    without reaching one (a fragment of arrays and option lines; a launch in a branch not taken; a script that
    runs another entry point, whose command is in ``not_run``). None when there is no bash here.

    Raises ConfigError (naming ``path`` and the line) when the current folder no longer exists, when a launch
    word uses a variable that is not set or a
    value that only a command the script did not run would give, when the launch command's words cannot be
    read without running a command, when the script stops (``${1:?usage}``) or bash cannot parse it, when it
    launches ``pretrain_gpt.py`` again with other words (:func:`_later_launches`), or when bash takes more than
    ``timeout_s`` seconds before reaching a launch (a loop that waits on a command)."""
    bash = shutil.which("bash")
    if bash is None:
        return None
    with tempfile.TemporaryDirectory(prefix="phoenix-launch-") as tmp:
        (Path(tmp) / "script.sh").write_text(text, encoding="utf-8")
        report = Path(tmp) / "report"
        report.write_bytes(b"")
        run_env = {k: v for k, v in (os.environ if env is None else env).items()
                   if not k.startswith("BASH_FUNC_") and k not in ("BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS")}
        try:
            run_env["__phoenix_cwd"] = os.getcwd()
        except FileNotFoundError:
            raise ConfigError(f"--args-file {path}: the current folder no longer exists (deleted after the shell "
                              "entered it), and the script is read from there as bash would run it (allowed: run "
                              "from an existing folder)") from None
        # its own session: every subshell it leaves behind (the launch's end kills only the top bash) is in
        # that process group, which is killed once the reading is over, whatever its outcome
        proc = subprocess.Popen([bash, "--norc", "--noprofile", "-c", _GATE, path, str(report), *script_args],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                env=run_env, cwd=tmp, start_new_session=True)
        timed_out = False
        try:
            _, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out, err = True, b""
        finally:
            _kill_group(proc)
        records = _records(report.read_bytes())
        stderr = err.decode("utf-8", "replace").replace(str(Path(tmp) / "script.sh"), path)
    launch_lines = list(dict.fromkeys(line for kind, line, _ in records if kind == "launch"))
    if timed_out and not launch_lines:
        raise ConfigError(f"--args-file {path}: bash read the script for {timeout_s:g} s without reaching "
                          "its pretrain_gpt.py command or its end (a loop that waits on a command, which is "
                          "not run here, or a script that redefines bash builtins the reader calls; allowed: "
                          "a script whose loops end on their own values)")
    if launch_lines:  # what the script had run up to its (first) launch: reading went on to look for another
        at = next(i for i, (kind, _, _) in enumerate(records) if kind == "launch")
        before = records[:at]
        # kept: what makes a later launch's words, or refuses them; not what the script did after the launch ran
        # (a command not run, a stop, an export)
        records = before + [r for r in records[at:] if r[0] in ("launch", "word", "pre", "unset", "unreadable",
                                                                "unsetvar", "own")
                            or (r[0] == "env" and r[1] == launch_lines[0])]
        stderr = "\n".join(line for line in stderr.splitlines()
                           if not (m := re.search(r"line (\d+): ", line)) or int(m.group(1)) <= launch_lines[0])
    exported = {name: value for name, _, value in (t.partition("=") for kind, _, t in records if kind == "env")}
    environment = {k: _clean(v) for k, v in sorted(exported.items())
                   if k not in _NOT_THE_SCRIPTS and not k.startswith("__phoenix") and run_env.get(k) != v}
    skipped = [(line, t) for kind, line, t in records if kind == "skip"]
    for m in re.finditer(r"line (\d+): (.*): restricted: cannot redirect output", stderr):
        skipped.append((int(m.group(1)), f"a redirection to {m.group(2)} (the command it belongs to was not run)"))
    skipped.sort(key=lambda item: item[0])
    for kind, line, t in records:
        if kind == "unset":
            raise ConfigError(f"--args-file {path} line {line}: the pretrain_gpt.py command uses a variable that "
                              f"is not set: {_said(t)} ({_SET_IT})")
        if kind == "unreadable":
            raise ConfigError(f"--args-file {path} line {line}: the words of the pretrain_gpt.py command cannot be "
                              f"read here ({t!r}): it needs a command run to give them ($(...), `...`, <(...)), "
                              "holds a '<' or '>' that is not a redirection at its end, or uses bash's own $LINENO, "
                              "$FUNCNAME, $BASH_SOURCE or $_, which differ while the script is read (allowed: literal "
                              "values and variables, redirections to a plain file name at the end of the command)")
        if kind == "stops":
            command, _, said = t.partition("\x1e")
            raise ConfigError(f"--args-file {path} line {line}: the script stops at {command!r}: {_said(said)} "
                              "(allowed: give its positional arguments with --script-arg, or set the variable in "
                              "the environment)")
    if not launch_lines:
        if proc.returncode not in (0, 1) or (proc.returncode and "syntax error" in stderr):
            first = stderr.strip().splitlines()[0] if stderr.strip() else f"exit status {proc.returncode}"
            raise ConfigError(f"--args-file {path}: bash could not read the script: {first}")
        return Reading(launch=None, not_run=_listed_once(skipped), environment=environment)
    launch_line = launch_lines[0]
    args = [t for kind, line, t in records if kind == "word" and line == launch_line]
    unset_at = {line: t for kind, line, t in records if kind == "unsetvar"}
    found: dict[tuple[str, int], None] = {}
    for w in args:
        for kind, line in re.findall("\x1fphoenix-(unset|not-run|own):(\\d+)\x1f", w):
            found[(kind, int(line))] = None
    problems: list[str] = []
    for kind, line in sorted(found, key=lambda k: k[1]):
        if kind == "unset":
            command, _, said = unset_at.get(line, "\x1e").partition("\x1e")
            problems.append(f"--args-file {path} line {launch_line}: an argument of the pretrain_gpt.py command "
                            f"takes its value from line {line} ({command!r}), which uses a variable that is not set: "
                            f"{_said(said)} ({_SET_IT})")
        elif kind == "own":
            command = next((t for k, at, t in records if k == "own" and at == line), "")
            problems.append(f"--args-file {path} line {launch_line}: an argument of the pretrain_gpt.py command "
                            f"takes its value from line {line} ({command!r}), which uses bash's own $LINENO, "
                            "$FUNCNAME, $BASH_SOURCE or $_, which differ while the script is read (allowed: literal "
                            "values and variables the script sets)")
        else:
            cmds = [t for at, t in skipped if at == line] or ["a command"]
            problems.append(f"--args-file {path} line {launch_line}: an argument of the pretrain_gpt.py command "
                            f"takes its value from {cmds[0]!r} (line {line}), a command that is not run here "
                            "(allowed: literal values and variables the script sets; set the value in the script or "
                            "the environment)")
    if problems:
        raise ConfigError(problems)
    not_run = _listed_once(skipped)
    launcher = [_clean(t) for kind, line, t in records if kind == "pre" and line == launch_line]
    same_at = _later_launches(records, launch_lines, path=path)
    launch = Launch(args=args, line=launch_line, not_run=not_run, launcher=launcher,
                    environment={**environment, **_launch_environment(launcher)}, same_at=same_at,
                    read_to_end=not timed_out)
    return Reading(launch=launch, not_run=not_run, environment=environment)
