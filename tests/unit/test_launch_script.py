"""Launch scripts read with bash, no command of theirs run (phoenix_hpc/config/launch_script.py)."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from phoenix_hpc.cli.main import cli
from phoenix_hpc.config.launch_script import read_launch
from phoenix_hpc.errors import ConfigError

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/")}

# The shape of Megatron-LM's own examples/*.sh: positional arguments, defaults, arithmetic, arrays passed
# unquoted (an element with a space becomes two words), an if block, a guard that would exit, a function.
SCRIPT = r"""#!/bin/bash
export CUDA_DEVICE_MAX_CONNECTIONS=1
CHECKPOINT_PATH=$1
DATA_PATH=${2:-corpus_text_document}
GPUS_PER_NODE=4
NUM_NODES=${NUM_NODES:-2}
WORLD_SIZE=$(($GPUS_PER_NODE*$NUM_NODES))
mkdir -p "{made}"
DTYPE="bf16"
MODEL_ARGS=(
    --num-layers 2
    --hidden-size 64   # a comment
)
EXTRA=()
if [[ "$DTYPE" == "bf16" ]]; then
    EXTRA+=("--bf16" "--seed 7")
else
    EXTRA+=(--fp16)
fi
for n in 1 2; do LAST=$n; done
if [ ! -f "$CHECKPOINT_PATH/never-there" ]; then
    echo "no checkpoint yet"
    exit 1
