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


def test_a_long_run_keeps_no_records_and_its_totals_match_the_records():
    from phoenix_hpc.launch.loop import StepTotals

    kept, totals, seen = train(RecEngine([]), 3, 10), StepTotals(), []
    calls = []
    out = train(RecEngine(calls), 3, 10, on_step=lambda r: (seen.append(r), totals.add(r)), keep=False)
    assert out == [] and [r.step for r in seen] == [1, 2, 3] and calls == ["fb", "reduce", "opt"] * 3
    assert (totals.steps, totals.first_loss, totals.last_loss) == (3, kept[0].loss, kept[-1].loss) == (3, 3.0, 1.0)
    assert totals.time_ms == pytest.approx(sum(r.step_time_ms for r in seen))


def test_step_totals_skip_steps_without_a_loss():
    from phoenix_hpc.launch.loop import StepRecord, StepTotals

    t = StepTotals()
    for step, loss in ((1, None), (2, 5.0), (3, None), (4, 4.0), (5, None)):
        t.add(StepRecord(step=step, loss=loss, step_time_ms=2.0, tokens_per_s=0.0, exposed_wait_ms=0.0, lr=0.0,
                         grad_norm=0.0))
    assert (t.steps, t.time_ms, t.first_loss, t.last_loss) == (5, 10.0, 5.0, 4.0)
    assert StepTotals().first_loss is None
