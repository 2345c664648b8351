"""Per-node heartbeats (control/node_beats.py): who carries a node's heartbeats, what the carrier sends, the
board's files, and how the coordinator takes one node's ``heartbeats`` message (in-process, no store)."""

from __future__ import annotations

import os

from phoenix_hpc.control.coordinator import Coordinator, Slot
from phoenix_hpc.control.journal import Journal, read_journal
from phoenix_hpc.control.node_beats import NodeBoard, board_dir, carrier_of, entries_of, stale_records
from phoenix_hpc.control.states import JobState, SlotState, job_machine, slot_machine


def test_the_lowest_fresh_rank_carries_and_a_stale_carrier_is_replaced():
    recs = {4: {"t": 100.0}, 5: {"t": 100.2}, 6: {"t": 99.9}}
    assert carrier_of(recs, 100.5, fresh_s=3.0) == 4
    # rank 4 stopped writing (hung or killed): 3.5 s later rank 5 takes over
    recs = {4: {"t": 100.0}, 5: {"t": 103.4}, 6: {"t": 103.3}}
    assert carrier_of(recs, 103.5, fresh_s=3.0) == 5
    assert carrier_of({4: {"t": 1.0}}, 103.5, fresh_s=3.0) is None


def test_entries_carry_each_record_with_its_age_up_to_the_timeout():
    commit = {"g": 0, "live_step": 7, "shards": {"a": 6}, "replicas": {"b": 6}}
    recs = {9: {"pid": 90, "g": 0, "step": 7, "t": 100.0, "commit": commit},
            8: {"pid": 80, "g": None, "step": 0, "t": 104.5, "commit": None},
            7: {"pid": 70, "g": 0, "step": 3, "t": 80.0, "commit": None}}  # older than the timeout: left out
    assert entries_of(recs, 105.0, max_age_s=10.0) == [[8, 80, None, 0, 0.5, None], [9, 90, 0, 7, 5.0, commit]]


def test_board_records_beat_and_leave(tmp_path):
    path = board_dir(b"s" * 32, "gpu node/1", root=tmp_path)
    assert path.parent == tmp_path and "/" not in path.name[len("phoenix-beats-"):]
    assert board_dir(b"t" * 32, "gpu node/1", root=tmp_path) != path  # another job, another board
    a, b = NodeBoard(path, 3), NodeBoard(path, 2)
    assert oct(path.stat().st_mode & 0o777) == oct(0o700)
    # both "slots" are this test's process: a record keeps the board only while its process exists
    a.write_record({"pid": os.getpid(), "g": 0, "step": 1, "t": 5.0, "commit": None})
    b.write_record({"pid": os.getpid(), "g": 0, "step": 2, "t": 6.0, "commit": None})
    assert {w: r["step"] for w, r in a.records().items()} == {3: 1, 2: 2}
    assert a.beat() is None
    b.write_beat(17, 6.5)
    assert a.beat() == (17, 6.5)
    b.leave()
    assert set(a.records()) == {3} and path.exists()
    a.leave()
    assert not path.exists()
    assert not [p for p in tmp_path.iterdir()]


def _coordinator(tmp_path, now: list[float]) -> Coordinator:
    c = Coordinator(tmp_path, grid=(1, 1, 2), clock=lambda: now[0])
    c.journal = Journal(tmp_path)
    c.job = job_machine(JobState.RUNNING)

    class _Store:
        def queue_push(self, key, value):
            pass

    c.store = _Store()
    for w in range(2):
        c.slots[w] = Slot(w, "n0", 100 + w, "active", slot_machine(f"slot {w}", SlotState.ACTIVE), 0.0,
                          logical_rank=w, generation=0, step=0)
        c.rank_map[w] = w
    c.slots[2] = Slot(2, "n0", 102, "standby", slot_machine("slot 2", SlotState.STANDBY), 0.0, None, 0)
    return c


