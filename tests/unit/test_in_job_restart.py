"""``resilience.checkpoint.restart: in-job`` and ``resilience.recovery_source: checkpoint``: the config
fields (refused outside their mode, naming the allowed values) and the batch script's in-job loop (bash -n;
a new srun step on the nodes left, the step ended at once on a restart request)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from phoenix_hpc.control import recovery_machine
from phoenix_hpc.config import load_job_config
from phoenix_hpc.config.resolve import resolve
from phoenix_hpc.errors import ConfigError
from phoenix_hpc.profiles import load_profile
from phoenix_hpc.slurm.render import render_sbatch

ROOT = Path(__file__).resolve().parents[2]


def _cfg(tmp_path, **resilience) -> Path:
    cfg = yaml.safe_load((ROOT / "examples" / "gpt-small.yaml").read_text())
    cfg["data"]["path"] = str(ROOT / "data" / "stdlib")
    cfg["resilience"].update(resilience)
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


@pytest.mark.parametrize("res,needle", [
    ({"mode": "checkpoint-restart", "checkpoint": {"restart": "inside"}}, "'requeue' or 'in-job'"),
    ({"mode": "phoenix", "checkpoint": {"restart": "in-job"}}, "needs resilience.mode 'checkpoint-restart'"),
    ({"mode": "phoenix", "recovery_source": "disk"}, "'memory' or 'checkpoint'"),
    ({"mode": "checkpoint-restart", "recovery_source": "checkpoint"}, "needs resilience.mode 'phoenix'"),
])
def test_restart_fields_are_refused_naming_the_allowed_values(tmp_path, res, needle):
    with pytest.raises(ConfigError) as e:
        load_job_config(_cfg(tmp_path, **res))
    assert needle in str(e.value)


def test_phoenix_submit_exits_2_on_an_unknown_restart(tmp_path):
    from click.testing import CliRunner

    from phoenix_hpc.cli.main import cli

    p = _cfg(tmp_path, mode="checkpoint-restart", checkpoint={"restart": "inside"})
    res = CliRunner().invoke(cli, ["submit", "--site", "local", "--dry-run", str(p)])
    assert res.exit_code == 2, res.output
    assert "restart" in res.output and "'requeue' or 'in-job'" in res.output and "Traceback" not in res.output


def _script(tmp_path, restart: str) -> str:
    cfg = load_job_config(_cfg(tmp_path, mode="checkpoint-restart", checkpoint={"restart": restart}))
    prof = load_profile("local")
    return render_sbatch(resolve(cfg, prof, run_dir="/scratch/runs/x", default_python="/opt/py"), prof)


def test_in_job_script_loops_over_srun_steps_in_the_allocation(tmp_path):
    s = _script(tmp_path, "in-job")
    subprocess.run(["bash", "-n"], input=s, text=True, check=True)
    loop = s[s.index("while :; do\n  # 1. the coordinator"):]
    assert '--nodes="$STEP_NODES"' in loop and '--ntasks="$((STEP_NODES * 1))"' in loop and '${STEP_NODELIST:+--nodelist="$STEP_NODELIST"}' in loop
    assert '--overlap' in loop  # the ended step's resources are held until its dead node is marked down
    assert 'scancel --signal=KILL "${SLURM_JOB_ID}.${STEP_NO}"' in loop
    assert "-m phoenix_hpc.control.in_job next-nodes" in loop and "STEP_NO=$((STEP_NO + 1))" in loop
    assert loop.index("srun ") < loop.index("next-nodes") < loop.index("\ndone\n")
    assert [x.strip()[:5] for x in s.splitlines()].count("srun ") == 1  # one srun line, run once per step


def test_requeue_script_has_no_loop(tmp_path):
    s = _script(tmp_path, "requeue")
    assert "STEP_NO" not in s and "in_job" not in s and 'scancel --signal=KILL "${SLURM_JOB_ID}.0"' in s


class _DictStore:
    """Stands in for the TCPStore: only ``set`` and ``queue_push`` are called on these paths."""

    def __init__(self) -> None:
        self.kv: dict[str, str] = {}
        self.queues: dict[str, list] = {}

    def set(self, key: str, value: str) -> None:
        self.kv[key] = value

    def queue_push(self, key: str, value) -> None:
        self.queues.setdefault(key, []).append(value)

    def queue_len(self, key: str) -> int:
        return len(self.queues.get(key, []))


def _coordinator(tmp_path, timing, n: int, now: float):
    from phoenix_hpc.control.coordinator import Coordinator, Slot
    from phoenix_hpc.control.journal import Journal
    from phoenix_hpc.control.states import JobState, SlotState, job_machine, slot_machine

    c = Coordinator(tmp_path, grid=(1, 1, n), timing=timing, clock=lambda: now)
    c.journal = Journal(tmp_path)
    c.store = _DictStore()
    c.job = job_machine(JobState.RUNNING)
    for w in range(n):
        c.slots[w] = Slot(w, f"n{w}", 100 + w, "active", slot_machine(f"slot {w}", SlotState.ACTIVE), now,
                          logical_rank=w, generation=0, step=7)
        c.rank_map[w] = w
    return c


def test_coordinator_asks_for_an_in_job_restart_without_the_nodes_of_the_dead_slots(tmp_path):
    """Slot 2's node died (process exit, no report); slot 1 reported the collective error it caused and
    then exited: its node is alive and stays in the next step. A checkpoint of step 5 is on disk."""
    from phoenix_hpc.control.classify import Fault, FaultKind
    from phoenix_hpc.control.coordinator import Timing
    from phoenix_hpc.control.journal import read_journal
    from phoenix_hpc.control.records import PendingFault
    from phoenix_hpc.control.states import JobState, SlotState

    ck = tmp_path / "ck"
    (ck / "step_5").mkdir(parents=True)
    c = _coordinator(tmp_path, Timing(in_job_restart=True, checkpoint_path=str(ck)), 3, now=50.0)
    c.faults.append(PendingFault(Fault(FaultKind.COMM_ERROR, (1,), ("n1",), False, "reset by peer"), 49.0))
    c._declare_dead([2], FaultKind.PROCESS_EXIT, "process exited", 49.5)
    c.slots[1].machine.to(SlotState.DEAD, "exited after its report")
    recovery_machine.decide(c, 50.0)
    req = json.loads((tmp_path / "in_job_restart.json").read_text())
    assert req["dead_nodes"] == ["n2"] and req["reason"]
    (rec,) = [r for r in read_journal(tmp_path) if r["event"] == "restart_in_job"]
    assert rec["dead_nodes"] == ["n2"]
    assert c.job.state is JobState.FAILED and c._end_at == 50.0  # the step is ended at once, no linger
    assert not [r for r in read_journal(tmp_path) if r["event"] == "recovery_start"]


def test_recovery_source_checkpoint_plans_a_checkpoint_restart_where_memory_would_do(tmp_path, monkeypatch):
    """A hot swap would cover the loss; with ``recovery_source: checkpoint`` the plan is the fallback's."""
    from phoenix_hpc.control.coordinator import Timing

    c = _coordinator(tmp_path, Timing(recovery_from_checkpoint=True), 2, now=10.0)
    called = {}
    monkeypatch.setattr(recovery_machine, "fallback", lambda c_, rec, exc, *a: called.setdefault("reason", exc.reason))
    from types import SimpleNamespace

    recovery_machine._plan(c, SimpleNamespace(quiesced={}), 10.0)
    assert called == {"reason": "resilience.recovery_source is 'checkpoint'"}


