"""Fault kinds and phases, request building, the rank-side trigger (real process effects), drill planning."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from phoenix_hpc.control.classify import Action, Fault, FaultKind, classify, kind_from_exception
from phoenix_hpc.errors import FaultError
from phoenix_hpc.drills.drill import DrillOutcome, match_outcome, plan_drill, slot_cost
from phoenix_hpc.drills.inject import STEP_MARGIN, build_request, wait_pids_gone
from phoenix_hpc.faults.kinds import KINDS, PHASE_WIRE, PHASES, check_at_step, check_phase, parse_coord
from phoenix_hpc.faults.trigger import (
    EXIT_INJECTED_CRASH,
    Actions,
    FaultTrigger,
    FiredFile,
    InjectedCommError,
    InjectedGPUError,
    Injection,
    is_due,
    landed_exactly,
    read_fired,
    take_due,
)
from phoenix_hpc.status.derive import derive_status
from test_status_derive import node_loss_records, run_files, running_slurm, start_records

# --- kinds table --------------------------------------------------------------------------------------------


def test_kinds_table():
    assert list(KINDS) == ["crash", "kill-node", "hang", "link-down", "transient", "gpu-error", "corrupt-replica",
                           "bitflip"]
    assert PHASES == ("forward", "d2h", "h2h", "optimizer", "recovery", "restore")
    # restore: only the kinds that end or stop the process (an error raised there is no step's fault)
    assert [k for k in KINDS if "restore" in KINDS[k].phases] == ["crash", "kill-node", "hang"]
    assert PHASE_WIRE["restore"] == "restore"
    for k in KINDS.values():
        assert set(k.phases) <= set(PHASES) and k.phases
    assert "d2h" not in KINDS["transient"].phases and "d2h" not in KINDS["link-down"].phases
    assert "h2h" not in KINDS["gpu-error"].phases
    assert check_phase("crash", None) == "forward"
    assert PHASE_WIRE["optimizer"] == "optimizer_step" and PHASE_WIRE["forward"] == "forward_backward"


def test_exceptions_raised_by_trigger_classify_as_the_table_says():
    """The message of each raised injected error maps to the table's fault kind and action (classify.py)."""
    for exc, kind in ((InjectedCommError("DistBackendError: gloo collective failed: connection reset by peer"),
                       "transient"),
                      (InjectedGPUError("CUDA error: uncorrectable ECC error encountered (Xid 48, HBM)"),
                       "gpu-error")):
        fk = kind_from_exception(type(exc).__name__, str(exc))
        assert fk.value == exc.fault_kind == KINDS[kind].fault_kind
    assert classify(Fault(FaultKind.COMM_ERROR, all_alive=True)).action is Action.LOCAL_RECOVERY
    assert classify(Fault(FaultKind.GPU_MEMORY)).action is Action.HOT_SWAP
    for k in KINDS.values():
        assert FaultKind(k.fault_kind)  # every expected classification is a real FaultKind


@pytest.mark.parametrize("kind,phase,msg", [
    ("meteor", None, "--kind: 'meteor' is not a fault kind"),
    ("crash", "backward", "--phase: 'backward' is not a phase"),
    ("transient", "recovery", "transient supports forward|h2h|optimizer"),
    ("link-down", "d2h", "link-down supports"),
])
def test_check_phase_errors(kind, phase, msg):
    with pytest.raises(FaultError, match=msg.replace("|", r"\|")):
        check_phase(kind, phase)


def test_check_at_step_and_coord():
    check_at_step(None)
    check_at_step(5, live_step=4, total_steps=5)
    for kw, msg in (({"at_step": 0}, "steps start at 1"), ({"at_step": 4, "live_step": 4}, "already done"),
                    ({"at_step": 9, "total_steps": 8}, "beyond the job's last step")):
        with pytest.raises(FaultError, match=msg):
            check_at_step(**kw)
    assert parse_coord("1, 0 ,2", (4, 2, 2)) == (1, 0, 2)
    with pytest.raises(FaultError, match="outside the job's grid"):
        parse_coord("2,0,0", (4, 2, 2))
    with pytest.raises(FaultError, match="three integers"):
        parse_coord("-1,0,0")


# --- request building ---------------------------------------------------------------------------------------


def running_status(extra=()):
    recs = start_records() + list(extra)
    return derive_status(recs, running_slurm(), now=5.0, run=run_files(coordinator={"host": "h", "port": 1,
                                                                                     "pid": 2}))


