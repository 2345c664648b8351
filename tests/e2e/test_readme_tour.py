"""The README's "A 5-minute tour", command by command, against a local cluster the tour itself starts, and the
sections after it that act on the tour's job: "Planned drains" and "When spares run out: shrink".

The commands are read from the README's ``bash`` blocks of those sections and run in order, in a fresh folder
holding a copy of ``examples/`` (the tour's relative paths: ``examples/gpt-small.yaml``, ``data/stdlib``),
each in ``bash -c`` with the environment the earlier commands set (``eval "$(phoenix cluster env)"``). The
commands of :data:`AFTER_TOUR` run on the tour's job to stop and resume (its two spares unused, as "Planned
drains" says) once it trains, before it is stopped: the run stopped and resumed is then one that shrank
(dp 2 -> 1), resumed at the config's dp = 2. Where the
README asks the reader to wait ("until it says running"), the test polls ``phoenix status --json`` as the
reader would re-run ``phoenix status``. The placeholders a reader fills in from what ``phoenix submit``
printed (``JOBID``, ``RUN_DIR``) are filled in from the last submit's output. What a command's README comment
quotes (``"steps replayed 0"``) must appear in what the command prints, and the JSON status is checked for what
the comment says in words. Two departures, each for time only:

- the job to break trains :data:`TOUR_STEPS` steps instead of the README's ``--steps 1500`` (time a person
  needs to read and type, not a machine; its faults land in its first 30 steps or so); the job to stop and
  resume keeps its 1500 steps: it is drained, shrunk and stopped in its first 100 steps or so, and its resumed
  job is cancelled by ``phoenix cluster down``;
- of the full ``phoenix drill`` commands only :data:`README_DRILL` runs here (as written: its reference and
  drill jobs of 50 steps, a crash and a corrupted replica with k = 1); the one of three default-kind faults
  is left out (two more jobs; ``tests/e2e/test_drill.py`` runs such a drill); the ``--dry-run`` form runs.

Every command's wall time is printed at the end (``-s``), for the suite's time budget.
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
TOUR_STEPS = 150  # the job to break: two faults and their recoveries before its end
README_STEPS = "--steps 1500"
#: the drill of the README that runs here (a plan the job survives by design: drills/drill.py)
README_DRILL = "phoenix drill examples/gpt-small.yaml --site local --faults 2 --kinds crash,corrupt-replica"
TOUR = "A 5-minute tour"
#: the README sections after the tour whose commands run on the tour's job to stop, before it is stopped
AFTER_TOUR = ("Planned drains", "When spares run out: shrink")


def section_commands(readme: str, title: str) -> list[tuple[str, str]]:
    """The commands of the README section ``## title``'s ``bash`` blocks, in order, each with its comment
    (the text after `` # ``; "" when none)."""
    section = readme.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]
    out = []
    for block in re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL):
        for line in block.splitlines():
            cmd, *comment = re.split(r"\s+#\s+", line.strip(), maxsplit=1)
            if cmd:
                out.append((cmd, comment[0] if comment else ""))
    return out


def readme_commands(readme: str) -> list[tuple[str, str]]:
    """The tour's commands, with those of :data:`AFTER_TOUR` before its ``scancel`` (Stop and resume)."""
    tour = section_commands(readme, TOUR)
    (stop,) = [i for i, (c, _) in enumerate(tour) if c.startswith("scancel")]
    return tour[:stop] + [c for title in AFTER_TOUR for c in section_commands(readme, title)] + tour[stop:]


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


def _check_drain(st: dict, node: str) -> None:
    """``phoenix status --json`` after the README's ``phoenix drain --node NODE``: the drain is done with 0 steps
    replayed, the node's slots moved onto a spare node of the job, and the node is shown ``drained``."""
    (d,) = st["drains"]
    assert (d["state"], d["steps_replayed"], d["nodes"]) == ("done", 0, [node]), d
    slots = {s["world_rank"]: s for s in st["slots"]}
    assert d["moved"] and all(slots[new]["node"] != node and slots[new]["state"] == "active"
                              and slots[new]["logical_rank"] == logical for _, new, logical in d["moved"]), (d, slots)
    roles = {n["name"]: n["role"] for n in st["nodes"]}
    assert roles[node] == "drained", roles
    (rec,) = [r for r in st["recoveries"] if r["generation"] == d["generation"]]
    assert rec["state"] == "done" and rec["steps_replayed"] == 0, rec


def _check_shrink(st: dict, drain_out: str) -> None:
    """``phoenix status --json`` after the README's ``phoenix drain --rank 3 --shrink`` on the tour's job
    (pp = 2 x dp = 2): dp 2 -> 1 at the fence the drain paused at, replaying no step; rank 3's DP replica is
    gone from the grid (two ranks left, pp = 2): rank 3's slot left (its node ``drained``), rank 1's is back in
    standby."""
    at = int(re.search(r"done at iteration (\d+)", drain_out).group(1))
    (sh,) = st["shrinks"]
    assert (sh["dp_from"], sh["dp_to"], sh["recoverable_step"]) == (2, 1, at - 1), sh
    assert st["job"]["grid"] == {"tp": 1, "pp": 2, "dp": 1}, st["job"]["grid"]
    (d,) = [x for x in st["drains"] if x["target"] == {"logical_rank": 3}]
    assert (d["state"], d["steps_replayed"]) == ("done", 0), d
    assert sorted(s["logical_rank"] for s in st["slots"] if s["state"] == "active") == [0, 1], st["slots"]
    slots = {s["world_rank"]: s for s in st["slots"]}
    (left,) = d["targets"]
    roles = {n["name"]: n["role"] for n in st["nodes"]}
    assert roles[slots[left]["node"]] == "drained", (left, roles)
    assert len(sh["freed"]) == 1 and slots[sh["freed"][0]]["state"] == "standby", (sh, slots)