def test_the_coordinator_takes_each_entry_as_that_slots_heartbeat_and_commit(tmp_path):
    now = [50.0]
    c = _coordinator(tmp_path, now)
    commit = {"g": 0, "live_step": 5, "shards": {"opt/pp0/tp0/dp1": 4}, "replicas": {"opt/pp0/tp0/dp0": 4}}
    c._dispatch({"type": "heartbeats", "world_rank": 0, "pid": 100, "sent_at": None,
                 "beats": [[0, 100, 0, 5, 0.1, None], [1, 101, 0, 5, 4.0, commit], [2, 102, None, 0, 0.2, None]]})
    assert c.slots[0].last_seen == 49.9 and c.slots[1].last_seen == 46.0 and c.slots[2].last_seen == 49.8
    assert c.slots[1].step == 5 and c.committed["opt/pp0/tp0/dp1"] == {1: 4}
    assert c.placement["opt/pp0/tp0/dp0"] == [1]
    assert c.counters["heartbeats"] == 3 and c.counters["heartbeat_messages"] == 1
    # an older record never moves last-seen back; a commit of an older generation is skipped
    c.slots[1].generation = 1
    c.view.generation = 1
    c._dispatch({"type": "heartbeats", "world_rank": 0, "pid": 100, "sent_at": None,
                 "beats": [[1, 101, 1, 6, 9.0, {**commit, "g": 0, "shards": {"opt/pp0/tp0/dp1": 5}}]]})
    assert c.slots[1].last_seen == 46.0 and c.committed["opt/pp0/tp0/dp1"] == {1: 4}
    assert not read_journal(tmp_path, "rejected")


def test_an_entrys_commit_report_never_lowers_the_step_the_entry_carries(tmp_path):
    """A record keeps its slot's newest commit report (of step S, live step S, made at the commit fence of
    step S + 1) until the next fence; after step S + 1 ends, the record's step is S + 1: the coordinator
    keeps S + 1 (a recovery waiting for its members to pass S + 1 ends on that heartbeat)."""
    c = _coordinator(tmp_path, [50.0])
    commit = {"g": 0, "live_step": 9, "shards": {"opt/pp0/tp0/dp1": 9}, "replicas": {"opt/pp0/tp0/dp0": 9}}
    c._dispatch({"type": "heartbeats", "world_rank": 0, "pid": 100, "sent_at": None,
                 "beats": [[1, 101, 0, 10, 0.1, commit]]})
    assert c.slots[1].step == 10 and c.committed["opt/pp0/tp0/dp1"] == {1: 9}
    # a commit ahead of the record's step (a job resumed from the checkpoint of step 30, its first fence
    # reported, its progress not yet at the restored step): the larger one counts
    c._dispatch({"type": "heartbeats", "world_rank": 0, "pid": 100, "sent_at": None,
                 "beats": [[0, 100, 0, 0, 0.1, {**commit, "live_step": 30}]]})
    assert c.slots[0].step == 30
    # a commit of its own (no board) is current when it is sent: its live step is taken
    c._dispatch({"type": "commit", "world_rank": 1, "pid": 101, "generation": 0, "live_step": 11,
                 "shards": {"opt/pp0/tp0/dp1": 10}, "replicas": {}})
    assert c.slots[1].step == 11 and not read_journal(tmp_path, "rejected")


def test_an_entry_of_a_dead_slot_is_rejected_only_while_fresh(tmp_path):
    now = [50.0]
    c = _coordinator(tmp_path, now)
    c.slots[1].machine.to(SlotState.DEAD, "test")
    # the record a killed slot left on its node (older than two intervals): skipped silently
    c._dispatch({"type": "heartbeats", "world_rank": 0, "pid": 100, "sent_at": None,
                 "beats": [[1, 101, 0, 5, 3.0, None]]})
    assert not read_journal(tmp_path, "rejected")
    # a fresh one: the slot still runs although declared dead, so it is fenced as its own heartbeat would be
    c._dispatch({"type": "heartbeats", "world_rank": 0, "pid": 100, "sent_at": None,
                 "beats": [[1, 101, 0, 5, 0.5, None]]})
    (rej,) = read_journal(tmp_path, "rejected")
    assert "declared dead" in rej["reason"] and rej["world_rank"] == 1
    assert c.slots[1].state is SlotState.DEAD and c.counters["heartbeats"] == 0


def test_a_malformed_entry_rejects_the_message(tmp_path):
    c = _coordinator(tmp_path, [50.0])
    c._dispatch({"type": "heartbeats", "world_rank": 0, "pid": 100, "sent_at": None, "beats": [[0, 100]]})
    (rej,) = read_journal(tmp_path, "rejected")
    assert "malformed heartbeats" in rej["reason"]


class _FakeStore:
    """Stands in for the coordinator's TCPStore on the heartbeat path: queue_push and add."""

    def __init__(self, beat: int) -> None:
        self.pushed: list[bytes] = []
        self.beat = beat

    def queue_push(self, key, value) -> None:
        self.pushed.append(value)

    def add(self, key, n) -> int:
        return self.beat


