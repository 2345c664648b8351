"""The rank-side rule for a gone coordinator (phoenix_hpc.control.detect.coordinator_verdict): evidence, not
a late answer."""

from phoenix_hpc.control.detect import coordinator_verdict

BASE = dict(started=0.0, timeout_s=60.0, grace_s=120.0)


def verdict(now, **kw):
    return coordinator_verdict(now, **{**BASE, **kw})


def test_a_closed_connection_is_lost_at_once_even_inside_the_grace_period():
    lost, reason = verdict(1.0, last_ok=0.5, last_unanswered=None, closed="end of file: its process ended")
    assert lost and "closed its connection" in reason and "end of file" in reason


def test_silence_past_the_timeout_inside_the_grace_period_is_not_lost():
    assert verdict(100.0, last_ok=1.0, last_unanswered=99.0, closed=None) == (False, "")


def test_silence_past_the_timeout_after_the_grace_period_with_unanswered_asks_is_lost():
    lost, reason = verdict(200.0, last_ok=130.0, last_unanswered=199.0, closed=None)
    assert lost and "70.0s > coordinator_timeout_s=60s" in reason and "stayed open" in reason


def test_silence_just_at_the_timeout_is_not_lost():
    assert not verdict(190.0, last_ok=130.0, last_unanswered=189.0, closed=None)[0]


def test_a_late_but_not_missing_answer_is_not_lost():
    # the heartbeat thread's latest ask got proof of life (last_ok after every unanswered one)
    assert not verdict(200.0, last_ok=199.5, last_unanswered=150.0, closed=None)[0]


def test_without_an_unanswered_ask_a_slot_that_itself_did_not_run_does_not_blame_the_coordinator():
    # this slot was stopped from 130 to 200: no heartbeat asked since the last proof of life
    assert not verdict(200.0, last_ok=130.0, last_unanswered=100.0, closed=None)[0]
    assert not verdict(200.0, last_ok=130.0, last_unanswered=None, closed=None)[0]


def test_an_ask_still_waiting_counts_as_unanswered_once_older_than_the_answer_timeout():
    # a store call to a stopped coordinator may wait without limit: it is evidence only once it is old
    kw = dict(last_ok=130.0, last_unanswered=None, closed=None, answer_timeout_s=4.0)
    assert not verdict(200.0, asking_since=197.0, **kw)[0]
    assert verdict(200.0, asking_since=150.0, **kw)[0]


def test_nothing_is_lost_once_the_job_is_ending():
    assert verdict(500.0, last_ok=130.0, last_unanswered=499.0, closed="end of file", ending=True) == (False, "")


def test_grace_zero_judges_from_the_start():
    assert verdict(61.0, last_ok=0.0, last_unanswered=60.0, closed=None, grace_s=0.0)[0]
