"""The rate of each update against Megatron-LM's train loop order: its OptimizerParamScheduler sets the rate at
position 0 on construction (``step(0)`` in ``__init__``), and every iteration runs ``optimizer.step()`` at the
rate the param groups hold, THEN ``opt_param_scheduler.step(increment=global batch)``; its log line of the
iteration prints the rate after that scheduler step (megatron-core's optimizer_param_scheduler.py,
megatron/training/training.py). So iteration s trains at get_lr((s - 1) x G): iteration 1 of a warm-up at 0."""

from __future__ import annotations

import math

import pytest

from phoenix_hpc.config.load import parse_model
from phoenix_hpc.config.schema import JobConfig
from phoenix_hpc.engines.schedule import lr_at, lr_for


class MegatronLoop:
    """Megatron-LM's scheduler and the order of its train loop, written out from their definitions (init_lr 0,
    the iteration-based lengths multiplied by the global batch ``g`` as get_optimizer_param_scheduler does).
    ``run(n)`` returns, for iterations 1..n, the rate ``optimizer.step()`` used and the rate logged."""

    def __init__(self, max_lr, min_lr, warmup, decay, style, g):
        assert warmup < decay  # Megatron-LM's own assert
        self.max_lr, self.min_lr, self.warmup, self.decay, self.style, self.g = max_lr, min_lr, warmup, decay, style, g
        self.num_steps = 0
        self.param_group_lr = None
        self.step(0)  # OptimizerParamScheduler.__init__

    def get_lr(self):
        n = self.num_steps
        if self.warmup > 0 and n <= self.warmup:
            return self.max_lr * float(n) / float(self.warmup)
        if self.style == "constant":
            return self.max_lr
        if n > self.decay:
            return self.min_lr
        ratio = float(n - self.warmup) / float(self.decay - self.warmup)
        coeff = 1.0 - ratio if self.style == "linear" else 0.5 * (math.cos(math.pi * ratio) + 1.0)
        return self.min_lr + coeff * (self.max_lr - self.min_lr)

    def step(self, increment):
        self.num_steps += increment
        self.param_group_lr = self.get_lr()

    def run(self, iterations):
        used, logged = {}, {}
        for it in range(1, iterations + 1):
            used[it] = self.param_group_lr  # optimizer.step() at the rate the param groups hold
            self.step(self.g)  # then opt_param_scheduler.step(increment=global batch)
            logged[it] = self.param_group_lr  # training_log reads the param groups after train_step
        return used, logged


G = 8


def _training(**kw):
    return parse_model(JobConfig, {"name": "t", "data": {"path": "d"}, "training": kw}, source="x").training


def test_iteration_one_of_a_warmup_trains_at_0_and_the_first_after_it_at_the_peak():
    t = _training(steps=20, global_batch_size=G, micro_batch_size=2, warmup_steps=4, lr=1e-3, min_lr=1e-4)
    used, _ = MegatronLoop(1e-3, 1e-4, 4 * G, 20 * G, "cosine", G).run(20)
    assert used[1] == 0.0 and lr_for(t, 1) == 0.0
    assert used[2] == pytest.approx(0.25e-3, abs=1e-15) and lr_for(t, 2) == pytest.approx(0.25e-3, abs=1e-15)
    assert used[5] == 1e-3 and lr_for(t, 5) == 1e-3  # warm-up of 4: iteration 5 at the peak
    assert lr_for(t, 4) == pytest.approx(0.75e-3, abs=1e-15)  # not yet: 3 of the 4 warm-up steps done


@pytest.mark.parametrize("style", ["linear", "cosine", "constant"])
def test_every_step_counted_update_uses_the_rate_of_megatron_lms_loop(style):
    t = _training(steps=30, global_batch_size=G, micro_batch_size=2, warmup_steps=3, lr_decay_steps=20, lr=1.0,
                  min_lr=0.1, lr_schedule=style)
    used, logged = MegatronLoop(1.0, 0.1, 3 * G, 20 * G, style, G).run(30)
    for s in range(1, 31):
        assert lr_for(t, s) == pytest.approx(used[s], abs=1e-12), s
        # Megatron-LM's log line of iteration s prints the rate of iteration s + 1
        assert logged[s] == pytest.approx(lr_at(s, lr=1.0, min_lr=0.1, schedule=style, warmup_steps=3,
                                                total_steps=30, decay_steps=20), abs=1e-12), s


@pytest.mark.parametrize("style", ["linear", "cosine"])
def test_every_sample_counted_update_uses_the_rate_of_megatron_lms_loop(style):
    # 1000 samples at a global batch of 16; a warm-up of 100 and a decay of 900 samples end within a step
    t = _training(train_samples=1000, global_batch_size=16, micro_batch_size=4, lr_warmup_samples=100,
                  lr_decay_samples=900, lr=1.0, min_lr=0.1, lr_schedule=style)
    used, _ = MegatronLoop(1.0, 0.1, 100, 900, style, 16).run(t.steps)
    assert used[1] == 0.0 and lr_for(t, 1) == 0.0
    for s in range(1, t.steps + 1):
        assert lr_for(t, s) == pytest.approx(used[s], abs=1e-12), s


def test_a_run_continued_from_iteration_s_trains_s_plus_1_as_megatron_lm_would():
    """A Megatron-LM checkpoint at iteration S holds num_steps = S x G; its load_state_dict steps a fresh
    scheduler (at 0) by that, so iteration S + 1 trains at get_lr(S x G): phoenix's lr_for(S + 1)."""
    t = _training(steps=20, global_batch_size=G, micro_batch_size=2, warmup_steps=4, lr=1e-3, min_lr=1e-4)
    used, _ = MegatronLoop(1e-3, 1e-4, 4 * G, 20 * G, "cosine", G).run(20)
    for s in (3, 4, 12):
        resumed = MegatronLoop(1e-3, 1e-4, 4 * G, 20 * G, "cosine", G)
        resumed.step(s * G)  # load_state_dict: self.step(increment=num_steps)
        assert resumed.param_group_lr == pytest.approx(used[s + 1], abs=1e-15)
        assert lr_for(t, s + 1) == pytest.approx(resumed.param_group_lr, abs=1e-15), s


def test_no_update_produces_step_0_and_no_position_is_negative():
    t = _training(steps=20, warmup_steps=4)
    with pytest.raises(ValueError, match=r"step 0 has no update \(allowed: >= 1"):
        lr_for(t, 0)
    with pytest.raises(ValueError, match=r"position -1 is negative \(allowed: >= 0"):
        lr_at(-1, lr=1.0, min_lr=0.0, schedule="linear", warmup_steps=4, total_steps=20)
