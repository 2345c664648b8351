"""The README's "A 5-minute tour", command by command, against a local cluster the tour itself starts.

The commands are read from the README's ``bash`` blocks of that section and run in order, in a fresh folder
holding a copy of ``examples/`` (the tour's relative paths: ``examples/gpt-small.yaml``, ``data/stdlib``),
each in ``bash -c`` with the environment the earlier commands set (``eval "$(phoenix cluster env)"``). Where
the tour asks the reader to wait ("until it says running"), the test polls ``phoenix status --json`` as the
reader would re-run ``phoenix status``. The placeholders a reader fills in from what ``phoenix submit``
printed (``JOBID``, ``RUN_DIR``) are filled in from the last submit's output. Three departures, each for
time only:

- the job to break trains :data:`TOUR_STEPS` steps and the job to stop and resume :data:`STOP_STEPS`
  instead of the README's ``--steps 1500`` (time a person needs to read and type, not a machine; the job to
  stop is stopped at its first steps, so what its resumed job trains is only time);
- of the full ``phoenix drill`` commands only :data:`README_DRILL` runs here (as written: its reference and
  drill jobs of 50 steps, a crash and a corrupted replica with k = 1); the one of three default-kind faults
  is left out (two more jobs; ``tests/e2e/test_drill.py`` runs such a drill); the ``--dry-run`` form runs;
- ``phoenix model simulate`` is left out (seconds of Monte Carlo; ``tests/unit/test_model_cli.py``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from waiting import wait_for

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[2]
TOUR_STEPS = 300  # the job to break: two faults and their recoveries before its end
STOP_STEPS = 100  # the job to stop (at its first steps) and resume
README_STEPS = "--steps 1500"
#: the drill of the README that runs here (a plan the job survives by design: drills/drill.py)
README_DRILL = "phoenix drill examples/gpt-small.yaml --site local --faults 2 --kinds crash,corrupt-replica"


def tour_commands(readme: str) -> list[str]:
    """The commands of the README's tour section, in order, comments removed."""
    section = readme.split("## A 5-minute tour", 1)[1].split("\n## ", 1)[0]
    out = []
    for block in re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL):
        for line in block.splitlines():
            cmd = re.sub(r"\s+#\s.*$", "", line).strip()
            if cmd:
                out.append(cmd)
    return out


def _env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("SLURM_CONF", None)
    env.pop("PHOENIX_CLUSTER_DIR", None)
    env.update(PHOENIX_HOME=str(home), COLUMNS="200", PATH=f"{ROOT / '.venv' / 'bin'}{os.pathsep}{env['PATH']}")
    return env


def _run(cmd: str, cwd: Path, env: dict[str, str], timeout_s: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)
    assert proc.returncode == 0, f"`{cmd}` exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _status(cwd: Path, env: dict[str, str]) -> dict:
    return json.loads(_run("phoenix status --json", cwd, env, 60).stdout)


