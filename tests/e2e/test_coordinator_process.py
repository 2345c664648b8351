"""The real coordinator process, driven by the real rank-side client over its TCPStore.

The ranks' training side is played by the test through the client's protocol calls (quiesced/recovered
reports); the coordinator, its store, its journal and its timing are all real.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from phoenix_hpc.control import protocol as P
from phoenix_hpc.control.client import CoordinatorClient
from phoenix_hpc.control.journal import read_journal
from phoenix_hpc.errors import ControlError
from waiting import wait_for

CONFIG = """\
name: coord-test
data: {path: data/none}
parallelism: {tp: 1, pp: 1, dp: 2}
resources: {nodes: 1, spares: 1}
resilience:
  heartbeat_interval_s: 0.2
  heartbeat_timeout_s: 1.5
  collective_timeout_s: 3.0
"""


_wait = wait_for
#: the coordinator imports torch before it writes coordinator.json: tens of seconds on a loaded 2-core host
COORDINATOR_START_S = 90.0

def _events(run_dir, name):
    return read_journal(run_dir, name)


@pytest.fixture
def coordinator(tmp_path, request):
    run_dir = tmp_path / "run dir; echo x"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(CONFIG)
    extra = list(getattr(request, "param", ()))  # more coordinator options, through indirect parametrization
    proc = subprocess.Popen([sys.executable, "-m", "phoenix_hpc.control.coordinator", "--run-dir", str(run_dir),
                             "--host", "127.0.0.1", *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    clients: list[CoordinatorClient] = []
    try:
        _wait(lambda: (run_dir / P.COORDINATOR_FILE).exists() or proc.poll() is not None, COORDINATOR_START_S,
              what="coordinator.json")
        assert proc.poll() is None, proc.stdout.read()
        yield run_dir, proc, clients
    finally:
        for c in clients:
            c.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class Rank:
    """A slot's control-plane side: the real client plus a heartbeat state."""

    def __init__(self, run_dir, clients, world_rank, role, logical=None, node="nid00001"):
        self.pid = os.getpid() * 100 + world_rank  # one test process plays several slots
        self.c = CoordinatorClient(run_dir, world_rank, wait_s=10, pid=self.pid)
        clients.append(self.c)
        self.world_rank, self.role, self.logical, self.node = world_rank, role, logical, node
        self.gen, self.step = (0 if role == "active" else None), 0
        self.lost: list[str] = []
        self.placement_inputs = None  # {"k", "levels"} as real slots register them (evidence placements)

    def register(self):
        return self.c.register(node=self.node, role=self.role,
                               logical_rank=self.logical, grid=(1, 1, 2) if self.role == "active" else None,
                               world_size=3, placement_inputs=self.placement_inputs)

    def beat(self, interval_s=0.2, timeout_s=1.5, per_node=False):
        self.c.start_heartbeat(interval_s, timeout_s, lambda: (self.gen, self.step), on_lost=self.lost.append,
                               node=self.node if per_node else None)

    def send(self, typ, **kw):
        self.c.send({"type": typ, "world_rank": self.world_rank, "pid": os.getpid() * 100 + self.world_rank, **kw})

    def expect(self, typ, timeout_s=10):
        msg = self.c.wait_instruction((typ,), timeout_s)
        assert msg is not None and msg["type"] == typ, f"world rank {self.world_rank} expected {typ}, got {msg}"
        return msg


def _handled(run_dir, rank):
    """Return once the coordinator handled everything ``rank`` sent so far (one FIFO inbox: a request sent
    after it is answered after it) and then finished a pass of its loop (its beat counter, bumped after the
    answers of a pass are acted on, moved after that answer)."""
    from datetime import timedelta

    import torch.distributed as dist

    info = json.loads((run_dir / P.COORDINATOR_FILE).read_text())
    store = dist.TCPStore(info["host"], info["port"], is_master=False, timeout=timedelta(seconds=30))
    rep = rank.c.request({"type": "probe", "world_rank": rank.world_rank})
    assert rep["type"] == "rejected" and "probe" in rep["reason"], rep
    beat = int(store.add(P.KEY_BEAT, 0))
    _wait(lambda: int(store.add(P.KEY_BEAT, 0)) > beat, what="a coordinator loop pass")


def _request_polled(sender, target, body):
    """``sender``'s request, answered once ``target`` (polling meanwhile, as a rank does every step) armed or
    refused it."""
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("reply", sender.c.request(body)))
    t.start()
    while t.is_alive():
        target.c.poll()
        time.sleep(0.02)
    t.join()
    return box["reply"]


def _recovered_report(rank, gen, rank_map, step, opt_hash, held=()):
    """A member's evidence: hashes of its restored state (the DP peers' param shard is the same) and the
    replicas it holds ``[shard id, step, generation, hash]``."""
    return {"world_rank": rank.world_rank, "logical_rank": rank.logical, "generation": gen, "rank_map": rank_map,
            "step": step, "partial": False, "opt_shard": f"opt/pp0/tp0/dp{rank.logical}", "opt_hash": opt_hash,
            "param_shard": "param/pp0/tp0", "param_hash": "cccc0000", "held": [list(h) for h in held]}


