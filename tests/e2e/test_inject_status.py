"""``phoenix inject-fault`` and ``phoenix status`` against the real coordinator process.

The coordinator (its TCPStore, journal and decisions) is real; slots are played by this test through the
real rank-side client (register, heartbeats, polling instructions) with a real :class:`FaultTrigger`, so the
path CLI -> coordinator -> target slot -> trigger at (step, phase) -> landing record -> status is exercised
end to end without Slurm. Full-job tests on the local cluster live in ``test_status_cluster.py``.

One coordinator serves the whole module (it imports torch before it listens: seconds on a loaded host): the
tests run in file order on the same job, each from the step the slots have reached, and each reads only the
journal records and injections of its own requests. The test that ends the job comes last.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest
from click.testing import CliRunner

from phoenix_hpc.cli.main import cli
from phoenix_hpc.control import protocol as P
from phoenix_hpc.control.client import CoordinatorClient
from phoenix_hpc.control.journal import read_journal
from phoenix_hpc.drills.inject import STEP_MARGIN
from phoenix_hpc.faults.kinds import KINDS, PHASE_WIRE
from phoenix_hpc.faults.trigger import Actions, FaultTrigger, FiredFile, InjectedFault
from waiting import wait_for

CONFIG = """\
name: inject-test
data: {path: data/none}
parallelism: {tp: 1, pp: 1, dp: 2}
training: {steps: 400}
resources: {nodes: 2, spares: 1, gpus_per_node: 1}
resilience:
  k: 1
  placement_levels: [node]
  heartbeat_interval_s: 0.2
  heartbeat_timeout_s: 3.0
  collective_timeout_s: 6.0
"""


_wait = wait_for
LAST_STEP = 400  # training.steps of CONFIG

class Slot:
    def __init__(self, run_dir, world_rank, role, logical, node):
        self.pid = os.getpid() * 100 + world_rank
        self.c = CoordinatorClient(run_dir, world_rank, wait_s=10, pid=self.pid)
        self.world_rank, self.role, self.logical, self.node = world_rank, role, logical, node
        self.step = 0
        self.effects: list = []
        acts = Actions(exit=lambda c: self.effects.append(("exit", c)), kill_self=lambda: self.effects.append("kill"),
                       stop_self=lambda: self.effects.append("stop"), block=lambda ev: self.effects.append("block"))
        self.trigger = FaultTrigger(self.c.injections, notify=FiredFile(run_dir, world_rank), actions=acts)

    def start(self):
        self.c.register(node=self.node, role=self.role, logical_rank=self.logical,
                        grid=(1, 1, 2) if self.role == "active" else None, world_size=3)
        self.c.start_heartbeat(0.2, 3.0, lambda: (0 if self.role == "active" else None, self.step),
                               on_lost=lambda r: None)
        self.c.last_step = LAST_STEP
        # between steps a rank reads its instructions at least once per step; here, every 20 ms
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll_loop, daemon=True)
        self._poller.start()

    def _poll_loop(self):
        while not self._stop.wait(0.02):
            try:
                self.c.poll()
            except Exception:  # noqa: BLE001 -- the coordinator is gone at teardown
                return

    def close(self):
        self._stop.set()
        self._poller.join(5)
        self.c.close()

    def run_steps(self, upto):
        """Walk steps step+1..upto through every phase, as the rank loop does; return what fired."""
        raised = []
        while self.step < upto:
            self.c.poll()
            s = self.step + 1
            self.c.started_step = s
            for phase in ("forward_backward", "d2h", "h2h", "optimizer_step"):
                try:
                    self.trigger.check(s, phase)
                except InjectedFault as exc:
                    raised.append((s, phase, exc.fault_kind))
            self.step = s
        return raised


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """The module's coordinator process and its slots (world ranks 0, 1 active; 2 standby): ``(run_dir, slots)``."""
    with pytest.MonkeyPatch.context() as mp:
        yield from _job(tmp_path_factory.mktemp("inject"), mp)