def test_a_second_in_job_restart_leaves_out_the_nodes_of_every_earlier_restart_too(tmp_path, capsys):
    from phoenix_hpc.control.in_job import RESTARTS_LOG, left_out, main, write_restart_request

    assert left_out([{"dead_nodes": ["n2"]}, {"dead_nodes": None}], ["n1"]) == ["n1", "n2"]
    args = ["next-nodes", "--run-dir", str(tmp_path), "--nodes", "n[1-4]", "--active", "2"]
    write_restart_request(tmp_path, ["n2"], 20, "kill-node")
    assert main(args) == 0 and capsys.readouterr().out.split() == ["n[1,3-4]", "1"]
    write_restart_request(tmp_path, ["n1"], 60, "crash")  # n2 is still down: the next step must not ask for it
    assert main(args) == 0 and capsys.readouterr().out.split() == ["n[3-4]", "0"]
    lines = [json.loads(x) for x in (tmp_path / RESTARTS_LOG).read_text().splitlines()]
    assert [(x["dead_nodes"], x["nodes"]) for x in lines] == [(["n2"], ["n1", "n3", "n4"]), (["n1"], ["n3", "n4"])]
    write_restart_request(tmp_path, ["n3"], 80, "crash")  # one node left for two active ones
    assert main(args) == 1 and "1 node(s) left" in capsys.readouterr().err
    (tmp_path / "in_job_restart.json").unlink()
    assert main(args) == 4  # no request: no restart