def test_readme_tour_works_as_written():
    cmds = tour_commands((ROOT / "README.md").read_text())
    assert cmds[0] == "phoenix cluster up" and cmds[-1] == "phoenix cluster down"
    assert sum(README_STEPS in c for c in cmds) == 2  # the job to break, the job to stop and resume
    work = Path(tempfile.mkdtemp(prefix="phx-tour-"))  # short: the cluster's socket paths stay < 108 bytes
    shutil.copytree(ROOT / "examples", work / "examples")
    env = _env(work / "home")
    up = False
    injected = 0
    drilled = False
    submitted: dict[str, str] = {}  # what the last `phoenix submit` printed: job id, run dir
    stopped_at = None
    try:
        for i, cmd in enumerate(cmds):
            if cmd.startswith("phoenix drill") and "--dry-run" not in cmd and cmd != README_DRILL:
                continue
            if cmd.startswith("phoenix model simulate"):
                continue
            if cmd.startswith("phoenix inject-fault"):  # the tour: once `phoenix status` says running
                # (and, for the second fault, once the first one's recovery is done)
                wait_for(lambda: (s := _status(work, env))["job"]["state"] == "running"
                         and sum(r["state"] == "done" for r in s["recoveries"]) == injected, 120,
                         "the job to train", poll_s=0.5)
            if cmd.startswith("scancel"):  # "until it says running and shows a step"
                wait_for(lambda: (s := _status(work, env))["job"]["state"] == "running"
                         and (s["job"]["step"] or 0) >= 1, 180, "the second job to train", poll_s=0.5)
            if cmd == "phoenix status" and i > 0 and cmds[i - 1].startswith("scancel"):  # "until it says stopped"
                wait_for(lambda: _status(work, env)["job"]["state"] == "stopped", 180, "the job to stop", poll_s=0.5)
            cmd = cmd.replace(README_STEPS, f"--steps {STOP_STEPS if injected else TOUR_STEPS}")
            if re.search(r"\b(JOBID|RUN_DIR)\b", cmd) and not cmd.startswith("phoenix status"):
                assert submitted, f"`{cmd}` names the job of a submit, and none came before it"
                cmd = re.sub(r"\bJOBID\b", submitted["job id"], cmd)
                cmd = re.sub(r"\bRUN_DIR\b", shlex.quote(submitted["run dir"]), cmd)
            if cmd.startswith("eval "):
                proc = _run(f"{cmd} && env -0", work, env, 60)
                env = dict(kv.split("=", 1) for kv in proc.stdout.split("\0") if "=" in kv)
                continue
            if cmd.startswith("phoenix status --watch"):  # the job must not be over before the faults above
                assert injected == 2
            t0 = time.monotonic()
            proc = _run(cmd, work, env, 600 if "--watch" in cmd or cmd == README_DRILL else 300)
            if cmd == README_DRILL:  # exit 0: every fault landed and recovered, the final state is the reference's
                print(f"{cmd}: {time.monotonic() - t0:.1f} s")
                assert "drill passed" in proc.stdout and "run directory: " in proc.stdout, proc.stdout
                drilled = True
            up = up or cmd == "phoenix cluster up"
            if cmd.startswith("phoenix submit") and "--dry-run" not in cmd:
                submitted = dict(re.findall(r"^(job id|run dir)\s+(\S.*?)\s*$", proc.stdout, flags=re.M))
                assert set(submitted) == {"job id", "run dir"}, proc.stdout
            if cmd.startswith("phoenix inject-fault"):
                injected += 1
            if cmd == "phoenix cluster down":
                up = False
            if cmd.startswith("phoenix status --plot"):
                st = _status(work, env)
                assert st["job"]["state"] == "done" and st["job"]["steps_total"] == TOUR_STEPS
                done = [r for r in st["recoveries"] if r["state"] == "done"]
                assert [r["action"] for r in done] == ["hot_swap", "hot_swap"]
                j = st["job"]
                assert (j["checkpoint_step"] or 0) <= j["recoverable_step"] <= j["step"]
                assert (work / "timeline.png").stat().st_size > 10_000
            if cmd.startswith("scancel"):
                stopped_at = submitted["run dir"]
            if cmd == "phoenix status" and cmds[i - 1].startswith("scancel"):
                j = _status(work, env)["job"]
                assert j["state"] == "stopped" and j["checkpoint_step"] and "stopped" in proc.stdout
                assert f"phoenix submit --resume {stopped_at}" in j["end_reason"]  # the command that continues
            if cmd.startswith("phoenix submit --resume"):
                assert stopped_at and f"resuming {stopped_at} from the checkpoint of step" in proc.stdout
                stopped_at = "resumed"
    finally:
        if up:
            subprocess.run(["bash", "-c", "phoenix cluster down"], cwd=work, env=env, capture_output=True,
                           timeout=120)
        shutil.rmtree(work, ignore_errors=True)
    assert injected == 2 and stopped_at == "resumed" and drilled