def _job(tmp_path, monkeypatch):
    monkeypatch.setenv("PHOENIX_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv("SLURM_CONF", raising=False)
    run_dir = tmp_path / "run dir"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(CONFIG)
    proc = subprocess.Popen([sys.executable, "-m", "phoenix_hpc.control.coordinator", "--run-dir", str(run_dir),
                             "--host", "127.0.0.1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    slots = []
    try:
        # the coordinator imports torch first: tens of seconds on a loaded 2-core host
        _wait(lambda: (run_dir / P.COORDINATOR_FILE).exists() or proc.poll() is not None, 90, "coordinator.json")
        assert proc.poll() is None, proc.stdout.read()
        slots = [Slot(run_dir, 0, "active", 0, "nid00001"), Slot(run_dir, 1, "active", 1, "nid00002"),
                 Slot(run_dir, 2, "standby", None, "nid00003")]
        for s in slots:
            s.start()
        _wait(lambda: read_journal(run_dir, "job_running"), what="job_running")
        yield run_dir, slots
    finally:
        for s in slots:
            s.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def _new(run_dir, event: str, before: int) -> list[dict]:
    """The journal's ``event`` records after its first ``before`` (those the reading test caused)."""
    return read_journal(run_dir, event)[before:]


def _injections(run_dir, request_ids) -> list[dict]:
    """``phoenix status --json``'s injections of ``request_ids``, in the status's order."""
    st = json.loads(invoke("status", str(run_dir), "--json").output)
    return [i for i in st["injections"] if i["request_id"] in set(request_ids)]


CASES = [("crash", "d2h"), ("hang", "h2h"), ("transient", "optimizer"), ("kill-node", "forward"),
         ("link-down", "h2h"), ("gpu-error", "optimizer")]


def test_each_kind_lands_at_requested_step_and_phase(job):
    """One fault of every kind in turn at steps base + 5, + 10, + 15, ... (the slot's effects are recorded, so
    it keeps stepping and the next kind can be injected)."""
    run_dir, slots = job
    target = slots[1]
    base = max(s.step for s in slots[:2])
    fired0, ids = len(target.trigger.fired), []
    for i, (kind, phase) in enumerate(CASES):
        at = base + 5 * (i + 1)
        r = invoke("inject-fault", str(run_dir), "--kind", kind, "--rank", "1", "--at-step", str(at),
                   "--phase", phase, "--json", "--no-wait")
        assert r.exit_code == 0, r.output
        out = json.loads(r.output)
        assert out["targets"] == [1] and out["at_step"] == at and out["kind"] == kind
        assert out["state"] == "armed" and out["armed_steps"] == {"1": at}
        ids.append(out["request_id"])
        assert target.c.injections  # armed by the target itself before the command returned
        assert slots[0].run_steps(at + 2) == []  # the other slot is not affected
        before = len(target.effects)
        raised = target.run_steps(at + 2)
        assert [(f[1], f[2]) for f in target.trigger.fired[-1:]] == [(at, PHASE_WIRE[phase])]
        assert len(target.trigger.fired) == fired0 + i + 1
        if KINDS[kind].wire in ("transient", "gpu_error"):
            assert raised == [(at, PHASE_WIRE[phase], KINDS[kind].fault_kind)]
        else:
            assert raised == [] and target.effects[before:] == [
                {"crash": ("exit", 70), "hang": "stop", "kill-node": "kill", "link-down": "block"}[kind]]
        fwd = read_journal(run_dir, "inject_forwarded")
        assert fwd[-1]["targets"] == [1] and fwd[-1]["at_step"] == at and fwd[-1]["request_id"] == out["request_id"]
        assert fwd[-1]["kind"] == KINDS[kind].wire and fwd[-1]["phase"] == PHASE_WIRE[phase]
    assert [(i["kind"], i["phase"], i["at_step"], [(f["world_rank"], f["step"], f["phase"]) for f in i["fired"]])
            for i in _injections(run_dir, ids)] == [
        (k, p, base + 5 * (n + 1), [(1, base + 5 * (n + 1), p)]) for n, (k, p) in enumerate(CASES)]


def test_status_lists_slots_and_refusals_send_nothing_harmful(job):
    run_dir, slots = job
    st = json.loads(invoke("status", str(run_dir), "--json").output)
    assert st["job"]["state"] == "running" and st["job"]["grid"] == {"tp": 1, "pp": 1, "dp": 2}
    assert [(s["world_rank"], s["node"], s["state"], s["logical_rank"]) for s in st["slots"]] == [
        (0, "nid00001", "active", 0), (1, "nid00002", "active", 1), (2, "nid00003", "standby", None)]
    assert [(r["shard_id"], r["owner_node"], [h["node"] for h in r["holders"]]) for r in st["replicas"]] == [
        ("opt/pp0/tp0/dp0", "nid00001", ["nid00002"]), ("opt/pp0/tp0/dp1", "nid00002", ["nid00001"])]
    assert st["spare_slots_left"] == 1
    human = invoke("status", str(run_dir))
    assert human.exit_code == 0 and "opt/pp0/tp0/dp1" in human.output and "standby" in human.output
    # a step the target already did is refused: exit 2, the reason, nothing injected: by the CLI itself once
    # the coordinator's `progress` record (at most one a second) says the target's step, waited for here (the
    # coordinator's own refusal from the heartbeat: tests/unit/test_inject_refusal.py)
    base = slots[1].step + 5
    slots[1].run_steps(base)  # the newest step of the job (slot 0 is behind)
    slots[1].c.heartbeat(0, base)
    _wait(lambda: [e for e in read_journal(run_dir, "progress") if e["step"] >= base], 15,
          f"progress record of step {base}")
    old = base - 5
    forwarded = len(read_journal(run_dir, "inject_forwarded"))
    r = invoke("inject-fault", str(run_dir), "--kind", "crash", "--rank", "1", "--at-step", str(old))
    assert r.exit_code == 2, r.output
    assert f"--at-step: step {old} is already done (the job is at step {base})" in r.output, r.output
    assert _new(run_dir, "inject_forwarded", forwarded) == []
    # without --at-step the coordinator picks the step: the target's live step (newer than anything the
    # journal says) + STEP_MARGIN; the fault lands there
    slots[1].c.started_step = base
    r = invoke("inject-fault", str(run_dir), "--kind", "transient", "--rank", "1", "--json", "--no-wait")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["at_step"] == base + STEP_MARGIN
    (fwd,) = _new(run_dir, "inject_forwarded", forwarded)
    assert fwd["at_step"] == out["at_step"] and fwd["request_id"] == out["request_id"]
    assert slots[1].c.injections
    assert slots[1].run_steps(base + STEP_MARGIN + 1) == [(base + STEP_MARGIN, "forward_backward", "comm_error")]


def test_the_command_reaches_the_coordinator_without_torch(job):
    """`phoenix inject-fault` in a fresh interpreter uses the operator channel: no torch import (seconds,
    during which a job runs on), the coordinator forwards the request; a forged request is refused."""
    run_dir, slots = job
    at = slots[0].step + 20
    forwarded = len(read_journal(run_dir, "inject_forwarded"))
    rejected = len(read_journal(run_dir, "rejected"))
    code = ("import sys\nfrom phoenix_hpc.cli.main import cli\n"
            "try:\n    cli(sys.argv[1:], standalone_mode=False)\n"
            "finally:\n    print('torch imported:', 'torch' in sys.modules, file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", code, "inject-fault", str(run_dir), "--kind", "crash", "--rank", "0",
                          "--at-step", str(at), "--phase", "d2h", "--json", "--no-wait"], capture_output=True,
                         text=True, timeout=60,
                         env={**os.environ, "PHOENIX_HOME": os.environ["PHOENIX_HOME"]})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "torch imported: False" in out.stderr
    (fwd,) = _new(run_dir, "inject_forwarded", forwarded)
    assert fwd["at_step"] == at and fwd["targets"] == [0] and fwd["request_id"] == json.loads(out.stdout)["request_id"]
    assert slots[0].c.injections

    from phoenix_hpc.control.operator import operator_request
    from phoenix_hpc.errors import ControlError

    info = json.loads((run_dir / P.COORDINATOR_FILE).read_text())
    with pytest.raises(ControlError, match="without replying"):
        operator_request(info["host"], info["operator_port"], {"type": "stop", "reason": "forged"}, b"not-the-secret")
    _wait(lambda: [e for e in _new(run_dir, "rejected", rejected) if "operator channel" in e["reason"]],
          what="the forged request's rejection")
    assert not read_journal(run_dir, "coordinator_stopped")


def test_a_step_the_target_already_started_is_refused_by_the_target(job):
    """The coordinator's view of the target (heartbeats: step base) lags the target, which already started
    step base + 20. `phoenix inject-fault --at-step base+15` is refused by the target itself: exit 2, nothing
    armed, the refusal in the journal and in `phoenix status`."""
    run_dir, slots = job
    base = slots[1].step
    armed = list(slots[1].c.injections)
    refused = len(read_journal(run_dir, "inject_refused"))
    slots[1].c.started_step = base + 20
    r = invoke("inject-fault", str(run_dir), "--kind", "crash", "--rank", "1", "--at-step", str(base + 15),
               "--no-wait")
    assert r.exit_code == 2, r.output
    assert f"already started step {base + 20}" in r.output and "nothing was injected" in r.output
    assert slots[1].c.injections == armed
    (ref,) = _new(run_dir, "inject_refused", refused)
    assert ref["targets"] == [1] and f"already started step {base + 20}" in ref["reason"]
    (inj,) = _injections(run_dir, [ref["request_id"]])
    assert inj["state"] == "refused" and inj["fired"] == []
    assert "refused" in invoke("status", str(run_dir)).output
    slots[1].c.started_step = base  # what the slot's step loop says again from here on


def test_a_fault_the_target_fires_is_reported_landed_by_the_waiting_command(job):
    """Without --no-wait the command returns once the fault landed, at the armed step and phase (exit 0)."""
    run_dir, slots = job
    at = slots[1].step + 6
    armed = len(read_journal(run_dir, "inject_armed"))
    result = {}

    def waiting_command():
        result["r"] = CliRunner().invoke(cli, ["inject-fault", str(run_dir), "--kind", "transient", "--rank", "1",
                                               "--at-step", str(at), "--phase", "h2h", "--json"])

    t = threading.Thread(target=waiting_command)
    t.start()
    _wait(lambda: _new(run_dir, "inject_armed", armed), what="armed")
    assert slots[1].run_steps(at + 1) == [(at, "h2h", "comm_error")]
    t.join(60)
    r = result["r"]
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["state"] == "landed" and out["landed"] == [{"world_rank": 1, "step": at, "phase": "h2h"}]


def test_an_armed_fault_the_job_never_reaches_is_reported_missed(job):
    """Armed for step end + 5; the job ends at step end: the waiting command exits 1 naming the miss, the
    journal has inject_missed, `phoenix status` says missed. Nothing fired. (Last: it ends the module's job.)"""
    run_dir, slots = job
    end = max(s.step for s in slots[:2]) + 3
    armed = len(read_journal(run_dir, "inject_armed"))
    fired = len(slots[1].trigger.fired)
    result = {}

    def waiting_command():
        result["r"] = CliRunner().invoke(cli, ["inject-fault", str(run_dir), "--kind", "crash", "--rank", "1",
                                               "--at-step", str(end + 5), "--json"])

    t = threading.Thread(target=waiting_command)
    t.start()
    _wait(lambda: _new(run_dir, "inject_armed", armed), what="armed")
    assert t.is_alive()  # the command waits for the landing
    for s in slots[:2]:
        s.run_steps(end)
        s.c.report_done(0, end, f"h{s.world_rank}")
    t.join(60)
    r = result["r"]
    assert r.exit_code == 1, r.output
    assert "armed but did not land" in r.output and f"the job ended (done) before step {end + 5}" in r.output
    (armed_rec,) = _new(run_dir, "inject_armed", armed)
    (miss,) = [m for m in read_journal(run_dir, "inject_missed") if m["request_id"] == armed_rec["request_id"]]
    assert miss["world_rank"] == 1 and miss["at_step"] == end + 5
    (inj,) = _injections(run_dir, [armed_rec["request_id"]])
    assert inj["state"] == "missed" and inj["fired"] == [] and inj["missed"][0]["world_rank"] == 1
    assert "missed" in invoke("status", str(run_dir)).output
    assert len(slots[1].trigger.fired) == fired
