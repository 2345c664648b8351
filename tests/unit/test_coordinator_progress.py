"""The coordinator's journal cadence records, driven in-process without a store: ``progress`` names the
newest step the active slots finished (``step``) and the slowest one (``min_step``); a recovery journals the
committed step it starts from before ``recovery_start``."""

from __future__ import annotations

from phoenix_hpc.control import recovery_machine
from phoenix_hpc.control.classify import Action, Decision
from phoenix_hpc.control.coordinator import Coordinator, Slot
from phoenix_hpc.control.journal import Journal, read_journal
from phoenix_hpc.control.states import JobState, SlotState, job_machine, slot_machine


class _DictStore:
    """Stands in for the TCPStore: only ``set`` and ``queue_push`` are called on these paths."""

    def __init__(self) -> None:
        self.kv: dict[str, str] = {}
        self.queues: dict[str, list] = {}

    def set(self, key: str, value: str) -> None:
        self.kv[key] = value

    def queue_push(self, key: str, value) -> None:
        self.queues.setdefault(key, []).append(value)


def _coordinator(tmp_path, steps: list[int], now: float) -> Coordinator:
    c = Coordinator(tmp_path, grid=(1, 1, len(steps)), clock=lambda: now)
    c.journal = Journal(tmp_path)
    c.store = _DictStore()
    c.job = job_machine(JobState.RUNNING)
    for w, step in enumerate(steps):
        c.slots[w] = Slot(w, f"n{w}", 100 + w, "active", slot_machine(f"slot {w}", SlotState.ACTIVE), now,
                          logical_rank=w, generation=0, step=step)
        c.rank_map[w] = w
    return c


def test_progress_record_names_the_newest_and_the_slowest_step(tmp_path):
    c = _coordinator(tmp_path, [13, 15, 14], now=100.0)
    c._tick(100.0)
    prog = [r for r in read_journal(tmp_path) if r["event"] == "progress"]
    assert len(prog) == 1
    assert (prog[0]["step"], prog[0]["min_step"], prog[0]["generation"]) == (15, 13, 0)


def test_recovery_start_is_preceded_by_the_committed_step_it_starts_from(tmp_path):
    c = _coordinator(tmp_path, [23, 23], now=100.0)
    # commits of step 23 arrived after the last journalled commit (19), inside the cadence window
    c.committed = {"opt/pp0/tp0/dp0": {0: 23, 1: 23}, "opt/pp0/tp0/dp1": {1: 23, 0: 23}}
    c._last_commit_logged, c._last_commit_log_t = 19, 100.0
    recovery_machine.start_recovery(c, Decision(Action.HOT_SWAP, "test"), [], t_fault=99.0, now=100.0)
    recs = [r for r in read_journal(tmp_path) if r["event"] in ("commit", "recovery_start")]
    assert [r["event"] for r in recs] == ["commit", "recovery_start"]
    assert recs[0]["recoverable_step"] == 23 and recs[0]["generation"] == 0


class _FakeMeter:
    def __init__(self, pending: float) -> None:
        self.pending = pending

    def observe(self) -> float:
        return 0.0

    def take(self) -> float:
        out, self.pending = self.pending, 0.0
        return out


def test_a_pause_of_the_coordinator_is_not_the_slots_silence(tmp_path):
    """Heartbeat timeout 10 s; the coordinator did not run for 12 s (SIGSTOP): on waking, nobody is dead, and
    the pause is journalled. A slot silent for longer than the timeout *while it looked* is still dead."""
    c = _coordinator(tmp_path, [5, 5], now=112.5)
    c.slots[0].last_seen = 100.0  # heard just before the pause: 12.5 s ago, 0.5 s of it while looking
    c.slots[1].last_seen = 88.0  # silent 12.5 s before the pause began ... 24.5 s in all
    c.pause = _FakeMeter(12.0)
    c._tick(112.5)
    recs = read_journal(tmp_path)
    (paused,) = [r for r in recs if r["event"] == "coordinator_paused"]
    assert paused["paused_s"] == 12.0
    (dead,) = [r for r in recs if r["event"] == "slots_dead"]
    assert dead["slots"] == [1]  # 24.5 - 12 = 12.5 s of silence heard > 10 s
    assert c.slots[0].last_seen == 112.0 and c.slots[0].state is not SlotState.DEAD


class _RingRecorder:
    def __init__(self) -> None:
        self.rung: list[list[int]] = []

    def ring(self, worlds) -> None:
        self.rung.append(list(worlds))


def test_instructions_ring_each_slot_once_after_a_store_round_trip(tmp_path):
    c = _coordinator(tmp_path, [1, 1, 1], now=10.0)
    calls = []
    c.store.queue_len = lambda key: calls.append(key) or 0
    c.liveness = _RingRecorder()
    c.transport.ring()
    assert c.liveness.rung == [] and calls == []  # nothing queued: no ring, no store call
    c.transport.send(2, {"type": "resume"})
    c.transport.send(0, {"type": "resume"})
    c.transport.send(2, {"type": "stop"})
    c.transport.ring()
    assert c.liveness.rung == [[0, 2]] and len(calls) == 1
    c.transport.ring()
    assert c.liveness.rung == [[0, 2]]


def test_start_up_grace_a_slot_without_a_step_is_not_judged_by_heartbeats_until_the_grace_ends(tmp_path):
    c = _coordinator(tmp_path, [0, 3, 0], now=130.0)
    c.t.startup_grace_s = 120.0
    for w, s in c.slots.items():
        s.registered_at, s.last_seen = 0.0, 115.0  # 15 s silent > heartbeat timeout 10 s
    c.slots[2].registered_at = 20.0  # still inside its grace at 130 (110 s < 120 s)
    c.slots[0].registered_at = 9.0  # grace over at 130 (121 s > 120 s): judged
    c._tick(130.0)
    (dead,) = [r for r in read_journal(tmp_path) if r["event"] == "slots_dead"]
    assert dead["slots"] == [0, 1]  # 1 trained a step, 0's grace ended; 2 is setting up


def test_once_a_member_reported_a_step_every_member_is_judged_from_that_moment(tmp_path):
    """A member that hangs in its first steps, before a heartbeat of its own carried a step, is found by the
    heartbeat timeout counted from the first member's step report, not at the end of the start-up grace; a
    standby slot (no logical rank) keeps its grace."""
    c = _coordinator(tmp_path, [0, 0, 0], now=10.0)
    c.t.startup_grace_s = 120.0
    for s in c.slots.values():
        s.registered_at, s.last_seen = 0.0, 1.0
    c.slots[2].logical_rank = None  # a spare
    c._tick(10.0)
    assert c.training_since is None and c._watched(10.0) == {}  # nobody trained yet: all inside the grace
    c._note_step(c.slots[2], 5)  # a spare's step does not start training
    assert c.training_since is None
    c.slots[2].step = 0
    c._note_step(c.slots[0], 1)  # logical 0 reports step 1 at 10.0; logical 1 (hung) never reports one
    assert c.training_since == 10.0
    assert c._watched(10.0) == {0: 1.0, 1: 10.0}  # 1's silence counts from 10.0; the spare is not judged
    c.slots[0].last_seen = 14.5
    c._tick(14.5)
    assert not [r for r in read_journal(tmp_path) if r["event"] == "slots_dead"]  # 4.5 s < the timeout
    c.slots[0].last_seen = 20.5
    c._tick(20.5)
    (dead,) = [r for r in read_journal(tmp_path) if r["event"] == "slots_dead"]
    assert dead["slots"] == [1] and dead["kind"] == "heartbeat_timeout"