def _client(board_path, world_rank: int, pid: int):
    import threading

    from phoenix_hpc.control.client import CoordinatorClient

    c = object.__new__(CoordinatorClient)  # the heartbeat path only: no coordinator.json, no store
    c.world_rank, c.pid, c.secret = world_rank, pid, b"k" * 32
    c._lock, c._commit = threading.Lock(), None
    c.board = NodeBoard(board_path, world_rank)
    return c


def test_the_carrier_sends_the_nodes_heartbeats_and_the_others_read_its_beat(tmp_path):
    from phoenix_hpc.control import protocol as P

    path = board_dir(b"k" * 32, "n1", root=tmp_path)
    low, high = _client(path, 3, 30), _client(path, 5, 50)
    high.report_commit(0, 8, {"opt/pp0/tp0/dp5": 7}, {"opt/pp0/tp0/dp3": 7})  # rides on the node's message
    store_hi, store_lo = _FakeStore(41), _FakeStore(42)
    assert high._beat_on_board(store_hi, 0, 8, 0.5, 4.0) == 41  # alone on the board: it carries
    assert low._beat_on_board(store_lo, 0, 8, 0.5, 4.0) == 42  # the lowest rank carries from now on
    (msg,) = [P.decode(m, b"k" * 32) for m in store_lo.pushed]
    assert msg["type"] == "heartbeats" and [e[0] for e in msg["beats"]] == [3, 5]
    assert msg["beats"][1][5] == {"g": 0, "live_step": 8, "shards": {"opt/pp0/tp0/dp5": 7},
                                  "replicas": {"opt/pp0/tp0/dp3": 7}}
    store_hi.pushed.clear()
    assert high._beat_on_board(store_hi, 0, 9, 0.5, 4.0) == 42  # not the carrier: the carrier's reading
    assert store_hi.pushed == []


def _gone_pid() -> int:
    """The pid of a process that has ended (a killed slot's)."""
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_the_carrier_removes_the_records_killed_slots_left_once_older_than_the_timeout(tmp_path):
    import time

    from phoenix_hpc.control import protocol as P

    path = board_dir(b"k" * 32, "n2", root=tmp_path)
    carrier, other = _client(path, 1, os.getpid()), _client(path, 6, os.getpid())
    now = time.time()
    # interval 0.5 s, timeout 4 s: stale after 4 + 3 * 0.5 = 5.5 s
    assert stale_records({7: {"t": now - 5.6}, 8: {"t": now - 5.4}}, now, 5.5) == [7]
    killed_long_ago = NodeBoard(path, 7)
    killed_long_ago.write_record({"pid": _gone_pid(), "g": 0, "step": 3, "t": now - 30.0, "commit": None})
    killed_just_now = NodeBoard(path, 8)
    killed_just_now.write_record({"pid": _gone_pid(), "g": 0, "step": 3, "t": now - 2.0, "commit": None})
    torn = path / ".7.99999.tmp"  # a writer killed between its write and its rename
    torn.write_text("{")
    os.utime(torn, (now - 30.0, now - 30.0))
    carrier.board.write_record({"pid": os.getpid(), "g": 0, "step": 3, "t": now, "commit": None})
    # a slot that does not carry leaves the board alone
    assert other._beat_on_board(_FakeStore(5), 0, 3, 0.5, 4.0) is None
    assert sorted(p.name for p in path.iterdir() if p.name.isdigit()) == ["1", "6", "7", "8"] and torn.exists()
    store = _FakeStore(5)
    assert carrier._beat_on_board(store, 0, 3, 0.5, 4.0) == 5
    # the old record is gone; the recent one stays until it is as old (its slot is still being judged) and
    # still rides in the message with its age, so the coordinator can time its silence
    assert sorted(p.name for p in path.iterdir() if p.name.isdigit()) == ["1", "6", "8"] and not torn.exists()
    (msg,) = [P.decode(m, b"k" * 32) for m in store.pushed]
    assert [e[0] for e in msg["beats"]] == [1, 6, 8] and msg["beats"][2][4] >= 2.0
    # once the coordinator dropped a record's slot, a write by that slot (a stopped one that woke) comes back
    killed_long_ago.write_record({"pid": os.getpid(), "g": 0, "step": 4, "t": time.time(), "commit": None})
    assert 7 in carrier.board.records()