fi
run() {
    torchrun --nproc_per_node $GPUS_PER_NODE pretrain_gpt.py ${MODEL_ARGS[@]} ${EXTRA[@]} \
        --data-path "$DATA_PATH" --save "$CHECKPOINT_PATH" --world $WORLD_SIZE --last $LAST > "{log}" 2>&1
}
run
echo after
"""


def _script(tmp_path, text=SCRIPT):
    made, log = tmp_path / "made-by-mkdir", tmp_path / "train.log"
    path = tmp_path / "train.sh"
    path.write_text(text.replace("{made}", str(made)).replace("{log}", str(log)))
    return path, made, log


def test_a_launch_script_gives_the_words_bash_would_pass_and_runs_none_of_its_commands(tmp_path):
    path, made, log = _script(tmp_path)
    launch = read_launch(path.read_text(), path=str(path), script_args=["/ck"], env=ENV)
    assert launch.args == ["--num-layers", "2", "--hidden-size", "64", "--bf16", "--seed", "7",
                           "--data-path", "corpus_text_document", "--save", "/ck", "--world", "8", "--last", "2"]
    assert not made.exists() and not log.exists()  # mkdir and the redirection did not happen
    assert [line.split(": ", 1)[1] for line in launch.not_run] == [
        f'mkdir -p "{made}"', 'echo "no checkpoint yet"', "exit 1"]
    assert launch.not_run[0].startswith("line 8: ")


def test_the_environment_and_script_arguments_give_the_values(tmp_path):
    path, _, _ = _script(tmp_path)
    launch = read_launch(path.read_text(), path=str(path), script_args=["/ck", "blend_a"],
                         env=dict(ENV, NUM_NODES="16"))
    assert launch.args[launch.args.index("--world") + 1] == "64"
    assert launch.args[launch.args.index("--data-path") + 1] == "blend_a"


def test_a_variable_from_a_missing_positional_argument_is_refused_naming_its_line(tmp_path):
    path, _, _ = _script(tmp_path)
    with pytest.raises(ConfigError) as exc:
        read_launch(path.read_text(), path=str(path), env=ENV)
    (problem,) = exc.value.problems
    assert "line 3 ('CHECKPOINT_PATH=$1')" in problem and "$1: unbound variable" in problem
    assert "--script-arg" in problem


def test_a_launch_word_that_is_never_set_is_refused(tmp_path):
    path = tmp_path / "s.sh"
    path.write_text("python pretrain_gpt.py --data-path $NOWHERE\n")
    with pytest.raises(ConfigError, match="NOWHERE: unbound variable"):
        read_launch(path.read_text(), path=str(path), env=ENV)


def test_a_value_only_a_command_gives_is_refused_and_the_command_is_not_run(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "s.sh"
    path.write_text(f'NODES=$(touch "{marker}"; echo 4)\npython pretrain_gpt.py --nodes $NODES\n')
    with pytest.raises(ConfigError) as exc:
        read_launch(path.read_text(), path=str(path), env=ENV)
    assert not marker.exists()
    assert "a command that is not run here" in str(exc.value) and "touch" in str(exc.value)


def test_a_launch_command_with_a_command_substitution_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "s.sh"
    path.write_text(f'python pretrain_gpt.py --seed "$(touch "{marker}"; echo 3)"\n')
    with pytest.raises(ConfigError, match="needs a command run"):
        read_launch(path.read_text(), path=str(path), env=ENV)
    assert not marker.exists()


def test_a_fragment_without_a_launch_is_left_to_the_fragment_reading(tmp_path):
    path = tmp_path / "s.sh"
    path.write_text("A=( --num-layers 2 )\n--lr 1\n")
    assert read_launch(path.read_text(), path=str(path), env=ENV) is None


def test_a_loop_that_waits_on_a_command_is_refused_after_the_timeout(tmp_path):
    path = tmp_path / "s.sh"
    path.write_text("until [ -f /never/there ]; do sleep 1; done\npython pretrain_gpt.py --lr 1\n")
    with pytest.raises(ConfigError, match="without reaching its pretrain_gpt.py command"):
        read_launch(path.read_text(), path=str(path), env=ENV, timeout_s=1.0)


def test_words_that_mention_pretrain_gpt_py_are_not_the_launch(tmp_path):
    path = tmp_path / "s.sh"
    path.write_text('echo "see pretrain_gpt.py"\nsrun python3 /opt/megatron/pretrain_gpt.py --lr 2\n')
    launch = read_launch(path.read_text(), path=str(path), env=ENV)
    assert launch.args == ["--lr", "2"] and launch.line == 2


def _invoke(tmp_path, *args):
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        return CliRunner().invoke(cli, ["config", "from-megatron", *map(str, args)])
    finally:
        os.chdir(cwd)


SMALL = ("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --micro-batch-size 1 "
         "--global-batch-size 4 --train-iters 10 --lr 1e-3 --vocab-size 256 --attention-dropout 0 "
         "--hidden-dropout 0 --adam-beta2 0.95")


def test_cli_converts_a_script_with_its_script_arguments(tmp_path):
    (tmp_path / "run.sh").write_text(f"DATA=$1\nSTEPS=${{2:-10}}\nsrun python pretrain_gpt.py {SMALL} "
                                     "--data-path $DATA --train-iters $STEPS\n")
    r = _invoke(tmp_path, "--args-file", "run.sh", "--script-arg", "ds", "--script-arg", "20", "-o", "job.yaml")
    assert r.exit_code == 0, r.output
    text = (tmp_path / "job.yaml").read_text()
    assert "steps: 20" in text


def test_cli_refuses_a_launch_in_a_branch_not_taken_and_a_script_arg_without_a_file(tmp_path):
    (tmp_path / "run.sh").write_text(f"if [ \"$1\" = go ]; then\n  python pretrain_gpt.py {SMALL} --data-path ds\nfi\n")
    r = _invoke(tmp_path, "--args-file", "run.sh", "-o", "job.yaml")
    assert r.exit_code == 2 and "not reached when bash reads the script" in r.output
    assert not (tmp_path / "job.yaml").exists()
    r = _invoke(tmp_path, "--args-file", "run.sh", "--script-arg", "go", "-o", "job.yaml")
    assert r.exit_code == 0, r.output
    r = _invoke(tmp_path, "--script-arg", "go", "--", *SMALL.split(), "--data-path", "ds")
    assert r.exit_code == 2 and "--script-arg 'go': given without --args-file" in r.output


def test_no_file_is_written_by_a_redirection_of_any_command(tmp_path):
    targets = [tmp_path / f"f{i}" for i in range(7)]
    keep = tmp_path / "keep"
    keep.write_text("kept")
    path = tmp_path / "s.sh"
    path.write_text(f"""X=1 > {targets[0]}