def test_readme_tour_works_as_written():
    readme = (ROOT / "README.md").read_text()
    cmds = readme_commands(readme)
    tour = [c for c, _ in section_commands(readme, TOUR)]
    assert tour[0] == "phoenix cluster up" and tour[-1] == "phoenix cluster down"
    assert sum(README_STEPS in c for c in tour) == 2  # the job to break, the job to stop and resume
    drains = [c for c, _ in cmds if c.startswith("phoenix drain")]
    assert drains == ["phoenix drain --node nid00002", "phoenix drain --rank 3 --shrink"], drains
    work = Path(tempfile.mkdtemp(prefix="phx-tour-"))  # short: the cluster's socket paths stay < 108 bytes
    shutil.copytree(ROOT / "examples", work / "examples")
    env = _env(work / "home")
    up = False
    injected = 0
    drilled = False
    submitted: dict[str, str] = {}  # what the last `phoenix submit` printed: job id, run dir
    stopped_at = None
    drained: list[str] = []  # the drain commands run, in order
    timings: list[tuple[str, float]] = []  # (command, seconds), waits before it included
    try:
        for i, (cmd, comment) in enumerate(cmds):
            prev = cmds[i - 1][0] if i else ""
            t_wait = time.monotonic()
            if cmd.startswith("phoenix drill") and "--dry-run" not in cmd and cmd != README_DRILL:
                continue
            if cmd.startswith("phoenix inject-fault"):  # the tour: once `phoenix status` says running
                # (and, for the second fault, once the first one's recovery is done)
                wait_for(lambda: (s := _status(work, env))["job"]["state"] == "running"
                         and sum(r["state"] == "done" for r in s["recoveries"]) == injected, 120,
                         "the job to train", poll_s=0.5)
            if cmd.startswith("scancel") or (cmd.startswith("phoenix drain") and not drained):
                # "until it says running and shows a step"; the drains: every spare in standby
                wait_for(lambda: (s := _status(work, env))["job"]["state"] == "running"
                         and (s["job"]["step"] or 0) >= 1 and (drained or s["spare_nodes_left"] == 2), 180,
                         "the second job to train", poll_s=0.5)
            if cmd == "phoenix status" and prev.startswith("scancel"):  # "until it says stopped"
                wait_for(lambda: _status(work, env)["job"]["state"] == "stopped", 180, "the job to stop", poll_s=0.5)
            if not injected:  # the job to break (the job to stop and resume keeps the README's 1500 steps)
                cmd = cmd.replace(README_STEPS, f"--steps {TOUR_STEPS}")
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
            timings.append((cmd, time.monotonic() - t_wait))
            for quoted in re.findall(r'"([^"]+)"', comment):  # what the README says the command prints
                assert quoted in proc.stdout, f"`{cmd}` printed no {quoted!r} (README: {comment}):\n{proc.stdout}"
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
                print(f"the tour's faults: recoverable steps {[r['recoverable_step'] for r in done]} of {TOUR_STEPS}")
                j = st["job"]
                assert (j["checkpoint_step"] or 0) <= j["recoverable_step"] <= j["step"]
                assert (work / "timeline.png").stat().st_size > 10_000
            if cmd.startswith("scancel"):
                stopped_at = submitted["run dir"]
            if cmd == "phoenix status" and prev.startswith("scancel"):
                j = _status(work, env)["job"]
                assert j["state"] == "stopped" and j["checkpoint_step"] and "stopped" in proc.stdout
                assert f"phoenix submit --resume {stopped_at}" in j["end_reason"]  # the command that continues
            if cmd.startswith("phoenix submit --resume"):
                assert stopped_at and f"resuming {stopped_at} from the checkpoint of step" in proc.stdout
                stopped_at = "resumed"
            if cmd.startswith("phoenix drain"):
                assert injected == 2 and not stopped_at, "the drains act on the tour's job to stop and resume"
                drained.append(cmd)
                drain_out = proc.stdout
                print(f"{cmd}: {time.monotonic() - t0:.1f} s: {proc.stdout.strip()}")
            if cmd == "phoenix status" and prev == "phoenix drain --node nid00002":
                _check_drain(_status(work, env), "nid00002")
            if cmd == "phoenix status" and prev == "phoenix drain --rank 3 --shrink":
                _check_shrink(_status(work, env), drain_out)
    finally:
        print("\n".join(f"{dt:6.1f} s  {c}" for c, dt in timings))
        if up:
            subprocess.run(["bash", "-c", "phoenix cluster down"], cwd=work, env=env, capture_output=True,
                           timeout=120)
        shutil.rmtree(work, ignore_errors=True)
    assert injected == 2 and stopped_at == "resumed" and drilled and drained == drains