def test_the_last_slot_to_leave_removes_the_board_with_the_records_of_killed_slots(tmp_path):
    import time

    path = board_dir(b"k" * 32, "n3", root=tmp_path)
    mine, killed = NodeBoard(path, 0), NodeBoard(path, 1)
    killed.write_record({"pid": _gone_pid(), "g": 0, "step": 3, "t": time.time() - 1.0, "commit": None})
    other = NodeBoard(path, 2)
    other.write_record({"pid": os.getpid(), "g": 0, "step": 3, "t": time.time() - 100.0, "commit": None})
    mine.write_record({"pid": os.getpid(), "g": 0, "step": 3, "t": time.time(), "commit": None})
    mine.leave(stale_s=5.5)  # slot 2 has not written for 100 s (stale) and slot 1's process is gone
    assert not path.exists()
    # a live slot's fresh record keeps the board; it goes with the last live slot
    a, b = NodeBoard(path, 0), NodeBoard(path, 2)
    a.write_record({"pid": os.getpid(), "g": 0, "step": 3, "t": time.time(), "commit": None})
    b.write_record({"pid": os.getpid(), "g": 0, "step": 3, "t": time.time(), "commit": None})
    NodeBoard(path, 1).write_record({"pid": _gone_pid(), "g": 0, "step": 3, "t": time.time(), "commit": None})
    a.leave(stale_s=5.5)
    assert sorted(p.name for p in path.iterdir()) == ["1", "2"]
    b.leave(stale_s=5.5)
    assert not path.exists() and not list(tmp_path.iterdir())


def test_a_done_carries_the_commit_report_no_heartbeat_carried_and_the_last_commit_record_names_it(tmp_path):
    """A member's newest commit report waits on its node board for the next heartbeat; a member that ends
    first sends it with its ``done``, and the coordinator takes it before it judges the end: the last
    ``commit`` record (what ``phoenix status`` shows after the end) names every member's copies."""
    now = [50.0]
    c = _coordinator(tmp_path, now)
    sent = []
    c.send = lambda w, body: sent.append(body)  # the rank side: what report_done sends
    client = _client(tmp_path / "board", 1, 101)
    client.send = sent.append
    c._dispatch({"type": "heartbeats", "world_rank": 0, "pid": 100, "sent_at": None,
                 "beats": [[0, 100, 0, 9, 0.1, {"g": 0, "live_step": 9, "shards": {"opt/pp0/tp0/dp0": 9},
                                                 "replicas": {"opt/pp0/tp0/dp1": 9}}]]})
    client.report_commit(0, 9, {"opt/pp0/tp0/dp1": 9}, {"opt/pp0/tp0/dp0": 9})  # on the board only
    client.report_done(0, 10, "h1")
    (done,) = sent
    assert done["commit"]["shards"] == {"opt/pp0/tp0/dp1": 9}
    c._dispatch({"type": "done", "world_rank": 0, "pid": 100, "generation": 0, "step": 10, "state_hash": "h0"})
    c._dispatch(done)
    assert read_journal(tmp_path, "job_done")
    (last,) = read_journal(tmp_path, "commit")
    assert last["recoverable_step"] == 9 and last["shard_steps"]["opt/pp0/tp0/dp1"] == {"0": 9, "1": 9}
    # a report of another generation is not sent with the done
    client.report_done(1, 10, "h1")
    assert "commit" not in sent[-1]


def test_a_copy_a_member_no_longer_reports_stops_holding_the_recoverable_step_back(tmp_path):
    """After a hot swap the new generation's placement moves a replica to another holder: the old holder's
    report no longer names it, and its committed step of that shard (and its place among the holders) goes.
    Kept, the recoverable step stayed at the old holder's last step for the rest of the job."""
    from phoenix_hpc.control import handlers

    now = [50.0]
    c = _coordinator(tmp_path, now)
    s0, s1 = "opt/pp0/tp0/dp0", "opt/pp0/tp0/dp1"

    def report(w, step, shards, replicas):
        c._dispatch({"type": "heartbeats", "world_rank": w, "pid": 100 + w, "sent_at": None, "beats": [
            [w, 100 + w, 0, step, 0.1, {"g": 0, "live_step": step, "shards": shards, "replicas": replicas}]]})

    report(0, 29, {s0: 29}, {s1: 29})
    report(1, 29, {s1: 29}, {s0: 29})
    assert handlers.recoverable_step_of(c) == 29 and c.placement[s1] == [0]
    # logical rank 0 no longer holds s1's replica (it went elsewhere): its step 29 of s1 no longer counts
    report(0, 49, {s0: 49}, {})
    report(1, 49, {s1: 49}, {s0: 49})
    assert c.committed[s1] == {1: 49} and c.placement[s1] == []
    assert handlers.recoverable_step_of(c) == 49
