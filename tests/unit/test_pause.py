"""The coordinator's own pauses (phoenix_hpc.control.pause) are not counted as the slots' silence."""

import pytest

from phoenix_hpc.control.pause import PauseMeter, unobserved_s


def test_jitter_is_not_a_pause_and_an_overslept_tick_is_the_gap_minus_the_tick():
    assert unobserved_s(0.06, 0.05, 0.2) == 0.0
    assert unobserved_s(0.2, 0.05, 0.2) == 0.0
    assert unobserved_s(6.05, 0.05, 0.2) == pytest.approx(6.0)


def test_observations_from_both_threads_share_one_last_time_and_nothing_is_counted_twice():
    t = [0.0]
    m = PauseMeter(tick_s=0.05, clock=lambda: t[0])
    t[0] = 0.05
    assert m.observe() == 0.0
    t[0] = 6.1  # stopped for about 6 s; the loop observes first
    assert m.observe() == pytest.approx(6.0)
    t[0] = 6.15  # the meter thread wakes next: a normal tick
    assert m.observe() == 0.0
    assert m.take() == pytest.approx(6.0) and m.take() == 0.0
    assert m.longest_s == pytest.approx(6.0)


def test_the_thread_runs_and_stops():
    m = PauseMeter(tick_s=0.01)
    m.start()
    m.close()
    assert m.take() >= 0.0


def test_tick_must_be_positive():
    with pytest.raises(ValueError, match="tick_s"):
        PauseMeter(tick_s=0)
