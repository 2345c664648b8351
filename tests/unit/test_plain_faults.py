"""Injected faults land in the unprotected loop of ``mode: checkpoint-restart`` (launch/plain_faults.py):
armed against the step the slot is about to start, fired at their phase with the landing record first, and
the slot's other instructions kept in order."""

from __future__ import annotations

import json
import threading
from collections import deque

import pytest

from phoenix_hpc.faults.trigger import InjectedCommError, arm_decision
from phoenix_hpc.launch.loop import train
from phoenix_hpc.launch.plain_faults import injection_hook


class FakeClient:
    """What the hook uses of :class:`phoenix_hpc.control.client.CoordinatorClient` without a liveness
    connection (``poll_if_rung`` pops every time); ``inbox``: the instructions each poll pops. An ``inject``
    is armed or refused with the real client's rule (:func:`phoenix_hpc.faults.trigger.arm_decision`)."""

    def __init__(self, inbox):
        self.inbox, self.sent, self.pid = deque(inbox), [], 4242
        self.injections, self.injections_lock = [], threading.Lock()
        self.instructions, self.started_step, self.last_step, self.polls = deque(), 0, None, []
        self.refused = []

    def poll_if_rung(self):
        self.polls.append(self.started_step)
        out = []
        for msg in self.inbox.popleft() if self.inbox else []:
            if msg["type"] != "inject":
                out.append(msg)
                continue
            step, why = arm_decision(msg["at_step"], msg["phase"], self.started_step, self.last_step, None)
            if step is not None:
                self.injections.append({**msg, "at_step": step})
            self.refused += [] if step is not None else [(msg["request_id"], why)]
        return out

    def send(self, msg):
        self.sent.append(msg)

    def stop_heartbeat(self):
        pass


class Engine:
    def __init__(self):
        self.step, self.calls = 0, []

    def forward_backward(self):
        self.calls.append(("fb", self.step + 1))
        return 1.0

    def reduce_gradients(self):
        self.calls.append(("rg", self.step + 1))

    def optimizer_step(self):
        self.calls.append(("opt", self.step + 1))
        self.step += 1


def test_an_injection_armed_for_a_later_step_fires_at_its_phase_with_its_landing_record(tmp_path):
    inject = {"type": "inject", "request_id": "r1", "kind": "transient", "phase": "optimizer_step", "at_step": 3}
    late = {"type": "inject", "request_id": "r0", "kind": "transient", "phase": "forward_backward", "at_step": 1}
    client = FakeClient([[inject, {"type": "note"}], [late]])  # ``late`` comes once step 1 has started
    engine = Engine()
    with pytest.raises(InjectedCommError):
        train(engine, 10, 1, phase_hook=injection_hook(client, tmp_path, 1, 10))
    # steps 1 and 2 complete; step 3 is interrupted before its optimizer step (the request was for step 3)
    assert engine.step == 2 and engine.calls[-2:] == [("fb", 3), ("rg", 3)]
    assert client.polls == [0, 1, 2] and client.started_step == 3 and client.last_step == 10
    assert list(client.instructions) == [{"type": "note"}]  # kept, in order, for whoever waits for it
    assert [r for r, _ in client.refused] == ["r0"]  # step 1 had started when it came
    (fired,) = client.sent
    assert fired["type"] == "inject_fired" and fired["request_id"] == "r1" and fired["step"] == 3
    assert fired["phase"] == "optimizer_step" and fired["world_rank"] == 1
    (record,) = [json.loads(p.read_text()) for p in (tmp_path / "faults").glob("fired-*.json")]
    assert record["request_id"] == "r1" and record["step"] == 3 and record["phase"] == "optimizer_step"


def test_without_injections_the_loop_trains_to_the_end():
    client = FakeClient([])
    engine = Engine()
    recs = train(engine, 4, 1, phase_hook=injection_hook(client, None, 0, 4))
    assert [r.step for r in recs] == [1, 2, 3, 4] and client.polls == [0, 1, 2, 3] and not client.sent