def test_coordinator_rejects_bad_messages_and_runs_a_local_recovery(coordinator):
    run_dir, proc, clients = coordinator
    info = json.loads((run_dir / P.COORDINATOR_FILE).read_text())
    assert info["pid"] == proc.pid and info["port"] > 0 and info["secret_file"] == "secret"
    assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700
    for name in ("secret", "journal.jsonl", P.COORDINATOR_FILE):
        assert stat.S_IMODE(os.stat(run_dir / name).st_mode) == 0o600, name

    r0 = Rank(run_dir, clients, 0, "active", 0)
    r1 = Rank(run_dir, clients, 1, "active", 1)
    spare = Rank(run_dir, clients, 2, "standby", node="nid00002")
    assert r0.register()["generation"] == 0
    dup = Rank(run_dir, clients, 0, "active", 0)
    with pytest.raises(ControlError, match="already registered"):
        dup.register()
    r1.register()
    spare.register()
    for r in (r0, r1, spare):
        r.beat()

    # Foreign and malformed messages: straight onto the store, without (or with a wrong) MAC.
    foreign = r0.c.tcp_store()
    foreign.queue_push(P.KEY_IN, json.dumps({"v": 1, "body": {"type": "stop", "reason": "evil"}}).encode())
    foreign.queue_push(P.KEY_IN, P.encode({"type": "stop", "reason": "evil"}, b"not-the-secret"))
    foreign.queue_push(P.KEY_IN, b"\x00garbage")
    # a member of this job (its secret) from an install that speaks the previous protocol version
    foreign.queue_push(P.KEY_IN, P.encode({"type": "register", "world_rank": 7, "pid": 1, "node": "nid00009",
                                           "role": "standby"}, r0.c.secret, version=P.PROTOCOL_VERSION - 1))
    _wait(lambda: len(_events(run_dir, "rejected")) >= 5, what="rejections")
    reasons = " | ".join(e["reason"] for e in _events(run_dir, "rejected"))
    assert "already registered" in reasons
    assert "without the job secret" in reasons and "does not verify" in reasons and "not JSON" in reasons
    assert (f"'register' message from world rank 7 speaks control protocol version {P.PROTOCOL_VERSION - 1}, "
            f"the receiver speaks {P.PROTOCOL_VERSION}") in reasons
    assert proc.poll() is None  # the job continues
    _wait(lambda: _events(run_dir, "job_running"), what="job_running")

    # A transient collective error with everyone alive -> local recovery, no spare used.
    r0.step = r1.step = 3
    r0.c.report_fault(0, 3, "reduce_gradients", kind="comm_error", message="Connection closed by peer")
    for r in (r0, r1):
        q = r.expect("quiesce")
        assert q["generation"] == 1
        r.c.report_quiesced(1, live_step=3, shards={f"opt/pp0/tp0/dp{r.logical}": 2},
                            replicas={f"opt/pp0/tp0/dp{1 - r.logical}": 2}, dirty=False)
    plans = [r.expect("recover") for r in (r0, r1)]
    plan = plans[0]["plan"]
    # the error hit reduce_gradients: live state S(3) is intact, nothing to roll back, nothing replayed
    assert plan["action"] == "local_recovery" and plan["recoverable_step"] == 3 and plan["joins"] == []
    # world rank 1 claims a replica of shard dp0 nobody ever sent it: rejected with a reason, the recovery
    # goes on with the rest of the evidence (no shard is restored from it)
    r0.c.report_recovered(1, _recovered_report(r0, 1, plan["rank_map"], 3, "0a0a0a0a"),
                          {"reconfigure": 0.01, "params": 0.0, "optimizer": 0.0})
    r1.c.report_recovered(1, _recovered_report(r1, 1, plan["rank_map"], 3, "1b1b1b1b",
                                               held=[("opt/pp0/tp0/dp0", 3, 0, "0a0a0a0a")]),
                          {"reconfigure": 0.01, "params": 0.0, "optimizer": 0.0})
    for r in (r0, r1):
        assert r.expect("resume")["step"] == 3
        r.gen, r.step = 1, 3
    done = _wait(lambda: _events(run_dir, "recovery_done"), what="recovery_done")[0]
    assert done["steps_replayed"] == 0 and set(done["phases"]) == {"detect", "reconfigure", "params", "optimizer", "replay"}
    dec = [e for e in _events(run_dir, "decision")]
    assert dec[0]["action"] == "local_recovery" and "all processes alive" in dec[0]["reason"]
    (ev,) = _events(run_dir, "evidence_rejected")
    assert ev["reasons"] == ["replica of opt/pp0/tp0/dp0 step 3 (generation 0) held by world rank 1 (logical 1) "
                             "rejected: its owner made no statement of its holders in generation 0 and that "
                             "generation's placement is not known"]  # these slots registered no placement inputs

    # A heartbeat from a stale generation is rejected; the job goes on.
    r0.c.heartbeat(generation=0, step=3)
    _wait(lambda: any("stale generation 0" in e["reason"] for e in _events(run_dir, "rejected")), what="stale")

    # Fault injection: unknown target rejected with a reason, a good one forwarded to the target.
    rep = r0.c.request({"type": "inject", "kind": "crash", "target": {"world_rank": 99}, "at_step": 9, "phase": "d2h"})
    assert rep["type"] == "rejected" and "no live slot with world rank 99" in rep["reason"]
    rep = r0.c.request({"type": "inject", "kind": "teleport", "target": {"world_rank": 1}, "at_step": 9, "phase": "d2h"})
    assert rep["type"] == "rejected" and "teleport" in rep["reason"]
    r1.c.started_step = 3
    rep = _request_polled(r0, r1, {"type": "inject", "kind": "crash", "target": {"logical_rank": 1}, "at_step": 9,
                                   "phase": "h2h"})
    assert rep["type"] == "accepted" and rep["targets"] == [1] and rep["armed_steps"] == [[1, 9]]
    assert r1.c.take_injection(9, "h2h")
    # steps_ahead: at_step is only a lower bound; the coordinator picks the target's live step + steps_ahead
    rep = r0.c.request({"type": "inject", "kind": "crash", "target": {"logical_rank": 1}, "at_step": 1,
                        "steps_ahead": 0, "phase": "h2h"})
    assert rep["type"] == "rejected" and "steps_ahead 0" in rep["reason"]
    r1.step = r1.c.started_step = 4
    # the coordinator has r1's step 4 (from its heartbeat thread, every 0.2 s) once it journals it as progress
    _wait(lambda: [e for e in _events(run_dir, "progress") if e["generation"] == 1 and e["step"] >= 4],
          what="progress record of step 4")
    rep = _request_polled(r0, r1, {"type": "inject", "kind": "crash", "target": {"logical_rank": 1}, "at_step": 1,
                                   "steps_ahead": 3, "phase": "h2h"})
    assert rep["type"] == "accepted" and rep["at_step"] == 4 + 3, rep
    (fwd,) = [e for e in _events(run_dir, "inject_forwarded") if e["request_id"] == rep["request_id"]]
    assert fwd["at_step"] == rep["at_step"]
    assert r1.c.take_injection(rep["at_step"], "h2h")
    # the coordinator's view (step 4, from heartbeats) lags the target, which already started step 12:
    # the target refuses step 10 and the request is rejected with its reason; nothing stays armed
    r1.c.started_step = 12
    rep = _request_polled(r0, r1, {"type": "inject", "kind": "crash", "target": {"logical_rank": 1}, "at_step": 10,
                                   "phase": "forward_backward"})
    assert rep["type"] == "rejected" and "already started step 12" in rep["reason"], rep
    assert not r1.c.take_injection(10, "forward_backward")
    (ref,) = [e for e in _events(run_dir, "inject_refused") if "already started step 12" in e["reason"]]
    assert ref["targets"] == [1]

    # Every active rank done -> job_done with the combined hash, standby told to stop, coordinator exits 0.
    for r in (r0, r1):
        r.c.report_done(1, 5, f"hash{r.logical}")
    assert spare.expect("stop")["job_state"] == "done"
    assert proc.wait(20) == 0
    assert (run_dir / P.EXIT_STATUS_FILE).read_text() == "0\n"  # the verdict the batch script reads
    jd = _events(run_dir, "job_done")[0]
    assert jd["step"] == 5 and jd["steps_agree"] and jd["rank_hashes"] == ["hash0", "hash1"]
    assert [e["world_rank"] for e in _events(run_dir, "registered")] == [0, 1, 2]
    # the ranks' watchdogs notice the coordinator is gone: its process ended, so their liveness connections
    # closed (these two never read their stop; a rank that did would not count the coordinator's exit)
    _wait(lambda: r0.lost and r1.lost, what="watchdog", timeout_s=10)
    assert "the coordinator closed its connection (end of file" in r0.lost[0], r0.lost
    assert spare.c.stop_received and not spare.lost


