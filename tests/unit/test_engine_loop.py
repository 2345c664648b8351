"""The training loop's call order, with and without a protector (pure logic: a recording fake engine)."""

from __future__ import annotations

import pytest

from phoenix_hpc.launch.loop import train


class RecEngine:
    def __init__(self, calls):
        self.calls, self.step, self.last_lr, self.last_grad_norm = calls, 0, 0.1, 2.0

    def forward_backward(self):
        self.calls.append("fb")
        return 3.0 - self.step

    def reduce_gradients(self):
        self.calls.append("reduce")

    def optimizer_step(self):
        self.calls.append("opt")
        self.step += 1


class RecProtector:
    def __init__(self, calls, fail_at=None):
        self.calls, self.fail_at = calls, fail_at

    def start_snapshot(self, engine):
        self.calls.append(f"snap{engine.step}")

    def wait_commit(self):
        self.calls.append("wait")
        if self.fail_at is not None and self.calls.count("wait") == self.fail_at:
            raise RuntimeError("replica lost")


def test_without_protector_only_engine_calls():
    calls = []
    recs = train(RecEngine(calls), 2, tokens_per_step=100)
    assert calls == ["fb", "reduce", "opt"] * 2
    assert [r.step for r in recs] == [1, 2] and [r.loss for r in recs] == [3.0, 2.0]
    assert all(r.exposed_wait_ms == 0.0 and r.tokens_per_s > 0 for r in recs)


def test_protector_hooks_wrap_the_step():
    calls = []
    ticks = iter([0.0, 0.5, 0.75, 1.0, 2.0, 2.5, 2.5, 3.0])  # t0, wait start, wait end, step end (x2)
    recs = train(RecEngine(calls), 2, 1000, protector=RecProtector(calls), clock=lambda: next(ticks))
    assert calls == ["snap0", "fb", "reduce", "wait", "opt", "snap1", "fb", "reduce", "wait", "opt"]
    assert recs[0].exposed_wait_ms == pytest.approx(250.0) and recs[0].step_time_ms == pytest.approx(1000.0)
    assert recs[0].tokens_per_s == pytest.approx(1000.0) and recs[1].exposed_wait_ms == 0.0


def test_failed_commit_stops_before_the_update():
    calls = []
    eng = RecEngine(calls)
    with pytest.raises(RuntimeError, match="replica lost"):
        train(eng, 3, 1, protector=RecProtector(calls, fail_at=2))
    assert eng.step == 1 and calls[-1] == "wait"  # S(1) untouched: no optimizer step after the failure
