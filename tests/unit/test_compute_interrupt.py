"""launch/interrupt.py: a rank computing when the quiesce arrives leaves its step at the next module call."""

import threading

import pytest
import torch

from phoenix_hpc.launch.interrupt import ComputeInterrupt, StepInterrupted
from torch.nn.modules import module as torch_module


class Recorder(torch.nn.Module):
    """Three linear layers; ``after_first`` is called between the first and the second."""

    def __init__(self, after_first=None):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))
        self.after_first = after_first
        self.ran: list[int] = []

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            self.ran.append(i)
            if i == 0 and self.after_first is not None:
                self.after_first()
        return x


def no_global_hooks() -> bool:
    return not torch_module._global_forward_pre_hooks


@pytest.fixture(autouse=True)
def _no_hook_left_behind():
    """A failing test must not leave a raising global hook for the tests after it."""
    before = dict(torch_module._global_forward_pre_hooks)
    yield
    for key in set(torch_module._global_forward_pre_hooks) - set(before):
        del torch_module._global_forward_pre_hooks[key]


def test_outside_a_window_an_interrupt_does_nothing_and_registers_no_hook():
    ci = ComputeInterrupt()
    assert ci.interrupt(0, "quiesce for generation 1") is False
    assert no_global_hooks()
    m = Recorder()
    m(torch.zeros(1, 4))
    assert m.ran == [0, 1, 2]


def test_an_interrupt_from_another_thread_ends_the_forward_at_the_next_module_call():
    ci = ComputeInterrupt()
    ci.open(0)
    fired = []

    def watchdog():  # the quiesce watchdog, while the training thread is inside the forward
        t = threading.Thread(target=lambda: fired.append(ci.interrupt(0, "quiesce for generation 1")))
        t.start()
        t.join()

    m = Recorder(after_first=watchdog)
    with pytest.raises(StepInterrupted, match="quiesce for generation 1.*Linear"):
        m(torch.zeros(1, 4))
    assert fired == [True]
    assert m.ran == [0]  # layers 1 and 2 never ran
    assert ci.interrupt(0, "again") is False  # requested once per window
    at = ci.close()
    assert at is not None
    assert no_global_hooks()
    m.after_first = None
    m.ran.clear()
    m(torch.zeros(1, 4))  # after close: nothing left behind
    assert m.ran == [0, 1, 2]


def test_only_the_thread_that_opened_the_window_is_interrupted():
    ci = ComputeInterrupt()
    ci.open(0)
    assert ci.interrupt(0, "stop for generation 0") is True
    other = Recorder()
    errors = []

    def run():
        try:
            other(torch.zeros(1, 4))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert errors == [] and other.ran == [0, 1, 2]
    with pytest.raises(StepInterrupted):
        Recorder()(torch.zeros(1, 4))
    ci.close()
    assert no_global_hooks()


def test_a_late_interrupt_after_close_is_ignored_and_a_new_window_starts_clean():
    ci = ComputeInterrupt()
    ci.open(0)
    assert ci.close() is None  # no interrupt in that window
    assert ci.interrupt(0, "late firing") is False
    assert no_global_hooks()
    ci.open(0)
    m = Recorder()
    m(torch.zeros(1, 4))
    assert m.ran == [0, 1, 2]
    assert ci.close() is None
    assert ci.close() is None  # idempotent


def test_an_interrupt_for_another_generation_does_nothing():
    ci = ComputeInterrupt()
    ci.open(2)
    assert ci.interrupt(1, "a late firing for the generation before") is False
    assert no_global_hooks()
    m = Recorder()
    m(torch.zeros(1, 4))
    assert m.ran == [0, 1, 2]
    assert ci.interrupt(2, "quiesce for generation 3") is True
    with pytest.raises(StepInterrupted):
        m(torch.zeros(1, 4))
    ci.close()