def test_coordinator_hot_swaps_a_silent_rank_onto_the_spare(coordinator):
    run_dir, proc, clients = coordinator
    r0 = Rank(run_dir, clients, 0, "active", 0)
    r1 = Rank(run_dir, clients, 1, "active", 1, node="nid00002")
    spare = Rank(run_dir, clients, 2, "standby", node="nid00003")
    for r in (r0, r1, spare):
        r.register()
        r.beat()
    r0.step = r1.step = 4
    # each owner says where its replica went and the hash of what it committed (the recovery's evidence)
    r0.c.report_commit(0, 4, {"opt/pp0/tp0/dp0": 3}, {"opt/pp0/tp0/dp1": 3},
                       sent={"opt/pp0/tp0/dp0": {"holders": [1], "step": 3, "hash": "0a0a0a0a"}})
    r1.c.report_commit(0, 4, {"opt/pp0/tp0/dp1": 3}, {"opt/pp0/tp0/dp0": 3},
                       sent={"opt/pp0/tp0/dp1": {"holders": [0], "step": 3, "hash": "1b1b1b1b"}})
    _wait(lambda: _events(run_dir, "commit"), what="commit summary")
    # a slow job (a step per second or more): every new recoverable step is journalled, not every 10th
    time.sleep(1.1)
    r0.c.report_commit(0, 5, {"opt/pp0/tp0/dp0": 4}, {"opt/pp0/tp0/dp1": 4})
    r1.c.report_commit(0, 5, {"opt/pp0/tp0/dp1": 4}, {"opt/pp0/tp0/dp0": 4})
    _wait(lambda: [e for e in _events(run_dir, "commit") if e["recoverable_step"] == 4], what="commit of step 4")
    r1.c.stop_heartbeat()  # rank 1 hangs: no more heartbeats
    q = r0.expect("quiesce", timeout_s=15)
    assert q["dead"] == [1], _events(run_dir, "slots_dead")
    # r0 also held a copy of step 4 that failed verification at quiesce: journalled, not in the plan
    r0.c.report_quiesced(1, live_step=4, shards={"opt/pp0/tp0/dp0": 3}, replicas={"opt/pp0/tp0/dp1": 3}, dirty=False,
                         rejected=[["opt/pp0/tp0/dp1", 4, "tensor x fails its checksum"]])
    plan = r0.expect("recover")["plan"]
    (rj,) = _events(run_dir, "replica_rejected")
    assert (rj["world_rank"], rj["shard_id"], rj["step"], rj["reason"]) == (0, "opt/pp0/tp0/dp1", 4, "tensor x fails its checksum")
    assert spare.expect("recover")["plan"] == plan
    assert plan["action"] == "hot_swap" and plan["rank_map"] == [[0, 0], [1, 2]] and plan["recoverable_step"] == 3
    kinds = {(t["kind"], t["sender"], t["receiver"]) for t in plan["transfers"]}
    assert kinds == {("params", 0, 2), ("optimizer", 0, 2)}
    spare.logical = 1
    # the spare's restored shard equals the replica world rank 0 holds and the hash its dead owner committed
    r0.c.report_recovered(1, _recovered_report(r0, 1, plan["rank_map"], 3, "0a0a0a0a",
                                               held=[("opt/pp0/tp0/dp1", 3, 0, "1b1b1b1b")]),
                          {"reconfigure": 0.1, "params": 0.2, "optimizer": 0.3})
    spare.c.report_recovered(1, _recovered_report(spare, 1, plan["rank_map"], 3, "1b1b1b1b"),
                             {"reconfigure": 0.1, "params": 0.2, "optimizer": 0.3})
    for r in (r0, spare):
        r.expect("resume")
        r.gen, r.step = 1, 4
    done = _wait(lambda: _events(run_dir, "recovery_done"), what="recovery_done")[0]
    assert done["steps_replayed"] == 1 and done["phases"]["optimizer"] == 0.3
    # live progress journalled from the heartbeats: step 4 at generation 0; from the restored step 3 back to 4
    _wait(lambda: any(e["generation"] == 1 and e["step"] == 4 for e in _events(run_dir, "progress")),
          what="progress at generation 1")
    prog = [(e["generation"], e["step"]) for e in _events(run_dir, "progress")]
    assert (0, 4) in prog and prog[-1] == (1, 4)
    if (1, 3) in prog:  # the restored step is journalled only when a tick falls between restore and next beat
        assert prog.index((1, 3)) < prog.index((1, 4))
    assert done["phases"]["detect"] >= 1.5  # the heartbeat timeout
    # the fenced rank is told to stop when it is declared dead (its process may live: a hang) ...
    first = r1.expect("stop")
    assert first["job_state"] == "fenced" and first["reason"].startswith("this slot was declared dead (")
    # ... and again when it shows up again
    r1.c.heartbeat(0, 4)
    again = r1.expect("stop")
    assert again["job_state"] == "fenced" and again["reason"] == "this slot was declared dead earlier (fenced)"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 3  # stopped before the job's end
    assert (run_dir / P.EXIT_STATUS_FILE).read_text() == "3\n"
    assert _events(run_dir, "coordinator_stopped")