def test_build_request_by_rank_coord_and_node():
    st = running_status()
    req = build_request(st, "crash", rank=2, at_step=9, phase="d2h")
    assert req.slots == (2,) and req.pids == (102,) and req.target == {"logical_rank": 2}
    body = req.body()
    assert body == {"type": "inject", "kind": "crash", "phase": "d2h", "at_step": 9, "target": {"logical_rank": 2},
                    "request_id": req.request_id}
    req = build_request(st, "transient", coord="0,3,0", phase="optimizer")
    assert req.target == {"coord": [0, 3, 0]} and req.slots == (3,) and req.body()["phase"] == "optimizer_step"
    # no --at-step: a lower bound from the journal (heartbeat summary max_step 6) + STEP_MARGIN, and the
    # coordinator is asked to pick the target's live step + STEP_MARGIN when the request arrives
    assert req.at_step == 6 + STEP_MARGIN and req.body()["steps_ahead"] == STEP_MARGIN
    # kill-node named by a rank hits every slot of that rank's node
    req = build_request(st, "kill-node", rank=1)
    assert req.target == {"node": "nid00001"} and req.slots == (0, 1) and req.body()["kind"] == "node_loss"
    assert not req.immediate
    # kill-node of a spare node: no active slot -> immediate (local cluster only)
    req = build_request(st, "kill-node", node="nid00003")
    assert req.immediate and req.slots == (4, 5)


def test_a_spare_node_takes_faults_for_a_recovery_phase_and_refuses_a_step_or_phase_it_cannot_honour():
    """A node with standby slots only runs no steps: a kill-node there without --phase and --at-step happens at
    once; given either, it cannot be at that step or phase and is refused (it used to be killed at once, the
    options dropped). A fault for a phase of a recovery is armed on its slots and lands as one of them takes
    over a rank (any kind that supports the phase); a step phase is refused."""
    st = running_status()
    for kw, named in (({"at_step": 40}, "--at-step"), ({"phase": "forward"}, "--phase"),
                      ({"phase": "optimizer", "at_step": 40}, "--phase and --at-step")):
        with pytest.raises(FaultError, match=f"^{named}: nid00003 holds only standby slots.*nothing was sent"):
            build_request(st, "kill-node", node="nid00003", **kw)
    for kind, phase in (("kill-node", "restore"), ("crash", "recovery"), ("crash", "restore"), ("hang", "restore")):
        req = build_request(st, kind, node="nid00003", phase=phase, at_step=9)
        assert not req.immediate and req.slots == (4, 5) and req.target == {"node": "nid00003"}, (kind, phase)
        assert req.body()["phase"] == phase and req.at_step == 9
    # a step the job has done is the next recovery's for a spare (it started no step), not for a member
    assert build_request(st, "crash", node="nid00003", phase="restore", at_step=1).at_step == 1
    with pytest.raises(FaultError, match="already done"):
        build_request(st, "crash", rank=1, phase="restore", at_step=1)
    with pytest.raises(FaultError, match="only with --phase recovery or restore"):
        build_request(st, "crash", node="nid00003")
    with pytest.raises(FaultError, match="only with --phase recovery or restore"):
        build_request(st, "crash", node="nid00003", phase="d2h")
    with pytest.raises(FaultError, match=r"only with --phase recovery \(as a spare"):  # the kind's own phases
        build_request(st, "link-down", node="nid00003")
    with pytest.raises(FaultError, match="in no phase: transient has no phase of a recovery"):
        build_request(st, "transient", node="nid00003")


def test_build_request_after_hot_swap_targets_the_new_slot():
    st = running_status(node_loss_records())
    req = build_request(st, "hang", rank=2, at_step=10)
    assert req.slots == (4,)


# --- the trigger ----------------------------------------------------------------------------------------------


def test_is_due_and_take_due():
    inj = Injection("crash", 5, "d2h")
    assert is_due(inj, 5, "d2h") and not is_due(inj, 4, "d2h") and not is_due(inj, 5, "h2h")
    rec = Injection("hang", 5, "recovery")
    assert is_due(rec, 7, "recovery") and not is_due(rec, 4, "recovery")
    res = Injection("crash", 5, "restore")  # also the first recovery at or after its step
    assert is_due(res, 5, "restore") and is_due(res, 9, "restore") and not is_due(res, 4, "restore")
    assert not is_due(res, 5, "recovery") and not is_due(rec, 7, "restore")
    # where it fired, judged by the same rule (the coordinator's inject_landed.exact, the command's outcome)
    assert landed_exactly(9, "restore", 5, "restore") and landed_exactly(5, "d2h", 5, "d2h")
    assert not landed_exactly(6, "d2h", 5, "d2h") and not landed_exactly(4, "restore", 5, "restore")
    assert not landed_exactly(5, "recovery", 5, "restore") and not landed_exactly(None, "d2h", 5, "d2h")
    pending = [{"kind": "crash", "at_step": 5, "phase": "h2h", "request_id": "a"}, {"bad": 1}, inj]
    assert take_due(pending, 5, "d2h") is inj and len(pending) == 2
    got = take_due(pending, 5, "h2h")
    assert got == Injection("crash", 5, "h2h", "a") and pending == [{"bad": 1}]


