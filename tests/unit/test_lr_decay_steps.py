"""training.lr_decay_steps: the learning-rate decay ends at that position, counted from position 0 with the
warm-up in it, as Megatron-LM's OptimizerParamScheduler.get_lr with --lr-decay-iters (engines/schedule.py;
schema); the update that produces step s runs at position s - 1 (Megatron-LM steps its scheduler after the
optimizer), so min_lr is first used by the update of step lr_decay_steps + 1."""

from __future__ import annotations

import math

import pytest

from phoenix_hpc.config.load import parse_model
from phoenix_hpc.config.schema import JobConfig
from phoenix_hpc.engines.schedule import lr_at, lr_for
from phoenix_hpc.errors import ConfigError


def megatron_lr(num_steps: int, *, max_lr: float, min_lr: float, style: str, warmup: int, decay: int) -> float:
    """Megatron-LM's get_lr at position num_steps (iterations completed), written out from its definition
    (init_lr 0)."""
    if warmup > 0 and num_steps <= warmup:
        return max_lr * num_steps / warmup
    if style == "constant":
        return max_lr
    if num_steps > decay:
        return min_lr
    ratio = (num_steps - warmup) / (decay - warmup)
    coeff = 1.0 - ratio if style == "linear" else 0.5 * (math.cos(math.pi * ratio) + 1.0)
    return min_lr + coeff * (max_lr - min_lr)


@pytest.mark.parametrize("style", ["linear", "cosine", "constant"])
def test_a_decay_shorter_than_the_run_follows_megatron_lms_formula_and_ends_at_min_lr(style):
    kw = dict(lr=1.0, min_lr=0.1, schedule=style, warmup_steps=2, total_steps=10, decay_steps=8)
    for n in range(0, 11):
        want = megatron_lr(n, max_lr=1.0, min_lr=0.1, style=style, warmup=2, decay=8)
        assert lr_at(n, **kw) == pytest.approx(want, abs=1e-12), n
    t = parse_model(JobConfig, _cfg(steps=10, warmup_steps=2, lr_decay_steps=8, lr=1.0, min_lr=0.1,
                                    lr_schedule=style), source="x").training
    for step in range(1, 11):  # the update of step s at position s - 1
        want = megatron_lr(step - 1, max_lr=1.0, min_lr=0.1, style=style, warmup=2, decay=8)
        assert lr_for(t, step) == pytest.approx(want, abs=1e-12), step
    assert lr_for(t, 1) == 0.0 and lr_for(t, 3) == 1.0  # the warm-up of 2: step 3 is the first at the peak
    if style != "constant":
        assert [lr_for(t, s) for s in (9, 10)] == [pytest.approx(0.1)] * 2  # min_lr from step decay_steps + 1 on
        coeff = 1 / 6 if style == "linear" else 0.5 * (1 + math.cos(math.pi * 5 / 6))  # 5 of 6 decay steps
        assert lr_for(t, 8) == pytest.approx(0.1 + 0.9 * coeff)  # position 7: not yet min_lr
        assert lr_for(t, 6) == pytest.approx(0.55)  # position 5: halfway from position 2 to position 8
        assert lr_at(5, **kw) != pytest.approx(lr_at(5, **{**kw, "decay_steps": None}))  # not the 10-step decay


def test_a_decay_longer_than_the_run_ends_above_min_lr_as_megatron_lm():
    kw = dict(lr=1.0, min_lr=0.0, schedule="linear", warmup_steps=0, total_steps=10, decay_steps=20)
    assert lr_at(10, **kw) == pytest.approx(0.5) == megatron_lr(10, max_lr=1.0, min_lr=0.0, style="linear",
                                                                   warmup=0, decay=20)
    t = parse_model(JobConfig, _cfg(steps=10, lr_decay_steps=20, lr=1.0, min_lr=0.0, lr_schedule="linear"),
                    source="x").training
    assert lr_for(t, 1) == 1.0 and lr_for(t, 10) == pytest.approx(0.55)  # the last update: position 9 of 20


def test_without_a_decay_length_the_schedule_is_todays():
    for style in ("linear", "cosine", "constant"):
        kw = dict(lr=1.0, min_lr=0.1, schedule=style, warmup_steps=4, total_steps=14)
        assert [lr_at(s, **kw) for s in range(1, 20)] == [lr_at(s, decay_steps=14, **kw) for s in range(1, 20)]


def _cfg(**training):
    return {"name": "t", "data": {"path": "d"}, "training": training}


def test_the_field_defaults_to_the_runs_steps():
    t = parse_model(JobConfig, _cfg(steps=30), source="x").training
    assert t.lr_decay_steps is None and t.decay_steps == 30
    t = parse_model(JobConfig, _cfg(steps=30, warmup_steps=5, lr_decay_steps=20), source="x").training
    assert t.decay_steps == 20
    assert parse_model(JobConfig, _cfg(warmup_steps=5, lr_decay_steps=5), source="x").training.decay_steps == 5


@pytest.mark.parametrize("training, needle", [
    ({"warmup_steps": 8, "lr_decay_steps": 7}, "training.lr_decay_steps: 7 is shorter than training.warmup_steps (8)"),
    ({"lr_decay_steps": 0}, "training.lr_decay_steps"),
    ({"lr_decay_steps": 2.5}, "training.lr_decay_steps"),
])
def test_a_bad_decay_length_is_refused_naming_field_value_and_allowed(training, needle):
    with pytest.raises(ConfigError) as exc:
        parse_model(JobConfig, _cfg(**training), source="x")
    text = str(exc.value)
    assert needle in text, text
    if "shorter" in needle:
        assert "allowed: >= warmup_steps" in text
