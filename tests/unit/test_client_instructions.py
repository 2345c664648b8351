"""CoordinatorClient.wait_instruction keeps every instruction it pops but does not return."""

from __future__ import annotations

from collections import deque

from phoenix_hpc.control.client import CoordinatorClient


def _client(batches):
    c = object.__new__(CoordinatorClient)  # no coordinator: only the instruction queue is exercised
    c.instructions = deque()
    c._alive = None  # no liveness connection: every wait polls
    c.poll = lambda: batches.pop(0) if batches else []
    return c


def test_instructions_after_the_one_waited_for_are_kept():
    # a re-planned recovery: both quiesce messages arrive in one poll
    c = _client([[{"type": "quiesce", "generation": 1}, {"type": "quiesce", "generation": 2}]])
    assert c.wait_instruction(("quiesce",), 1.0)["generation"] == 1
    assert list(c.instructions) == [{"type": "quiesce", "generation": 2}]


def test_other_instructions_are_queued_and_stop_always_returns():
    c = _client([[{"type": "resume", "step": 3}], [{"type": "stop", "reason": "x"}, {"type": "recover"}]])
    assert c.wait_instruction(("recover",), 1.0)["type"] == "stop"
    assert [m["type"] for m in c.instructions] == ["resume", "recover"]
    assert c.wait_instruction(("recover",), 0.05) is None