class Recorder(Actions):
    def __init__(self):
        self.calls = []
        super().__init__(exit=lambda c: self.calls.append(("exit", c)), kill_self=lambda: self.calls.append("kill"),
                         stop_self=lambda: self.calls.append("stop"), block=lambda ev: self.calls.append("block"))


def test_trigger_dispatch_and_notify_order(tmp_path):
    rec = Recorder()
    order = []
    t = FaultTrigger(notify=lambda inj, s, p: order.append(("notify", inj.kind, s, p)), actions=rec)
    for kind, step in (("crash", 2), ("node_loss", 3), ("hang", 4)):
        t.arm(kind, step, "forward_backward")
    for step in range(1, 6):
        for phase in ("forward_backward", "d2h", "h2h", "optimizer_step"):
            t.check(step, phase)
    assert rec.calls == [("exit", EXIT_INJECTED_CRASH), "kill", "stop"]
    assert order == [("notify", "crash", 2, "forward_backward"), ("notify", "node_loss", 3, "forward_backward"),
                     ("notify", "hang", 4, "forward_backward")]
    t.arm("transient", 7, "h2h")
    t.check(7, "d2h")
    with pytest.raises(InjectedCommError) as ei:
        t.check(7, "h2h")
    assert ei.value.fault_kind == "comm_error" and ei.value.injection.at_step == 7
    t.arm("gpu_error", 8, "optimizer_step")
    with pytest.raises(InjectedGPUError, match="Xid 48"):
        t.check(8, "optimizer_step")
    t.check(8, "optimizer_step")  # fired once only
    t.arm("teleport", 9, "d2h")
    with pytest.raises(ValueError, match="unknown injected fault kind"):
        t.check(9, "d2h")


def test_link_down_blocks_while_alive_and_runs_hooks():
    hooks = []
    t = FaultTrigger(on_link_down=[lambda: hooks.append("heartbeat stopped")])
    t.arm("link_down", 3, "h2h")
    th = threading.Thread(target=t.check, args=(3, "h2h"), daemon=True)
    th.start()
    assert t.link_down.wait(5)
    time.sleep(0.2)
    assert th.is_alive() and hooks == ["heartbeat stopped"]
    t.release.set()
    th.join(5)
    assert not th.is_alive()


def test_fired_file_is_read_back(tmp_path):
    FiredFile(tmp_path, 3, clock=lambda: 12.5)(Injection("crash", 5, "d2h", "req/../x"), 5, "d2h")
    (rec,) = read_fired(tmp_path)
    assert rec == {"ts": 12.5, "request_id": "req/../x", "world_rank": 3, "pid": os.getpid(), "kind": "crash",
                   "at_step": 5, "step": 5, "phase": "d2h"}
    assert [p.name for p in (tmp_path / "faults").iterdir()] == ["fired-reqx-w3.json"]
    assert oct((tmp_path / "faults").stat().st_mode & 0o777) == "0o700"


RANK_PROG = textwrap.dedent("""
    import sys, time
    from phoenix_hpc.faults.trigger import FaultTrigger, FiredFile
    run_dir, kind = sys.argv[1], sys.argv[2]
    t = FaultTrigger(notify=FiredFile(run_dir, 7))
    t.arm(kind, 3, "optimizer_step", "rq")
    for step in range(1, 6):
        for phase in ("forward_backward", "d2h", "h2h", "optimizer_step"):
            print(step, phase, flush=True)
            t.check(step, phase)
    print("survived", flush=True)
""")


