"""Heartbeat failure detection with a fake clock."""

from types import SimpleNamespace

import pytest

from phoenix_hpc.config.schema import ResilienceConfig
from phoenix_hpc.control.detect import coordinator_lost, detect, watched

CFG = ResilienceConfig(heartbeat_interval_s=1.0, heartbeat_timeout_s=10.0, collective_timeout_s=30.0)


def test_nobody_dead_while_heartbeats_are_fresh():
    assert detect(100.0, {0: 95.0, 1: 99.9, 2: 90.0}, CFG) == ((), "")


def test_exactly_at_the_deadline_is_alive_just_past_is_dead():
    assert detect(110.0, {3: 100.0}, CFG)[0] == ()
    dead, reason = detect(110.001, {3: 100.0, 1: 100.5}, CFG)
    assert dead == (3,)
    assert "3 silent 10.0s" in reason and "heartbeat_timeout_s=10" in reason


def test_fake_clock_walks_through_a_node_loss():
    last = {w: 0.0 for w in range(8)}
    now = 0.0
    for _ in range(30):  # all heartbeat every second; slots 4..7 (one node) stop at t=5
        now += 1.0
        for w in last:
            if not (w >= 4 and now > 5):
                last[w] = now
        dead, reason = detect(now, last, CFG)
        if now <= 15:
            assert dead == ()
        else:
            assert dead == (4, 5, 6, 7), (now, dead)
            assert reason.count("silent") == 4
            break
    assert now == 16


def test_timeout_must_be_positive_and_any_object_with_the_fields_works():
    with pytest.raises(ValueError, match="> 0"):
        detect(1.0, {}, SimpleNamespace(heartbeat_interval_s=1, heartbeat_timeout_s=0))
    assert detect(5.0, {"a": 0.0}, SimpleNamespace(heartbeat_interval_s=1, heartbeat_timeout_s=2))[0] == ("a",)


def test_coordinator_watchdog_rule():
    assert coordinator_lost(10.0, 5.0, 5.0) == (False, "")
    lost, reason = coordinator_lost(10.5, 5.0, 5.0)
    assert lost and "coordinator silent for 5.5s" in reason


def _slot(state="active", step=0, last_seen=0.0, registered_at=0.0, logical=0):
    return SimpleNamespace(state=state, step=step, last_seen=last_seen, registered_at=registered_at,
                           logical_rank=logical)


# (name, slot, training since, now) -> the time its silence counts from, or None (not judged now)
WATCHED = [
    ("a step reported: judged from its last heartbeat", _slot(step=3, last_seen=5.0), None, 6.0, 5.0),
    ("within the grace, no step, nobody trained: not judged", _slot(last_seen=1.0), None, 20.0, None),
    ("past the grace: judged", _slot(last_seen=1.0), None, 31.0, 1.0),
    ("a member once another trained: from that moment", _slot(last_seen=1.0), 8.0, 20.0, 8.0),
    ("... or its own later heartbeat", _slot(last_seen=9.0), 8.0, 20.0, 9.0),
    ("a spare within the grace is not judged though others train", _slot(logical=None, last_seen=1.0), 8.0, 20.0,
     None),
    ("a dead slot is never judged", _slot(state="dead", step=3), None, 99.0, None),
]


@pytest.mark.parametrize("name,slot,since,now,expected", WATCHED, ids=[w[0] for w in WATCHED])
def test_which_slots_are_watched(name, slot, since, now, expected):
    got = watched(now, {7: slot}, grace_s=30.0, training_since=since, live_states={"active", "standby"})
    assert got.get(7) == expected and (7 in got) == (expected is not None)
