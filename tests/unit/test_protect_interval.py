"""The adaptive protection interval (runtime/interval.py): the pure decision, the loop's calls with an
interval, and the cap's bad input at submit."""

from __future__ import annotations

import pytest

from phoenix_hpc.launch.loop import train
from phoenix_hpc.runtime.interval import Sample, choose_interval

FITS = Sample(window_s=0.100, protect_s=0.050, exposed_s=0.0)  # protection takes half a window


def test_no_samples_keep_the_interval_and_the_cap_bounds_it():
    assert choose_interval(1, [], cap=4) == 1
    assert choose_interval(3, [], cap=2) == 2


def test_protection_that_fits_keeps_every_step():
    assert choose_interval(1, [FITS] * 3, cap=8) == 1


def test_protection_that_does_not_fit_grows_to_the_measured_ratio():
    # protection 0.25 s, window 0.1 s per step, 0.15 s exposed: needs ceil(1.25 * 2.5) = 4 windows
    slow = Sample(window_s=0.100, protect_s=0.250, exposed_s=0.150)
    assert choose_interval(1, [slow] * 3, cap=8) == 4
    assert choose_interval(1, [slow] * 3, cap=3) == 3  # the cap wins
    assert choose_interval(1, [slow] * 3, cap=1) == 1  # cap 1: every step, whatever the cost


def test_an_exposed_wait_grows_the_interval_by_one_at_least():
    # the measured protection time alone says one window is enough, yet training waits: grow anyway
    odd = Sample(window_s=0.100, protect_s=0.050, exposed_s=0.050)
    assert choose_interval(2, [odd] * 3, cap=8) == 3


def test_a_small_exposed_wait_below_the_threshold_changes_nothing():
    tiny = Sample(window_s=0.100, protect_s=0.090, exposed_s=0.004)  # 4 % of the step
    assert choose_interval(1, [tiny] * 3, cap=8) == 1


def test_when_the_window_grows_again_the_interval_returns_to_one():
    # measured with m = 4: no exposed wait and the protection fits one (larger) window
    assert choose_interval(4, [Sample(window_s=0.300, protect_s=0.200, exposed_s=0.0)] * 3, cap=8) == 1
    # or shrinks to what it needs
    assert choose_interval(4, [Sample(window_s=0.100, protect_s=0.150, exposed_s=0.0)] * 3, cap=8) == 2


def test_one_slow_step_among_three_does_not_change_the_interval():
    slow = Sample(window_s=0.100, protect_s=0.250, exposed_s=0.150)
    assert choose_interval(1, [FITS, slow, FITS], cap=8) == 1


@pytest.mark.parametrize("current, cap", [(0, 4), (1, 0)])
def test_an_interval_or_cap_below_one_is_refused(current, cap):
    with pytest.raises(ValueError, match="must be >= 1"):
        choose_interval(current, [FITS], cap=cap)


class Eng:
    def __init__(self, calls):
        self.calls, self.step = calls, 0

    def forward_backward(self):
        self.calls.append("fb")
        return 0.0

    def reduce_gradients(self):
        pass

    def optimizer_step(self):
        self.calls.append("opt")
        self.step += 1


class IntervalProtector:
    """The protector's interval calls (runtime/protector.py) with a fixed interval m."""

    def __init__(self, calls, m):
        self.calls, self.m, self.job, self.next = calls, m, None, None

    def due(self, step):
        return self.job is None and (self.next is None or step >= self.next)

    def pending(self):
        return self.job is not None

    def commit_due(self, step):
        return step + 1 >= self.job + self.m

    def start_snapshot(self, engine):
        self.job = engine.step
        self.calls.append(f"snap{engine.step}")

    def wait_local(self):
        self.calls.append("local")

    def wait_commit(self):
        self.calls.append(f"commit{self.job}")
        self.next, self.job = self.job + self.m, None


def test_the_loop_protects_every_mth_step_and_commits_before_the_last_update_of_the_interval():
    calls = []
    train(Eng(calls), 5, 1, protector=IntervalProtector(calls, 2))
    assert calls == ["snap0", "fb", "local", "opt", "fb", "commit0", "opt",
                     "snap2", "fb", "local", "opt", "fb", "commit2", "opt",
                     "snap4", "fb", "local", "opt"]


def test_the_loop_with_interval_one_is_the_per_step_protection():
    calls = []
    train(Eng(calls), 2, 1, protector=IntervalProtector(calls, 1))
    assert calls == ["snap0", "fb", "commit0", "opt", "snap1", "fb", "commit1", "opt"]
