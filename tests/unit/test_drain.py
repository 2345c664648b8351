"""Planned drain: the pure rules (control/drains.py), the request checks of ``phoenix drain`` (exit code 2,
nothing sent), and how ``phoenix status`` derives drains from the journal."""

from __future__ import annotations

import pytest

from phoenix_hpc.control import recovery_machine
from phoenix_hpc.control.drains import (
    MAX_ATTEMPTS, PendingDrain, arm_drain, drain_refusal, drain_verdict, retry_step)
from phoenix_hpc.drills.drain import build_drain, drain_outcome
from phoenix_hpc.errors import FaultError
from phoenix_hpc.status.derive import derive_status
from test_status_derive import N1, N2, N3, done_records, node_loss_records, run_files, running_slurm, start_records


def _refusal(**kw):
    args = dict(job_state="running", recovering=False, pending=False, targets={2: "active", 3: "active"},
                standby_off_target=2, target_nodes={N2})
    args.update(kw)
    return drain_refusal(**args)


def test_drain_refusal_rules():
    assert _refusal() is None
    assert "the job is done" in _refusal(job_state="done")
    assert "recovering" in _refusal(recovering=True)
    assert "starting" in _refusal(job_state="starting")
    assert "one drain at a time" in _refusal(pending=True)
    why = _refusal(targets={4: "standby", 5: "standby"}, target_nodes={N3})
    assert "standby spares" in why and "[4, 5]" in why
    assert "not active" in _refusal(targets={2: "quiesced"})
    why = _refusal(standby_off_target=1)
    assert "2 slot(s) to move but 1 spare" in why and "--shrink" in why
    assert _refusal(standby_off_target=0, shrink="") is None  # a shrink needs no spare
    assert _refusal(shrink="a shrink would ... leave dp = 0").startswith("--shrink: a shrink would")


def test_arm_drain_on_the_slot():
    assert arm_drain(7, 5, 40) == (True, False, "")
    armed, late, why = arm_drain(7, 7, 40)  # already in iteration 7: too late, retryable
    assert not armed and late and "already started iteration 7" in why
    armed, late, why = arm_drain(41, 5, 40)  # past the last step: not retryable
    assert not armed and not late and "ends at step 40" in why
    assert arm_drain(40, 39, None)[0]


def _pending(members=(0, 1, 2)):
    return PendingDrain("r1", [2], list(members), at_step=10, request={}, deadline=0.0)


def test_drain_verdict_and_retry_step():
    d = _pending()
    assert drain_verdict(d) is None
    d.acks[0] = {"armed": True}
    d.acks[1] = {"armed": True}
    assert drain_verdict(d) is None
    d.acks[2] = {"armed": True}
    assert drain_verdict(d) == "armed"
    d.acks[1] = {"armed": False, "late": True, "started_step": 11}
    assert drain_verdict(d) == "retry"
    assert retry_step(d) == 13  # newest started iteration 11 + 2
    d.attempt = MAX_ATTEMPTS
    assert drain_verdict(d) == "refused"
    d.attempt = 1
    d.acks[0] = {"armed": False, "late": False, "reason": "the job ends"}
    assert drain_verdict(d) == "refused"


def _running(extra=()):
    return derive_status(start_records() + list(extra), running_slurm(), now=5.0,
                         run=run_files(coordinator={"host": "h", "port": 1, "pid": 2}))


def test_build_drain_by_node_rank_and_coord():
    st = _running()
    req = build_drain(st, node=N2)
    assert req.target == {"node": N2} and req.slots == (2, 3)
    assert req.body() == {"type": "drain", "target": {"node": N2}, "request_id": req.request_id}
    assert build_drain(st, rank=1).slots == (1,)
    assert build_drain(st, coord="0,3,0").target == {"coord": [0, 3, 0]}