def _two_active_ranks(run_dir, clients):
    """Logical ranks 0 and 1 on two nodes, registered and heartbeating, training (step 1 reported: past the
    start-up grace, their heartbeats are judged)."""
    r0 = Rank(run_dir, clients, 0, "active", 0)
    r1 = Rank(run_dir, clients, 1, "active", 1, node="nid00002")
    for r in (r0, r1):
        r.register()
        r.step = 1
        r.beat()
    return r0, r1


def test_no_spare_left_is_a_clean_fallback_with_a_message(coordinator):
    run_dir, proc, clients = coordinator
    r0, r1 = _two_active_ranks(run_dir, clients)
    r1.c.stop_heartbeat()
    r0.expect("quiesce", timeout_s=15)
    r0.c.report_quiesced(1, live_step=2, shards={"opt/pp0/tp0/dp0": 1}, replicas={"opt/pp0/tp0/dp1": 1}, dirty=False)
    stop = r0.expect("stop")
    assert "no spare left" in stop["reason"] and "persistent checkpoint" in stop["reason"]
    assert proc.wait(20) == 1
    fb = _events(run_dir, "fallback")[0]
    assert "no spare left" in fb["reason"]


RANK_PROCESS = """
import os, sys, time
from phoenix_hpc.control.client import CoordinatorClient
c = CoordinatorClient(sys.argv[1], 1, wait_s=10)
c.register(node="nid00002", role="active", logical_rank=1, grid=(1, 1, 2), world_size=3)
c.start_heartbeat(0.2, 30.0, lambda: (0, 2), on_lost=lambda r: None)
print("ready", flush=True)
time.sleep(600)
"""