[[ 1 ]] > {targets[1]}
for x in a; do Y=$x; done > {targets[2]}
{{ Z=1; }} > {targets[3]}
: > {keep}
declare -p X >> {targets[4]}
(( 1 )) > {targets[5]}
python pretrain_gpt.py --lr 1 > {targets[6]}
""")
    launch = read_launch(path.read_text(), path=str(path), env=ENV)
    assert launch.args == ["--lr", "1"]
    assert [t for t in targets if t.exists()] == [] and keep.read_text() == "kept"
    assert any(line.startswith("line 3: a redirection to") for line in launch.not_run), launch.not_run


def test_functions_from_the_environment_are_not_imported(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "s.sh"
    path.write_text("helper\npython pretrain_gpt.py --lr 1\n")
    env = dict(ENV, **{"BASH_FUNC_helper%%": f"() {{ touch {marker}; }}"})
    launch = read_launch(path.read_text(), path=str(path), env=env)
    assert not marker.exists() and launch.not_run == ["line 1: helper"]


def _read(tmp_path, text, **kw):
    path = tmp_path / "s.sh"
    path.write_text(text)
    return read_launch(path.read_text(), path=str(path), env=ENV, **kw)


@pytest.mark.parametrize("text", [
    # bash evaluates an array subscript held in a value as arithmetic, command substitution included
    "X='a[$(PATH=/usr/bin:/bin; touch {P})]'\nY=$((X))\npython pretrain_gpt.py --lr 1\n",
    "X='a[$(PATH=/usr/bin:/bin; touch {P})]'\npython pretrain_gpt.py --lr $((X))\n",
    "X='$(PATH=/usr/bin:/bin; touch {P})'\nY=${{X@P}}\npython pretrain_gpt.py --lr 1\n",
    # the reader's own names cannot be taken over
    "__phoenix_gate() {{ return 0; }}\nPATH=/usr/bin:/bin; touch {P}\npython pretrain_gpt.py --lr 1\n",
    "__phoenix_pure() {{ return 0; }}\nPATH=/usr/bin:/bin; touch {P}\npython pretrain_gpt.py --lr 1\n",
    "__phoenix_mine=.\nPATH=/usr/bin:/bin; touch {P}\npython pretrain_gpt.py --lr 1\n",
])
def test_commands_hidden_in_values_or_names_are_not_run(tmp_path, text):
    marker = tmp_path / "P"
    try:
        _read(tmp_path, text.format(P=marker))
    except ConfigError:
        pass  # refusing is fine; running is not
    assert not marker.exists()


@pytest.mark.parametrize("line", ["X=1 PATH=/usr/bin:/bin", "export A=1 PATH=/usr/bin:/bin", "declare -n Q=PATH"])
def test_an_assignment_that_reaches_path_anywhere_in_it_is_not_run(tmp_path, line):
    launch = _read(tmp_path, f"{line}\npython pretrain_gpt.py --lr 1\n")
    assert launch.not_run == [f"line 1: {line}"]


def test_the_reader_s_own_variables_do_not_hide_the_script_s(tmp_path):
    launch = _read(tmp_path, "n=${NNODES:-4}\nc=3\ne=5\nfor i in 1 2; do :; done\n"
                             "python pretrain_gpt.py --global-batch-size $((n*64)) --c $c --e $e --seed $((1000+i))\n")
    assert launch.args == ["--global-batch-size", "256", "--c", "3", "--e", "5", "--seed", "1002"]


def test_a_required_argument_idiom_stops_the_script_with_its_message(tmp_path):
    with pytest.raises(ConfigError, match=r"line 1: the script stops at ': \"\$\{DATA:\?set DATA first\}\"': "
                                          r"DATA: set DATA first"):
        _read(tmp_path, ': "${DATA:?set DATA first}"\npython pretrain_gpt.py --data-path $DATA\n')
    with pytest.raises(ConfigError, match="1: usage: train.sh DATA"):
        _read(tmp_path, 'DATA=${1:?usage: train.sh DATA}\npython pretrain_gpt.py --data-path $DATA\n')


def test_getopts_and_here_strings_set_what_they_set(tmp_path):
    text = ('while getopts "t:" opt; do case $opt in t) TP=$OPTARG;; esac; done\n'
            'IFS=, read -ra NODES <<< "a,b,c"\n'
            'python pretrain_gpt.py --tensor-model-parallel-size $TP --n ${#NODES[@]}\n')
    path = tmp_path / "s.sh"
    path.write_text(text)
    launch = read_launch(text, path=str(path), script_args=["-t", "4"], env=ENV)
    assert launch.args == ["--tensor-model-parallel-size", "4", "--n", "3"]


@pytest.mark.parametrize("launch_line", ['python pretrain_gpt.py --a "x >y" --b 1',
                                         "python pretrain_gpt.py --a 1 <<EOF\nxx\nEOF"])
def test_a_launch_whose_words_a_redirection_could_hide_is_refused_not_misread(tmp_path, launch_line):
    with pytest.raises(ConfigError, match="cannot be read here"):
        _read(tmp_path, launch_line + "\n")


def test_records_the_script_writes_itself_do_not_break_the_reader(tmp_path):
    assert _read(tmp_path, "{ declare -p HOME; } >&3\nprintf 'x\\0' >&3\nA=1\n") is None


def test_cli_writes_the_commands_not_run_into_the_config(tmp_path):
    (tmp_path / "run.sh").write_text(f"mkdir -p logs\nif grep -q H100 /proc/cpuinfo; then TP=4; else TP=2; fi\n"
                                     f"python pretrain_gpt.py {SMALL} --data-path ds "
                                     "--tensor-model-parallel-size $TP\n")
    r = _invoke(tmp_path, "--args-file", "run.sh", "-o", "job.yaml")
    assert r.exit_code == 0, r.output
    text = (tmp_path / "job.yaml").read_text()
    assert "# Commands of --args-file not run when it was read (as a condition, each counted as succeeded):" in text
    assert "#   line 1: mkdir -p logs" in text and "#   line 2: grep -q H100 /proc/cpuinfo" in text
    assert "tp: 4" in text  # the skipped grep counted as succeeded, as the comment says


def test_cli_names_another_megatron_lm_entry_point(tmp_path):
    (tmp_path / "bert.sh").write_text("ARGS=\"--num-layers $N\"\ntorchrun pretrain_bert.py $ARGS\n")
    r = _invoke(tmp_path, "--args-file", "bert.sh", "-o", "job.yaml")
    assert r.exit_code == 2 and "its command runs pretrain_bert.py" in r.output


@pytest.mark.parametrize("text, needle", [
    ("cd /usr\npython pretrain_gpt.py --save $PWD/x\n", "'cd /usr' (line 1), a command that is not run here"),
    ("DIR=${BASH_SOURCE[0]%/*}\npython pretrain_gpt.py --save $DIR/x\n", "uses bash's own $LINENO"),
    ("python pretrain_gpt.py --seed $LINENO\n", "uses bash's own $LINENO"),
])
def test_values_the_reader_cannot_give_as_the_script_would_are_refused(tmp_path, text, needle):
    with pytest.raises(ConfigError) as exc:
        _read(tmp_path, text)
    assert needle in str(exc.value), str(exc.value)


def test_set_dashdash_sets_the_positional_arguments(tmp_path):
    assert _read(tmp_path, "set -- 7\npython pretrain_gpt.py --num-layers $1\n").args == ["--num-layers", "7"]


def _processes_in(folder) -> list[int]:
    found = []
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != os.getpid():
            try:
                if os.readlink(f"/proc/{d}/cwd") == str(folder):
                    found.append(int(d))
            except OSError:
                pass
    return found


@pytest.mark.parametrize("text", [
    "return() {{ true; }}\nmkdir x\npython pretrain_gpt.py --num-layers 2\n",  # the gate's own return taken over
    "python pretrain_gpt.py --num-layers 2 | cat\n",  # the launch in a pipeline: its subshell ends the reading
])
def test_the_reading_leaves_no_process_behind(tmp_path, monkeypatch, text):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    path = tmp_path / "s.sh"
    path.write_text(text.format())
    try:
        read_launch(path.read_text(), path=str(path), env=ENV, timeout_s=3.0)
    except ConfigError:
        pass
    assert _processes_in(work) == []
