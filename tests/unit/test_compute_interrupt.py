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


def test_a_running_backward_stops_at_the_next_completed_parameter_gradient():
    m = Recorder()
    params = list(m.parameters())  # layers 0, 1, 2 (weight, bias); the backward reaches layer 2 first
    ci = ComputeInterrupt()
    ci.open(0, params)

    def watchdog(_p):  # fires once layer 2's weight gradient is complete
        t = threading.Thread(target=lambda: ci.interrupt(0, "quiesce for generation 3"))
        t.start()
        t.join()

    m.layers[2].weight.register_post_accumulate_grad_hook(watchdog)
    with pytest.raises(StepInterrupted, match="quiesce for generation 3.*backward"):
        m(torch.zeros(1, 4)).sum().backward()
    assert m.layers[0].weight.grad is None and m.layers[0].bias.grad is None  # never reached
    ci.close()
    assert no_global_hooks()


def test_idle_backward_hooks_change_no_gradient_and_follow_the_engines_parameters():
    torch.manual_seed(0)
    a, b = Recorder(), Recorder()
    b.load_state_dict(a.state_dict())
    x = torch.randn(3, 4)
    ci = ComputeInterrupt()
    ci.open(0, list(b.parameters()))
    a(x).pow(2).sum().backward()
    b(x).pow(2).sum().backward()
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa.grad, pb.grad)
    ci.close()
    # a new engine: the old parameters lose their hooks, an interrupt reaches only the new ones
    ci.open(0, list(a.parameters()))
    assert ci.interrupt(0, "quiesce for generation 4")
    for p in b.parameters():
        p.grad = None
    y = b.layers[2].weight.sum() * 1.0
    y.backward()  # b is no longer hooked (no module call: only the backward hooks could fire)
    with pytest.raises(StepInterrupted):
        (a.layers[2].weight.sum() * 1.0).backward()
    ci.close()


def test_spaced_splits_the_parameters_by_element_count():
    from phoenix_hpc.launch.interrupt import spaced

    assert spaced([], 8) == [] and spaced([5, 5], 0) == [] and spaced([0, 0], 4) == []
    assert spaced([1] * 53, 8) == [6, 13, 19, 26, 33, 39, 46, 52]  # ceil(53 k / 8) - 1
    assert spaced([1, 1, 1], 8) == [0, 1, 2]  # fewer parameters than checks: each once
    assert spaced([100, 1, 1, 1], 4) == [0, 3]  # a large first parameter covers three quarters
    for numels in ([3, 9, 27, 81, 1, 2], [7] * 200, [1, 10 ** 6, 1]):
        idx = spaced(numels, 8)
        assert idx == sorted(set(idx)) and len(idx) <= 8 and idx[-1] == len(numels) - 1


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


def test_frozen_parameters_take_no_hook():
    m = Recorder()
    m.layers[0].requires_grad_(False)  # e.g. a frozen embedding of a user's model
    ci = ComputeInterrupt()
    ci.open(0, list(m.parameters()))  # a hook on a frozen tensor would raise here
    assert ci.interrupt(0, "quiesce for generation 1")
    with pytest.raises(StepInterrupted, match="backward"):
        (m.layers[2].weight * 1.0).sum().backward()  # no module call: only a backward hook can raise
    ci.close()
