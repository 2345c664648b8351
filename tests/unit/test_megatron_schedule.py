"""Megatron-LM's scheduler state for a config, and where a checkpoint's differs (engines/megatron_schedule.py;
pure). The check through a real checkpoint's common.pt: tests/unit/test_megatron_ckpt.py."""

from __future__ import annotations

from phoenix_hpc.config.schema import JobConfig
from phoenix_hpc.engines.megatron_schedule import differences, scheduler_of, scheduler_state, whole


def cfg(**training) -> JobConfig:
    t = {"steps": 100, "global_batch_size": 8, "micro_batch_size": 2, "warmup_steps": 10, "lr": 3e-4,
         "min_lr": 3e-5, "lr_schedule": "cosine", "weight_decay": 0.1, **training}
    return JobConfig.model_validate({"name": "m", "engine": "megatron", "data": {"path": "d"}, "training": t})


def test_the_configs_own_state_differs_in_nothing():
    c = cfg()
    assert differences(scheduler_state(c, 40), c, 40) == []


def test_old_checkpoints_names_are_read_as_megatron_lm_reads_them():
    c = cfg()
    old = {"start_lr": 3e-4, "min_lr": 3e-5, "warmup_iter": 80, "end_iter": 800, "decay_style": "cosine",
           "num_iters": 320}
    assert differences(old, c, 40) == []
    (d,) = differences({**old, "warmup_iter": 16}, c, 40)
    assert (d.field, d.checkpoint, d.config) == ("warmup_iter", 16, 80)
    assert d.change.startswith("training.warmup_steps = 2")
    # the old name wins when both are there, as in Megatron-LM's load_state_dict
    (d,) = differences({**old, "max_lr": 3e-4, "start_lr": 1.0}, c, 40)
    assert d.field == "start_lr"


def test_a_style_phoenix_lacks_says_so():
    (d,) = differences({"lr_decay_style": "WSD"}, cfg(), 40)
    assert d.checkpoint == "WSD" and d.config == "cosine" and d.change.startswith("none: phoenix implements constant")


def test_weight_decay_that_changes_during_training_is_refused():
    (d,) = differences({"start_wd": 0.0, "end_wd": 0.1, "wd_incr_style": "linear"}, cfg(), 40)
    assert d.field == "start_wd/end_wd" and "phoenix's weight decay is constant" in d.source
    assert differences({"start_wd": 0.1, "end_wd": 0.1, "wd_incr_style": "constant"}, cfg(), 40) == []


def test_a_ramped_up_position_has_no_config():
    (d,) = differences({"num_steps": 300}, cfg(), 40)  # 300 samples in 40 iterations: a batch-size ramp-up
    assert (d.checkpoint, d.config) == (300, 320) and d.change.startswith("none:")
    (d,) = differences({"num_steps": 640}, cfg(), 40)
    assert d.change.startswith("training.global_batch_size = 16")


def test_a_decay_length_of_no_whole_step_count_says_why():
    (d,) = differences({"lr_decay_steps": 801}, cfg(), 40)
    assert "no whole number of steps at global batch 8" in d.change


def test_the_decay_length_is_training_lr_decay_steps():
    """A checkpoint of Megatron-LM's --train-iters 100 --lr-decay-iters 80 (at global batch 8: 640 samples)."""
    c = cfg(lr_decay_steps=80)
    assert scheduler_state(c, 40)["lr_decay_steps"] == 640 and scheduler_state(c, 40)["wd_incr_steps"] == 800
    assert differences({**scheduler_state(cfg(), 40), "lr_decay_steps": 640}, c, 40) == []
    (d,) = differences({"lr_decay_steps": 640}, cfg(), 40)  # decay unset: over the 100 steps
    assert (d.checkpoint, d.config) == (640, 800)
    assert d.source == "training.steps 100 (training.lr_decay_steps unset) x training.global_batch_size 8"
    assert d.change == ("training.steps = 80 (the decay length while training.lr_decay_steps is unset), or "
                        "training.lr_decay_steps = 80 (Megatron-LM's --lr-decay-iters)")
    (d,) = differences({"lr_decay_steps": 720}, c, 40)
    assert (d.checkpoint, d.config) == (720, 640)
    assert d.source == "training.lr_decay_steps 80 x training.global_batch_size 8"
    assert d.change == "training.lr_decay_steps = 90 (Megatron-LM's --lr-decay-iters)"


def test_scheduler_of_prefers_the_old_key():
    assert scheduler_of({"opt_param_scheduler": {"a": 1}}) == ("opt_param_scheduler", {"a": 1})
    assert scheduler_of({"lr_scheduler": {"b": 2}, "opt_param_scheduler": {"a": 1}}) == ("lr_scheduler", {"b": 2})
    assert scheduler_of({"iteration": 3}) is None and scheduler_of({"opt_param_scheduler": None}) is None


def test_a_warmup_fraction_computed_in_floating_point_is_the_same_warmup():
    c = cfg(steps=100, warmup_steps=29)  # from-megatron: --lr-warmup-fraction 0.29 of 100 iterations
    sd = {**scheduler_state(c, 40), "lr_warmup_steps": 0.29 * 800}  # Megatron-LM's samples: 231.99999999999997
    assert sd["lr_warmup_steps"] != 232 and differences(sd, c, 40) == []
    (d,) = differences({**sd, "lr_warmup_steps": 0.295 * 800}, c, 40)  # 236 samples: 29.5 steps
    assert "no whole number of steps" in d.change


def test_a_scheduler_value_that_is_no_finite_number_is_named_not_a_traceback():
    c = cfg(steps=100, warmup_steps=29)
    for bad in (float("inf"), float("-inf"), float("nan")):
        for fld in ("lr_warmup_steps", "lr_decay_steps", "num_steps"):
            (d,) = differences({**scheduler_state(c, 40), fld: bad}, c, 40)
            assert d.field == fld and d.checkpoint is bad
            assert d.change.startswith("none:" if fld == "num_steps" else "training.")


def test_whole_is_a_whole_number_within_a_relative_1e_9_only():
    assert whole(0.29 * 100) == 29 and whole(236.0) == 236 and whole(0) == 0 and whole(7) == 7
    for x in (2.5, 29.5, float("inf"), float("nan"), True, "3", None):
        assert whole(x) is None