def test_a_killed_rank_process_is_declared_dead_by_its_exit_not_by_heartbeats(coordinator):
    """Rank 1 is a real process; SIGKILL closes its liveness connection, so the coordinator declares it dead
    as ``process_exit`` right away (its heartbeats would only have timed out later) and starts the hot swap."""
    run_dir, proc, clients = coordinator
    r0 = Rank(run_dir, clients, 0, "active", 0)
    spare = Rank(run_dir, clients, 2, "standby", node="nid00003")
    for r in (r0, spare):
        r.register()
        r.beat()
    rank1 = subprocess.Popen([sys.executable, "-c", RANK_PROCESS, str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert rank1.stdout.readline().strip() == "ready"
        _wait(lambda: _events(run_dir, "job_running"), what="job_running")
        rank1.kill()
        rank1.wait(10)
        q = r0.c.wait_instruction(("quiesce", "stop"), 15)
        assert q and q["type"] == "quiesce", [(e["event"], e.get("reason"), e.get("slots")) for e in _events(run_dir, None)]
    finally:
        if rank1.poll() is None:
            rank1.kill()
            rank1.wait()
    assert q["dead"] == [1], _events(run_dir, "slots_dead")
    (dead,) = _events(run_dir, "slots_dead")
    assert dead["slots"] == [1] and dead["kind"] == "process_exit" and f"pid {rank1.pid}" in dead["reason"]
    (dec,) = _events(run_dir, "decision")
    assert dec["action"] == "hot_swap"


def _write_shard(run_dir, rank, step):
    """What a member writes for the final checkpoint (a real shard file, through the real writer)."""
    import torch

    from phoenix_hpc.engines.base import GridCoord
    from phoenix_hpc.recovery.checkpoint import write_snapshot_shard

    tensors = {f"opt/pp0/tp0/dp{rank.logical}/w": torch.full((3,), float(rank.logical)), "param/pp0/tp0/w": torch.ones(2)}
    return write_snapshot_shard(run_dir / "checkpoints", step, GridCoord(0, rank.logical, 0), tensors, {"step": step})


def test_time_limit_warning_writes_the_final_checkpoint_of_the_newest_common_step(coordinator):
    from phoenix_hpc.recovery.ckpt_files import check_checkpoint, latest_step, read_marker

    run_dir, proc, clients = coordinator
    ranks = [Rank(run_dir, clients, w, "active", w, node=f"nid0000{w + 1}") for w in (0, 1)]
    spare = Rank(run_dir, clients, 2, "standby", node="nid00003")
    for r in (*ranks, spare):
        r.register()
        r.beat()
    _wait(lambda: _events(run_dir, "job_running"), what="job_running")
    proc.send_signal(signal.SIGUSR1)  # what the batch shell forwards before the time limit
    for r in ranks:
        stop = r.expect("stop")
        assert stop["checkpoint"] is True and "time limit" in stop["reason"]
    # rank 0 holds steps 288 and 287, rank 1 (one step behind) 287 and 286: the newest common step is 287
    ranks[0].c.report_stopping(0, [288, 287])
    ranks[1].c.report_stopping(0, [287, 286])
    for r in ranks:
        assert r.expect("write_checkpoint")["step"] == 287
    assert latest_step(run_dir / "checkpoints") is None  # nothing is complete before every shard is written
    ranks[0].c.report_shard_written(287, {**_write_shard(run_dir, ranks[0], 287), "write_s": 0.01})
    _handled(run_dir, ranks[0])  # the coordinator has rank 0's report and went round its loop after it
    assert latest_step(run_dir / "checkpoints") is None
    ranks[1].c.report_shard_written(287, {**_write_shard(run_dir, ranks[1], 287), "write_s": 0.02})
    for r in (*ranks, spare):
        assert "To continue: phoenix submit --resume" in r.expect("stop")["reason"]
    assert proc.wait(20) == 3
    assert latest_step(run_dir / "checkpoints") == 287
    assert read_marker(run_dir / "checkpoints", 287)["kind"] == "snapshot"
    assert check_checkpoint(run_dir / "checkpoints", 287, (1, 1, 2)) == []
    (ck,) = _events(run_dir, "checkpoint")
    assert ck["step"] == 287 and ck["source"] == "final" and ck["write_s"] == 0.02
    (end,) = _events(run_dir, "coordinator_stopped")
    assert end["signal"] == "USR1" and end["checkpoint_step"] == 287
    assert not _events(run_dir, "slots_dead") and not _events(run_dir, "fault")


def test_a_member_that_fails_its_write_leaves_the_checkpoint_incomplete(coordinator):
    from phoenix_hpc.recovery.ckpt_files import complete_steps

    run_dir, proc, clients = coordinator
    ranks = [Rank(run_dir, clients, w, "active", w, node=f"nid0000{w + 1}") for w in (0, 1)]
    for r in ranks:
        r.register()
        r.beat()
    _wait(lambda: _events(run_dir, "job_running"), what="job_running")
    ranks[1].c.note_signal("TERM")  # scancel --signal=TERM reached a slot: it passes the signal on
    for r in ranks:
        assert r.expect("stop")["checkpoint"] is True
        r.c.report_stopping(0, [12, 11])
    for r in ranks:
        assert r.expect("write_checkpoint")["step"] == 12
    ranks[0].c.report_shard_written(12, {**_write_shard(run_dir, ranks[0], 12), "write_s": 0.01})
    ranks[1].c.report_shard_written(12, {"error": "OSError: [Errno 28] No space left on device"})
    assert "incomplete" in ranks[0].expect("stop")["reason"]
    assert proc.wait(20) == 3
    assert complete_steps(run_dir / "checkpoints") == []
    (inc,) = _events(run_dir, "checkpoint_incomplete")
    assert inc["step"] == 12 and "No space left" in inc["reasons"][0]
    (sig,) = _events(run_dir, "signal")
    assert sig["signal"] == "TERM" and sig["world_rank"] == 1
    assert _events(run_dir, "coordinator_stopped")[0]["signal"] == "TERM"


def test_replayed_and_stale_signed_messages_are_rejected_and_journalled(coordinator):
    """A captured, correctly signed message sent again (a stop, an inject) is refused: its nonce was seen.
    A message signed with a timestamp far in the past is refused as stale. Both are journalled; the job
    goes on; the operator channel refuses the same replay."""
    import torch.distributed as dist

    from phoenix_hpc.control.operator import operator_request

    run_dir, proc, clients = coordinator
    _two_active_ranks(run_dir, clients)
    _wait(lambda: _events(run_dir, "job_running"), what="job_running")
    secret = P.read_secret(run_dir)
    info = json.loads((run_dir / P.COORDINATOR_FILE).read_text())
    store = dist.TCPStore("127.0.0.1", info["port"], is_master=False, wait_for_workers=False)

    # a signed inject, as captured on the wire, delivered twice through the store
    captured = P.encode({"type": "inject", "kind": "crash", "target": {"world_rank": 1}, "at_step": 50,
                         "phase": "d2h", "request_id": "replayme"}, secret)
    store.queue_push(P.KEY_IN, captured)
    _wait(lambda: [e for e in _events(run_dir, "inject_forwarded") if e["request_id"] == "replayme"], what="first copy")
    store.queue_push(P.KEY_IN, captured)
    _wait(lambda: [e for e in _events(run_dir, "rejected") if "replayed inject message" in e["reason"]],
          what="replay rejected")
    assert len([e for e in _events(run_dir, "inject_forwarded") if e["request_id"] == "replayme"]) == 1

    # a signed stop with a timestamp from ten minutes ago: stale, rejected, the job is not stopped
    old_stop = P.encode({"type": "stop", "reason": "captured long ago", "sent_at": time.time() - 600}, secret)
    store.queue_push(P.KEY_IN, old_stop)
    _wait(lambda: [e for e in _events(run_dir, "rejected") if "stale stop message" in e["reason"]], what="stale")
    # the same captured stop on the operator channel: the first copy is obeyed only once it is fresh; a
    # fresh one sent twice stops the job once and the second is a replay
    fresh = P.stamp({"type": "status_probe"})
    rep = operator_request("127.0.0.1", info["operator_port"], fresh, secret, timeout_s=10)
    assert rep["type"] == "rejected" and "unknown message type" in rep["reason"] and rep["in_reply_to"] == fresh["nonce"]
    with pytest.raises(ControlError, match="without replying"):
        operator_request("127.0.0.1", info["operator_port"], fresh, secret, timeout_s=10)
    _wait(lambda: [e for e in _events(run_dir, "rejected") if "operator channel: replayed status_probe" in e["reason"]],
          what="operator replay rejected")
    assert proc.poll() is None and not _events(run_dir, "coordinator_stopped")



@pytest.mark.parametrize("coordinator", [("--summary-interval-s", "1")], indirect=True)
def test_a_nodes_slots_heartbeat_together_and_a_stopped_carrier_alone_is_found(coordinator):
    """Three slots of one node heartbeat through its board (control/node_beats.py): the coordinator gets one
    message per interval for all three, commit reports ride on it, and when the carrier (the lowest world
    rank) stops writing its record, the next slot carries the node and only the stopped one is found dead."""
    run_dir, proc, clients = coordinator
    ranks = [Rank(run_dir, clients, 0, "active", 0), Rank(run_dir, clients, 1, "active", 1),
             Rank(run_dir, clients, 2, "standby")]
    for r in ranks:
        r.register()
        r.step = 3
        r.beat(per_node=True)
    assert all(r.c.board is not None and r.c.board.path == ranks[0].c.board.path for r in ranks)
    ranks[0].c.report_commit(0, 4, {"opt/pp0/tp0/dp0": 3}, {"opt/pp0/tp0/dp1": 3})
    ranks[1].c.report_commit(0, 4, {"opt/pp0/tp0/dp1": 3}, {"opt/pp0/tp0/dp0": 3})
    _wait(lambda: [e for e in _events(run_dir, "commit") if e["recoverable_step"] == 3], what="carried commits")
    s = _wait(lambda: [e for e in _events(run_dir, "heartbeat_summary") if e.get("heartbeat_messages", 0) >= 5],
              what="heartbeat summary")[0]
    assert s["heartbeats"] >= 2.5 * s["heartbeat_messages"], s  # three slots per message, one carrier
    ranks[0].c.stop_heartbeat()  # the carrier hangs: its record ages on the board
    q = ranks[1].expect("quiesce", timeout_s=15)
    assert q["dead"] == [0]
    (dead,) = _events(run_dir, "slots_dead")
    assert dead["slots"] == [0] and dead["kind"] == "heartbeat_timeout", dead
    assert not [e for e in _events(run_dir, "rejected")], _events(run_dir, "rejected")
    board = ranks[0].c.board.path
    for r in ranks:
        r.c.close()
    assert not board.exists()  # the last slot to leave removes the board


@pytest.fixture
def supervised(tmp_path):
    """The coordinator under its supervisor (as the batch script runs it), restarts allowed: 1."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(CONFIG + "  coordinator_grace_s: 4.0\n  coordinator_restarts: 1\n")
    proc = subprocess.Popen([sys.executable, "-m", "phoenix_hpc.control.supervise", "--run-dir", str(run_dir),
                             "--restarts", "1", "--host", "127.0.0.1"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    clients: list[CoordinatorClient] = []
    try:
        _wait(lambda: (run_dir / P.COORDINATOR_FILE).exists() or proc.poll() is not None, COORDINATOR_START_S,
              what="coordinator.json")
        assert proc.poll() is None, proc.stdout.read()
        yield run_dir, proc, clients
    finally:
        for c in clients:
            c.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        info = P.read_coordinator_file(run_dir)  # a coordinator left behind by a failed test
        if info and info.get("pid") and _pid_alive(int(info["pid"])):
            os.kill(int(info["pid"]), signal.SIGKILL)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _restartable_job(run_dir, clients):
    """Two active ranks and a spare, heartbeating with a restart timeout (a closed connection = away)."""
    ranks = [Rank(run_dir, clients, 0, "active", 0), Rank(run_dir, clients, 1, "active", 1, node="nid00002"),
             Rank(run_dir, clients, 2, "standby", node="nid00003")]
    for r in ranks:
        r.placement_inputs = {"k": 1, "levels": ["node"]}  # as the rank entry point registers them
        r.register()
        r.c.start_heartbeat(0.2, 1.5, (lambda r=r: (r.gen, r.step)), on_lost=r.lost.append, restart_timeout_s=60.0)
    _wait(lambda: _events(run_dir, "job_running"), what="job_running")
    return ranks


def _commit(r, step):
    r.step = step
    other = f"opt/pp0/tp0/dp{1 - r.logical}"
    r.c.report_commit(0, step, {f"opt/pp0/tp0/dp{r.logical}": step}, {other: step})


def _kill_coordinator(run_dir, ranks) -> int:
    pid = int(P.read_coordinator_file(run_dir)["pid"])
    os.kill(pid, signal.SIGKILL)
    _wait(lambda: all(r.c.away for r in ranks), what="every slot to see its coordinator gone")
    return pid


def test_a_killed_coordinator_is_restarted_from_the_journal_and_the_slots_rejoin_and_finish(supervised):
    """SIGKILL of the coordinator: the slots train on (reports kept, polls hear nothing, nobody is lost),
    the supervisor starts a new coordinator, which rebuilds the job from the journal; the slots rejoin it,
    resend what they kept (commit, done), and the job ends with ``job_done`` and exit status 0."""
    run_dir, proc, clients = supervised
    r0, r1, spare = _restartable_job(run_dir, clients)
    for r in (r0, r1):
        _commit(r, 5)
    _wait(lambda: any(e["recoverable_step"] == 5 for e in _events(run_dir, "commit")), what="commit of step 5")
    first = _kill_coordinator(run_dir, (r0, r1, spare))
    for r in (r0, r1):  # training goes on while the coordinator is away
        _commit(r, 9)
        assert r.c.poll() == [] and r.c.wait_instruction(("stop",), 0.2) is None
    r0.c.report_done(0, 9, "aa")
    r1.c.report_done(0, 9, "bb")
    _wait(lambda: not any(r.c.away for r in (r0, r1, spare)), timeout_s=60, what="every slot to rejoin")
    for r in (r0, r1, spare):
        assert r.expect("stop", timeout_s=20)["job_state"] == "done"
    assert proc.wait(30) == 0, proc.stdout.read()
    (restart,) = [e for e in _events(run_dir, "coordinator_started") if e.get("restart")]
    assert restart["restart"] == 1 and restart["pid"] != first
    (rebuilt,) = _events(run_dir, "coordinator_restarted")
    assert rebuilt["recoverable_step"] == 5 and rebuilt["job_state"] == "running" and rebuilt["dead"] == []
    rejoined = {e["world_rank"]: e for e in _events(run_dir, "rejoined")}
    assert sorted(rejoined) == [0, 1, 2] and rejoined[0]["step"] == 9 and rejoined[2]["generation"] is None
    assert max(e["recoverable_step"] for e in _events(run_dir, "commit")) == 9
    (done,) = _events(run_dir, "job_done")
    assert done["step"] == 9 and done["rank_hashes"] == ["aa", "bb"]
    assert not _events(run_dir, "slots_dead") and all(not r.lost for r in (r0, r1, spare))
    assert "restart 1 of 1" in proc.stdout.read()


def test_a_slot_that_died_while_the_coordinator_was_away_is_hot_swapped_once_it_is_back(supervised):
    """Rank 1 dies while the coordinator is away: it never rejoins, so the restarted coordinator declares it
    dead once the start-up grace is over (heartbeat timeout), and the recovery machine hot swaps it onto
    the spare (``quiesce`` to the survivor)."""
    run_dir, proc, clients = supervised
    r0, r1, spare = _restartable_job(run_dir, clients)
    for r in (r0, r1):
        _commit(r, 5)
    _kill_coordinator(run_dir, (r0, r1, spare))
    r1.c.close()  # rank 1's process "ends" while nobody watches
    _wait(lambda: not r0.c.away and not spare.c.away, timeout_s=60, what="the survivors to rejoin")
    q = r0.expect("quiesce", timeout_s=30)
    assert q["dead"] == [1] and q["generation"] == 1
    (dead,) = _events(run_dir, "slots_dead")
    assert dead["slots"] == [1] and dead["kind"] == "heartbeat_timeout"
    (dec,) = _events(run_dir, "decision")
    assert dec["action"] == "hot_swap"
    assert not r0.lost and not spare.lost


def test_slots_stop_cleanly_when_no_coordinator_comes_back(tmp_path):
    """Without a restarted coordinator the slot waits ``restart_timeout_s`` (training on), then ``on_lost``
    runs once with the reason: the documented clean stop, not an error in the training thread."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(CONFIG)
    proc = subprocess.Popen([sys.executable, "-m", "phoenix_hpc.control.coordinator", "--run-dir", str(run_dir),
                             "--host", "127.0.0.1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    clients: list[CoordinatorClient] = []
    try:
        _wait(lambda: (run_dir / P.COORDINATOR_FILE).exists(), COORDINATOR_START_S, what="coordinator.json")
        r0 = Rank(run_dir, clients, 0, "active", 0)
        r0.register()
        r0.c.start_heartbeat(0.2, 1.5, lambda: (0, 1), on_lost=r0.lost.append, restart_timeout_s=2.0)
        proc.kill()
        proc.wait(10)
        _wait(lambda: r0.c.away, what="away")
        t0 = time.monotonic()
        r0.send("commit", generation=0, live_step=2, shards={}, replicas={})  # kept, no error
        _wait(lambda: r0.lost, timeout_s=20, what="on_lost")
        assert time.monotonic() - t0 >= 1.0
        (reason,) = r0.lost
        assert "no restarted coordinator came back within coordinator_restart_timeout_s=2s" in reason
    finally:
        for c in clients:
            c.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_coordinator_killed_during_a_hot_swap_starts_it_again_after_its_restart(supervised):
    """Rank 1 hangs, the coordinator sends ``quiesce`` for generation 1 and is SIGKILLed before the plan.
    The restarted coordinator reads the recovery in progress from the journal, queues its dead slot again and
    runs a new recovery (generation 2) with the survivor and the spare, which rejoined: quiesce, plan,
    restore, resume, ``recovery_done``. (The ranks' side is played here; on the real cluster only the kill
    mid-run is shown.)"""
    run_dir, proc, clients = supervised
    r0, r1, spare = _restartable_job(run_dir, clients)
    for r in (r0, r1):
        _commit(r, 4)
    _wait(lambda: any(e["recoverable_step"] == 4 for e in _events(run_dir, "commit")), what="commit of step 4")
    r1.c.stop_heartbeat()  # rank 1 hangs
    q = r0.expect("quiesce", timeout_s=15)
    assert q["generation"] == 1 and q["dead"] == [1]
    _kill_coordinator(run_dir, (r0, spare))
    _wait(lambda: not r0.c.away and not spare.c.away, timeout_s=60, what="the survivor and the spare to rejoin")
    q2 = r0.expect("quiesce", timeout_s=30)
    assert q2["generation"] == 2 and q2["dead"] == [1]
    (rebuilt,) = _events(run_dir, "coordinator_restarted")
    assert rebuilt["recovery_interrupted"] and rebuilt["generation"] == 1 and rebuilt["dead"] == [1]
    r0.c.report_quiesced(2, live_step=4, shards={"opt/pp0/tp0/dp0": 4}, replicas={"opt/pp0/tp0/dp1": 4}, dirty=False)
    plan = r0.expect("recover", timeout_s=20)["plan"]
    assert spare.expect("recover", timeout_s=20)["plan"] == plan
    assert plan["action"] == "hot_swap" and plan["rank_map"] == [[0, 0], [1, 2]] and plan["recoverable_step"] == 4
    spare.logical = 1
    # evidence: the spare's restored shard equals the replica of step 4 the survivor holds; the dead owner's
    # statement died with the old coordinator, so the claim stands on generation 0's placement, which the
    # restarted coordinator recomputes from the registrations in the journal
    phases = {"reconfigure": 0.1, "params": 0.1, "optimizer": 0.1}
    r0.c.report_recovered(2, _recovered_report(r0, 2, plan["rank_map"], 4, "0a0a0a0a",
                                               held=[("opt/pp0/tp0/dp1", 4, 0, "1b1b1b1b")]), phases)
    spare.c.report_recovered(2, _recovered_report(spare, 2, plan["rank_map"], 4, "1b1b1b1b"), phases)
    for r in (r0, spare):
        r.expect("resume", timeout_s=20)
        r.gen, r.step = 2, 5
    for r in (r0, spare):
        r.c.report_done(2, 5, f"h{r.logical}")
    done = _wait(lambda: _events(run_dir, "recovery_done"), what="recovery_done")[0]
    assert done["generation"] == 2
    assert r0.expect("stop", timeout_s=20)["job_state"] == "done"
    assert proc.wait(30) == 0
    assert [e["generation"] for e in _events(run_dir, "recovery_start")] == [1, 2]