@pytest.mark.parametrize("kw,msg", [
    ({}, "give exactly one of"),
    ({"rank": 1, "node": N1}, "got --rank, --node"),
    ({"node": "nid09999"}, "'nid09999' is not a node of job 77"),
    ({"rank": 9}, "--rank: 9 is outside the job; logical ranks are 0..3"),
    ({"coord": "0,7,0"}, "coord"),
    ({"node": N3}, "holds standby spares (world ranks [4, 5])"),
])
def test_build_drain_refuses_bad_input(kw, msg):
    with pytest.raises(FaultError, match=msg.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        build_drain(_running(), **kw)


def test_build_drain_without_a_spare_left_names_the_shrink():
    st = _running(node_loss_records())  # N3's two spares took logical ranks 2 and 3
    with pytest.raises(FaultError, match=r"0 spare slot\(s\) left.*the drain needs a spare, or --shrink"):
        build_drain(st, node=N1)
    req = build_drain(st, node=N1, shrink=True, at_step=12)  # a shrink needs no spare; the coordinator judges dp
    assert req.body()["shrink"] is True and req.body()["at_step"] == 12


def test_build_drain_refuses_an_at_step_outside_the_job():
    with pytest.raises(FaultError, match=r"--at-step: 0 is not an iteration"):
        build_drain(_running(), rank=1, at_step=0)


def test_build_drain_on_a_finished_job_is_refused():
    st = derive_status(start_records() + node_loss_records() + done_records(), running_slurm(), now=30.0,
                       run=run_files(coordinator={"host": "h", "port": 1, "pid": 2}))
    with pytest.raises(FaultError, match="is done.*nothing to drain"):
        build_drain(st, rank=0)


def drain_records() -> list[dict]:
    return [
        {"ts": 6.0, "event": "drain_requested", "request_id": "d1", "target": {"node": N2}, "targets": [2, 3],
         "nodes": [N2], "at_step": 8},
        {"ts": 6.5, "event": "drain_armed", "request_id": "d1", "at_step": 8, "members": [0, 1, 2, 3]},
        {"ts": 7.0, "event": "drain_start", "request_id": "d1", "targets": [2, 3], "nodes": [N2], "live_step": 7},
        {"ts": 7.1, "event": "recovery_start", "generation": 1, "action": "hot_swap", "survivors": [0, 1],
         "dead": [], "detect_s": 0.0, "drain": "d1", "drained": [2, 3]},
        {"ts": 7.5, "event": "recovery_plan", "generation": 1, "action": "hot_swap",
         "rank_map": [[0, 0], [1, 1], [2, 4], [3, 5]], "dead_world": [2, 3], "released_spares": [],
         "joins": [{"world_rank": 4, "node": N3, "logical_rank": 2, "coord": [0, 2, 0], "replaces_world_rank": 2},
                   {"world_rank": 5, "node": N3, "logical_rank": 3, "coord": [0, 3, 0], "replaces_world_rank": 3}],
         "transfers": [], "recoverable_step": 7, "rollbacks": [], "replication": [], "steps_replayed": 0},
        {"ts": 8.0, "event": "recovery_restored", "generation": 1, "recoverable_step": 7},
        {"ts": 8.2, "event": "recovery_done", "generation": 1, "action": "hot_swap", "total_s": 1.2,
         "phases": {"detect": 0.0, "reconfigure": 0.5, "params": 0.2, "optimizer": 0.2, "replay": 0.1},
         "steps_replayed": 0, "recoverable_step": 7, "replay_interrupted": False, "drain": "d1"},
        {"ts": 8.2, "event": "drain_done", "request_id": "d1", "generation": 1, "steps_replayed": 0,
         "recoverable_step": 7, "moved": [[2, 4, 2], [3, 5, 3]], "total_s": 1.1},
    ]


def test_status_shows_the_drain_its_hot_swap_and_the_drained_node():
    st = derive_status(start_records() + drain_records(), running_slurm(), now=9.0, run=run_files())
    (d,) = st.drains
    assert (d.request_id, d.state, d.steps_replayed, d.moved, d.at_step) == ("d1", "done", 0, [[2, 4, 2], [3, 5, 3]], 8)
    (rec,) = st.recoveries
    assert rec.action == "drain" and rec.steps_replayed == 0 and rec.state == "done"
    assert {s.world_rank: s.state for s in st.slots}[2] == "drained"
    assert {n.name: n.role for n in st.nodes}[N2] == "drained"
    assert drain_outcome("d1", drain_records())["event"] == "drain_done"
    assert drain_outcome("d2", drain_records()) is None


def test_status_shows_a_missed_drain_with_its_reason():
    recs = drain_records()[:2] + [{"ts": 7.0, "event": "drain_missed", "request_id": "d1", "at_step": 8,
                                   "targets": [2, 3], "reason": "a recovery started first (x)"}]
    st = derive_status(start_records() + recs, running_slurm(), now=9.0, run=run_files())
    assert st.drains[0].state == "missed" and "recovery started first" in st.drains[0].reason


# --- the coordinator's drain flow, with a store that records what is sent ----------------------------------


class _Store:
    def __init__(self):
        self.pushed: list[tuple[str, bytes]] = []

    def queue_push(self, key, raw):
        self.pushed.append((key, raw))

    def set(self, key, value):
        pass


def _coordinator(tmp_path):
    from phoenix_hpc.control.coordinator import Coordinator
    from phoenix_hpc.control.journal import Journal
    from phoenix_hpc.control.records import Slot
    from phoenix_hpc.control.states import JobState, SlotState, slot_machine

    c = Coordinator(tmp_path, grid=(1, 1, 2))
    c.journal, c.secret, c.store = Journal(tmp_path), b"s" * 32, _Store()
    c.job.to(JobState.RUNNING)
    for w, node, role in ((0, "n1", "active"), (1, "n2", "active"), (2, "n3", "standby")):
        c.slots[w] = Slot(w, node, 100 + w, role, slot_machine(f"slot {w}", SlotState.ACTIVE if role == "active"
                                                                else SlotState.STANDBY), 0.0,
                          logical_rank=w if role == "active" else None, step=5)
    c.view.rank_map = {0: 0, 1: 1}
    c.placement = {"opt/pp0/tp0/dp0": [1], "opt/pp0/tp0/dp1": [0]}
    return c


def _sent(c, since=0):
    from phoenix_hpc.control import protocol as P

    return [(int(k.rsplit("/", 1)[1]), P.decode(raw, c.secret)) for k, raw in c.store.pushed[since:]
            if k.startswith("ctl/out/")]


def _events(tmp_path, name):
    from phoenix_hpc.control.journal import read_journal

    return [r for r in read_journal(tmp_path) if r["event"] == name]


def _ack(c, w, attempt, armed=True, late=False, started=5):
    c._dispatch({"type": "drain_ack", "world_rank": w, "pid": 100 + w, "request_id": "d1", "attempt": attempt,
                 "armed": armed, "late": late, "started_step": started, "reason": "" if armed else "late"})


def test_coordinator_arms_every_member_rearms_a_late_one_and_hot_swaps_with_zero_replay(tmp_path):
    c = _coordinator(tmp_path)
    c._dispatch({"type": "drain", "target": {"node": "n3"}, "request_id": "d0", "reply_to": "r0"})
    assert "standby spares" in _events(tmp_path, "rejected")[-1]["reason"]  # a spare node: refused
    c._dispatch({"type": "drain", "target": {"node": "n2"}, "request_id": "d1", "reply_to": "r1"})
    assert [(w, m["type"], m["at_step"]) for w, m in _sent(c)] == [(0, "drain", 7), (1, "drain", 7)]
    n = len(c.store.pushed)
    _ack(c, 0, 1)
    _ack(c, 1, 1, armed=False, late=True, started=7)  # already in iteration 7: everyone is re-armed later
    assert [(w, m["type"], m.get("at_step")) for w, m in _sent(c, n)] == [
        (0, "undrain", None), (1, "undrain", None), (0, "drain", 9), (1, "drain", 9)]
    _ack(c, 0, 2)
    _ack(c, 1, 2)
    assert c.drain.state == "armed" and _events(tmp_path, "drain_armed")[0]["at_step"] == 9
    n = len(c.store.pushed)
    for w in (0, 1):
        c._dispatch({"type": "drain_reached", "world_rank": w, "pid": 100 + w, "request_id": "d1", "step": 8})
    sent = _sent(c, n)
    assert (1, "stop") in [(w, m["type"]) for w, m in sent] and [m for w, m in sent if w == 1][0]["drained"]
    assert [w for w, m in sent if m["type"] == "quiesce"] == [0]
    assert c.slots[1].state.value == "done" and c.recovery.drain is c.drain
    c._dispatch({"type": "quiesced", "world_rank": 0, "pid": 100, "generation": 1, "live_step": 8, "dirty": False,
                 "shards": {"opt/pp0/tp0/dp0": [8, 7]}, "replicas": {"opt/pp0/tp0/dp1": [8, 7]}})
    recovery_machine.advance_recovery(c, c.clock())
    plan = c.recovery.plan
    assert plan.steps_replayed == 0 and plan.recoverable_step == 8
    assert [(j.world_rank, j.logical_rank, j.replaces_world_rank) for j in plan.joins] == [(2, 1, 1)]


def test_a_fault_before_the_pause_makes_the_armed_drain_missed(tmp_path):
    from phoenix_hpc.control.classify import Action, Decision

    c = _coordinator(tmp_path)
    c._dispatch({"type": "drain", "target": {"logical_rank": 1}, "request_id": "d1", "reply_to": "r1"})
    _ack(c, 0, 1)
    _ack(c, 1, 1)
    n = len(c.store.pushed)
    recovery_machine.start_recovery(c, Decision(Action.LOCAL_RECOVERY, "transient"), [], c.clock(), c.clock())
    (m,) = _events(tmp_path, "drain_missed")
    assert "a recovery started first (transient)" in m["reason"] and c.drain.state == "missed"
    assert {(w, msg["type"]) for w, msg in _sent(c, n)} >= {(0, "undrain"), (1, "undrain")}


def test_coordinator_refuses_a_shrink_that_leaves_no_replica_and_an_engine_that_cannot(tmp_path):
    from phoenix_hpc.control.coordinator import Timing

    c = _coordinator(tmp_path)
    c.t = Timing(shrink=True, shrink_capable=True)
    c.grid = (1, 1, 1)  # one replica left (as after a shrink): removing it would leave dp = 0
    c.view.rank_map = {0: 0}
    c._dispatch({"type": "drain", "target": {"logical_rank": 0}, "request_id": "s0", "reply_to": "r0", "shrink": True})
    assert "--shrink: a shrink would remove DP replica(s) [0] of 1 and leave dp = 0" in \
        _events(tmp_path, "rejected")[-1]["reason"]
    c = _coordinator(tmp_path)  # dp 2 -> 1 at pp=1 would leave one node: no room for k = 1 replica elsewhere
    c.t = Timing(shrink=True, shrink_capable=True)
    c._dispatch({"type": "drain", "target": {"logical_rank": 1}, "request_id": "s3", "reply_to": "r3", "shrink": True})
    assert "would leave 1 node(s), too few for k = 1" in _events(tmp_path, "rejected")[-1]["reason"]
    c = _coordinator(tmp_path)
    c.t = Timing(shrink=False, shrink_capable=False)  # e.g. engine megatron
    c._dispatch({"type": "drain", "target": {"logical_rank": 1}, "request_id": "s1", "reply_to": "r1", "shrink": True})
    assert "the job's engine cannot shrink" in _events(tmp_path, "rejected")[-1]["reason"]
    assert c.drain is None


def test_coordinator_arms_a_shrink_drain_at_the_exact_step_and_never_moves_it(tmp_path):
    from phoenix_hpc.control.coordinator import Timing

    from phoenix_hpc.control.records import Slot
    from phoenix_hpc.control.states import SlotState, slot_machine

    c = _coordinator(tmp_path)
    c.t = Timing(shrink=True, shrink_capable=True)
    # three replicas on three nodes, no spare: dp 3 -> 2 leaves 2 nodes, enough for k = 1
    c.slots[2] = Slot(2, "n3", 102, "active", slot_machine("slot 2", SlotState.ACTIVE), 0.0, logical_rank=2, step=5)
    c.view.rank_map, c.grid = {0: 0, 1: 1, 2: 2}, (1, 1, 3)
    c._dispatch({"type": "drain", "target": {"logical_rank": 1}, "request_id": "d1", "reply_to": "r1",
                 "shrink": True, "at_step": 12})
    assert [(w, m["at_step"]) for w, m in _sent(c)] == [(0, 12), (1, 12), (2, 12)]  # no spare needed; step asked
    _ack(c, 0, 1)
    _ack(c, 2, 1)
    _ack(c, 1, 1, armed=False, late=True, started=12)  # already started 12: refused, not moved to 14
    assert c.drain.state == "refused" and c.drain.at_step == 12
    assert _events(tmp_path, "drain_refused") and not _events(tmp_path, "drain_rearmed")
