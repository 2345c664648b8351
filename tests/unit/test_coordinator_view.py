"""The running coordinator's view is the journal's fold at every moment: it journals an event and applies the
same record to its view in one place (control/recorder.py). Driven in-process with messages (registrations,
a planned drain and its hot swap, a lost slot, a restart), on a store that records what is sent (test_drain)."""

from __future__ import annotations

from test_drain import _Store, _ack

from phoenix_hpc.control import recovery_machine
from phoenix_hpc.control.classify import FaultKind
from phoenix_hpc.control.coordinator import Coordinator
from phoenix_hpc.control.journal import Journal, iter_journal
from phoenix_hpc.control.view import fold


def _read(run_dir):
    """The fold of the journal as ``phoenix status`` and a restarted coordinator read it."""
    return fold(iter_journal(run_dir))


def _registered(tmp_path) -> Coordinator:
    """Grid 1 x 1 x 2: world ranks 0, 1 active on n1, n2; world rank 2 a spare on n3; registered by messages."""
    c = Coordinator(tmp_path, grid=(1, 1, 2))
    c.journal, c.secret, c.store = Journal(tmp_path), b"s" * 32, _Store()
    for w, role in ((0, "active"), (1, "active"), (2, "standby")):
        c._dispatch({"type": "register", "world_rank": w, "pid": 100 + w, "node": f"n{w + 1}", "role": role,
                     "logical_rank": w if role == "active" else None, "grid": [1, 1, 2], "reply_to": f"r{w}",
                     "placement_inputs": {"k": 1, "levels": ["node"], "domain": {"node": f"n{w + 1}"}}})
    c.transport.sync_and_answer()
    for s in c.slots.values():
        s.step = 5
    return c


def test_the_view_of_a_running_coordinator_is_the_fold_of_its_journal(tmp_path):
    c = _registered(tmp_path)
    assert c.view == _read(tmp_path) and c.view.running and sorted(c.view.slots) == [0, 1, 2]
    # a planned drain of world rank 1 (node n2): armed, reached, then its hot swap onto the spare
    c._dispatch({"type": "drain", "target": {"node": "n2"}, "request_id": "d1", "reply_to": "r1"})
    _ack(c, 0, 1)
    _ack(c, 1, 1)
    for w in (0, 1):
        c._dispatch({"type": "drain_reached", "world_rank": w, "pid": 100 + w, "request_id": "d1", "step": 7})
    assert c.recovery is not None and c.view == _read(tmp_path)
    c._dispatch({"type": "quiesced", "world_rank": 0, "pid": 100, "generation": 1, "live_step": 7, "dirty": False,
                 "shards": {"opt/pp0/tp0/dp0": [7, 6]}, "replicas": {"opt/pp0/tp0/dp1": [7, 6]}})
    recovery_machine.advance_recovery(c, c.clock())
    assert c.recovery.plan is not None
    v = _read(tmp_path)
    assert c.view == v and v.generation == 1 and v.rank_map == {0: 0, 1: 2} and v.slots[2].state == "joining"
    # the spare is lost before it restored: the recovery is aborted and planned again
    c._declare_dead([2], FaultKind.PROCESS_EXIT, "process exited: world rank 2", c.clock())
    c._tick(c.clock())
    v = _read(tmp_path)
    assert c.view == v and v.slots[2].state == "dead" and v.skipped == []
    assert [r.state for r in v.recoveries] == ["aborted", "in_progress"] and v.generation == 2


def test_a_restarted_coordinator_continues_the_fold_of_the_whole_journal(tmp_path):
    c = _registered(tmp_path)
    c._declare_dead([1], FaultKind.PROCESS_EXIT, "process exited: world rank 1", c.clock())
    c._tick(c.clock())
    c.journal.close()
    r = Coordinator(tmp_path, grid=(1, 1, 2), restart=1)
    r.recorder.open(Journal(tmp_path), fold_existing=True)  # as Coordinator.open does for a restart
    r.secret, r.store = b"s" * 32, _Store()
    assert r.view == _read(tmp_path) and r.view.generation == 1 and r.view.recovery is not None
    r._rebuild_from_journal()
    r._dispatch({"type": "register", "world_rank": 0, "pid": 100, "node": "n1", "role": "active",
                 "logical_rank": 0, "rejoin": {"generation": 0, "step": 6}, "reply_to": "q0"})
    r.transport.sync_and_answer()
    assert r.view == _read(tmp_path) and r.recorder.records == len(list(iter_journal(tmp_path)))


def test_a_restarted_coordinator_reads_its_journal_once(tmp_path, monkeypatch):
    # the view and the replica agreement's book (steps repaired, strikes) come from one read of the journal
    from phoenix_hpc.control import journal as J

    c = _registered(tmp_path)
    c.journal.close()
    reads = []
    real = J.iter_journal
    monkeypatch.setattr(J, "iter_journal", lambda *a, **k: reads.append(a[0]) or real(*a, **k))
    r = Coordinator(tmp_path, grid=(1, 1, 2), restart=1)
    r.recorder.open(Journal(tmp_path), fold_existing=True)  # as Coordinator.open does for a restart
    r._rebuild_from_journal()
    assert len(reads) == 1 and r.agreement is not None and r.recorder.take_opened() == []


def test_a_job_without_snapshots_says_once_at_its_start_that_no_replica_is_compared(tmp_path):
    """resilience.mode checkpoint-restart (or enabled: false) takes no snapshot, so no digest exists: the journal
    says so at job_running (status shows ``agreement: off``) instead of staying silent about a bitflip."""
    from dataclasses import replace

    from phoenix_hpc.control.journal import read_journal
    from phoenix_hpc.control.membership import NO_SNAPSHOTS

    on = _registered(tmp_path / "on")
    assert not read_journal(tmp_path / "on", "agreement_off")
    c = Coordinator(tmp_path, grid=(1, 1, 2))
    c.t = replace(c.t, snapshots=False)
    c.journal, c.secret, c.store = Journal(tmp_path), b"s" * 32, _Store()
    for w in (0, 1):
        c._dispatch({"type": "register", "world_rank": w, "pid": 100 + w, "node": f"n{w + 1}", "role": "active",
                     "logical_rank": w, "grid": [1, 1, 2], "reply_to": f"r{w}"})
    (off,) = read_journal(tmp_path, "agreement_off")
    assert off["reason"] == NO_SNAPSHOTS and off["generation"] == 0
    assert c.view.agreement["off"] == NO_SNAPSHOTS and on.view.agreement.get("off") is None