def _proc_state(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.parametrize("kind", ["crash", "node_loss", "hang"])
def test_real_process_effects(tmp_path, kind):
    """A real process arms a fault at step 3 / optimizer_step: it dies (or stops) exactly there."""
    p = subprocess.Popen([sys.executable, "-c", RANK_PROG, str(tmp_path), kind], stdout=subprocess.PIPE, text=True)
    try:
        if kind == "hang":
            deadline = time.monotonic() + 30
            while _proc_state(p.pid) != "T":
                assert time.monotonic() < deadline and p.poll() is None
                time.sleep(0.05)
            os.kill(p.pid, signal.SIGKILL)
        rc = p.wait(30)
        out = p.stdout.read().split("\n")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert out[-2] == "3 optimizer_step" and "survived" not in out
    assert rc == {"crash": EXIT_INJECTED_CRASH, "node_loss": -signal.SIGKILL, "hang": -signal.SIGKILL}[kind]
    (fired,) = read_fired(tmp_path)
    assert (fired["step"], fired["phase"], fired["kind"], fired["pid"]) == (3, "optimizer_step", kind, p.pid)
    assert wait_pids_gone((p.pid,), timeout_s=1) == []


# --- drills --------------------------------------------------------------------------------------------------


def test_plan_drill_is_deterministic_spaced_and_within_spares():
    kw = dict(steps=50, world=4, gpus_per_node=1, spare_nodes=2)
    a, b = plan_drill(4, 7, **kw), plan_drill(4, 7, **kw)
    assert a == b and plan_drill(4, 8, **kw) != a
    steps = [f.at_step for f in a]
    assert steps == sorted(steps) and all(y - x >= 2 for x, y in zip(steps, steps[1:]))
    assert 3 <= steps[0] and steps[-1] <= 48
    for seed in range(30):
        plan = plan_drill(3, seed, steps=40, world=8, gpus_per_node=4, spare_nodes=1)
        assert sum(slot_cost(f.kind, 4) for f in plan) <= 4
        for f in plan:
            assert f.phase in KINDS[f.kind].phases and f.phase != "recovery" and 0 <= f.rank < 8
    only = plan_drill(3, 1, steps=40, world=4, gpus_per_node=1, spare_nodes=0, kinds=["transient"])
    assert {f.kind for f in only} == {"transient"}


@pytest.mark.parametrize("n,kw,msg", [
    (0, {}, "at least 1"),
    (20, {}, "need at least"),
    (2, {"kinds": ["crash"], "spare_nodes": 0}, "no spare capacity left"),
    (1, {"kinds": ["meteor"]}, "not a fault kind"),
])
def test_plan_drill_errors(n, kw, msg):
    args = dict(steps=30, world=4, gpus_per_node=1, spare_nodes=1) | kw
    with pytest.raises(FaultError, match=msg):
        plan_drill(n, 0, **args)


def test_match_outcome_from_status():
    recs = start_records() + [{"ts": 9.5, "event": "inject_forwarded", "kind": "node_loss", "phase": "optimizer_step",
                               "at_step": 7, "targets": [2, 3], "request_id": "r1"}] + node_loss_records()
    fired = [{"ts": 9.8, "request_id": "r1", "world_rank": 2, "kind": "node_loss", "at_step": 7, "step": 7,
              "phase": "optimizer_step"}]
    st = derive_status(recs, running_slurm(), now=20.0, run=run_files(fired=fired))
    plan = plan_drill(1, 0, steps=30, world=4, gpus_per_node=2, spare_nodes=1, kinds=["kill-node"])[0]
    out = DrillOutcome(plan, request_id="r1", at_step=7)
    out = match_outcome(out, st)
    assert out.recovered and out.action == "hot_swap" and out.steps_replayed == 1 and out.detect_s == 1.25
    assert out.landed_as_requested == (plan.phase == "optimizer")
    json.dumps(out.to_json())


# --- corrupt-replica: silent corruption of one holder's replica ----------------------------------------
def test_corrupt_replica_is_a_kind_with_its_phases():
    from phoenix_hpc.errors import FaultError
    from phoenix_hpc.faults.kinds import KINDS, check_phase

    spec = KINDS["corrupt-replica"]
    assert (spec.wire, spec.fault_kind, spec.action) == ("corrupt_replica", "silent_corruption", "none")
    assert check_phase("corrupt-replica", "recovery") == "recovery"
    with pytest.raises(FaultError, match="--phase: a corrupt-replica fault cannot land in phase 'd2h'"):
        check_phase("corrupt-replica", "d2h")


@pytest.mark.parametrize("k,expect", [(1, "checkpoint_restart"), (2, "hot_swap")])
def test_a_drill_pairs_corrupt_replica_with_a_crash_and_expects_what_k_allows(k, expect):
    from phoenix_hpc.drills.drill import plan_drill, slot_cost

    plan = plan_drill(2, 0, steps=40, world=3, gpus_per_node=1, spare_nodes=2, kinds=["corrupt-replica"], k=k,
                      checkpoint_every=5)
    assert [f.kind for f in plan] == ["corrupt-replica"] * 2
    assert all(f.phase in ("forward", "optimizer") and f.expect == expect for f in plan)  # its crash's phase
    assert slot_cost("corrupt-replica", 4) == 1  # the crash takes a standby slot
    with pytest.raises(Exception, match="no spare capacity left"):
        plan_drill(1, 0, steps=40, world=3, gpus_per_node=1, spare_nodes=0, kinds=["corrupt-replica"], k=k,
                   checkpoint_every=5)


def test_a_drilled_corrupt_replica_passes_only_when_the_corruption_landed_and_the_expected_recovery_followed():
    from types import SimpleNamespace

    from phoenix_hpc.drills.drill import DrillFault, DrillOutcome, match_outcome
    from phoenix_hpc.status.model import InjectionStatus

    crash = InjectionStatus("c", 1.0, "crash", "forward", 9, [1], [{"world_rank": 1, "step": 9, "phase": "forward",
                                                                    "ts": 10.0}])
    cor = InjectionStatus("x", 0.5, "corrupt-replica", "recovery", 9, [2], [{"world_rank": 2, "step": 9,
                                                                              "phase": "recovery", "ts": 11.0}])
    rec = SimpleNamespace(started_at=10.5, action="hot_swap", state="done", generation=1, total_s=3.0, phases={},
                          steps_replayed=1, detect_s=0.1)
    fault = DrillFault(0, "corrupt-replica", "forward", 9, 1, "hot_swap")

    def outcome(injections, recoveries):
        out = DrillOutcome(fault, request_id="c", at_step=9, corrupt_request_id="x")
        return match_outcome(out, SimpleNamespace(injections=injections, recoveries=recoveries))

    assert outcome([crash, cor], [rec]).passed
    assert not outcome([crash], [rec]).passed  # the corruption never landed: nothing was tested
    assert not outcome([crash, cor], [SimpleNamespace(**{**vars(rec), "action": "checkpoint_restart"})]).passed
    assert outcome([crash, cor], [rec]).to_json()["corrupt_landed"][0]["phase"] == "recovery"


def test_corrupt_replica_fires_its_hook_with_the_shard_and_raises_nothing():
    from phoenix_hpc.faults.trigger import FaultTrigger, Injection

    got = []
    t = FaultTrigger([{"type": "inject", "kind": "corrupt_replica", "at_step": 5, "phase": "recovery",
                       "request_id": "r1", "shard_id": "opt/pp0/tp0/dp1"}], on_corrupt_replica=got.append)
    t.check(4, "recovery")
    assert got == []
    t.check(6, "recovery")  # the first recovery at or after step 5
    assert got == [Injection("corrupt_replica", 5, "recovery", "r1", "opt/pp0/tp0/dp1")]


def test_flipped_replica_bytes_are_caught_only_by_the_tensor_checksum():
    import torch

    from phoenix_hpc.errors import ReplicationError
    from phoenix_hpc.faults.trigger import flip_replica_bytes
    from phoenix_hpc.runtime.snapshot import OPT, copy_in, plan_layout, read_header, seal, verify

    opt = [("opt/a", torch.arange(10, dtype=torch.float32)), ("opt/b", torch.ones(4))]
    layout = plan_layout(opt, [], {"shard_id": "opt/pp0/tp0/dp1", "step": 3, "generation": 0, "grid": {},
                                   "coord": {}, "envelope": {}})
    buf = torch.zeros(layout.total_bytes, dtype=torch.uint8)
    copy_in(buf, layout, opt, [])
    seal(buf, layout, shard_id="opt/pp0/tp0/dp1", step=3, generation=0, grid={}, coord={}, envelope={})
    verify(buf, (OPT,))
    off = flip_replica_bytes(buf)
    assert layout.slots[0].offset <= off < layout.slots[0].offset + layout.slots[0].nbytes
    read_header(buf)  # header and index untouched
    with pytest.raises(ReplicationError, match="tensor opt/a of shard opt/pp0/tp0/dp1 step 3 fails its checksum"):
        verify(buf, (OPT,))


def test_a_bad_request_is_named_before_the_state_of_the_job():
    """--rank -1, a malformed --coord or --at-step 0 are named as such also when the job cannot take any
    request (here: finished), instead of only 'the job is done'."""
    import dataclasses

    st = running_status()
    done = dataclasses.replace(st, job=dataclasses.replace(st.job, state="ended"))
    for kw, msg in (({"rank": -1}, "--rank: -1 is not allowed; logical ranks start at 0"),
                    ({"coord": "1,2"}, "--coord: '1,2' is not allowed"),
                    ({"rank": 1, "at_step": -3}, "--at-step: -3 is not allowed")):
        with pytest.raises(FaultError, match=msg):
            build_request(done, "crash", **kw)
    with pytest.raises(FaultError, match="nothing to inject into"):
        build_request(done, "crash", rank=1)
