"""Training counted in samples (training.train_samples, lr_warmup_samples, lr_decay_samples; Megatron-LM's
--train-samples, --lr-warmup-samples, --lr-decay-samples): the run length, the learning rate at each step and
the refusals, as Megatron-LM's validate_args, update_train_iters and OptimizerParamScheduler define them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from phoenix_hpc.cli.main import cli
from phoenix_hpc.config.load import parse_model
from phoenix_hpc.config.schema import JobConfig
from phoenix_hpc.data.blend import train_samples
from phoenix_hpc.engines.megatron_ckpt import megatron_args
from phoenix_hpc.engines.megatron_schedule import differences, scheduler_state
from phoenix_hpc.engines.schedule import lr_for, scheduler_record
from phoenix_hpc.errors import ConfigError

from test_lr_megatron_order import MegatronLoop  # Megatron-LM's scheduler and train-loop order

ROOT = Path(__file__).resolve().parents[2]

# 1000 samples at a global batch of 16: 62 steps (992 samples; the last 8 are not trained). A warm-up of 100
# samples (6.25 steps) and a decay over 900 samples (56.25 steps): neither ends on a step.
G, N, WARMUP, DECAY = 16, 1000, 100, 900


def _cfg(**training):
    return {"name": "t", "data": {"path": "d"}, "training": training}


def _training(**kw):
    base = dict(global_batch_size=G, micro_batch_size=4, train_samples=N, lr_warmup_samples=WARMUP,
                lr_decay_samples=DECAY, lr=1.0, min_lr=0.1)
    return parse_model(JobConfig, _cfg(**{**base, **kw}), source="x").training


def test_the_linear_rate_at_chosen_steps_is_megatron_lms_by_hand():
    t = _training(lr_schedule="linear")
    assert t.steps == 62
    # the update of step s runs at (s - 1) x 16 samples consumed (Megatron-LM steps its scheduler after it)
    assert lr_for(t, 1) == 0.0  # 0 samples: the warm-up's start
    # step 7: 96 samples, inside the 100-sample warm-up: 96 / 100 of lr (a 6-step warm-up would give 1.0)
    assert lr_for(t, 7) == pytest.approx(0.96, abs=1e-12)
    # step 8: 112 samples, 12 of the 800 decay samples after the warm-up: 1 - 0.9 x 12/800
    assert lr_for(t, 8) == pytest.approx(0.9865, abs=1e-12)
    # step 57: 896 samples, 796 of 800: 1 - 0.9 x 0.995
    assert lr_for(t, 57) == pytest.approx(0.1045, abs=1e-12)
    # step 58: 912 samples, past the 900-sample decay: min_lr
    assert lr_for(t, 58) == pytest.approx(0.1, abs=1e-12)
    assert lr_for(t, 62) == pytest.approx(0.1, abs=1e-12)


def test_the_cosine_rate_at_chosen_steps_is_megatron_lms_by_hand():
    t = _training(lr_schedule="cosine")
    assert lr_for(t, 4) == pytest.approx(0.48, abs=1e-12)  # 3 x 16 = 48 samples consumed before it: 48 / 100
    assert lr_for(t, 8) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 12 / 800)), abs=1e-12)
    assert lr_for(t, 32) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 396 / 800)), abs=1e-12)


@pytest.mark.parametrize("style", ["linear", "cosine", "constant"])
def test_every_step_updates_with_the_rate_megatron_lms_optimizer_step_uses(style):
    """Megatron-LM's order: iteration s's optimizer.step() runs at the rate the scheduler holds, then the
    scheduler steps by G; so the update that produces S(step) uses get_lr at (step - 1) x G samples."""
    t = _training(lr_schedule=style)
    loop = MegatronLoop(1.0, 0.1, WARMUP, DECAY, style, G)  # sample-counted: the lengths are samples already
    used, _ = loop.run(t.steps)
    for step in range(1, t.steps + 1):
        assert lr_for(t, step) == pytest.approx(used[step], abs=1e-12), step
    assert loop.num_steps == t.steps * G


def test_without_a_decay_length_the_decay_is_over_train_samples_and_warmup_defaults_to_0():
    t = parse_model(JobConfig, _cfg(global_batch_size=G, micro_batch_size=4, train_samples=N, lr=1.0,
                                    min_lr=0.0, lr_schedule="linear"), source="x").training
    assert t.decay_samples == N and t.lr_warmup_samples is None
    assert lr_for(t, 1) == 1.0  # no warm-up: the first update at the peak (0 samples consumed)
    assert lr_for(t, 2) == pytest.approx(1 - 16 / 1000, abs=1e-12)
    assert lr_for(t, 62) == pytest.approx(1 - 976 / 1000, abs=1e-12)  # the last update: 976 samples consumed


def test_train_samples_not_a_multiple_of_the_batch_runs_the_whole_batches_only():
    t = _training()
    assert t.steps == N // G == 62
    assert train_samples(t) == N  # the blend is built for Megatron-LM's --train-samples itself
    assert _training(steps=62).steps == 62  # given, it must be that number (a dumped config reads back)
    with pytest.raises(ConfigError) as exc:
        _training(steps=63)
    assert "training.steps: 63 is not training.train_samples // training.global_batch_size = 1000 // 16 = 62" \
        in str(exc.value) and "allowed: 62" in str(exc.value)


def test_a_dumped_config_reads_back_the_same():
    cfg = parse_model(JobConfig, _cfg(global_batch_size=G, micro_batch_size=4, train_samples=N,
                                      lr_warmup_samples=WARMUP, lr_decay_samples=DECAY), source="x")
    assert parse_model(JobConfig, cfg.model_dump(mode="json"), source="y") == cfg


def test_step_counted_configs_are_unchanged():
    t = parse_model(JobConfig, _cfg(steps=30, warmup_steps=5), source="x").training
    assert (t.train_samples, t.lr_warmup_samples, t.lr_decay_samples, t.decay_samples) == (None, None, None, None)
    assert t.steps == 30 and t.decay_steps == 30


def test_the_envelopes_scheduler_record_names_the_sample_lengths_and_a_step_counted_one_is_as_before():
    rec = scheduler_record(_training(), 7, 0.5)
    assert rec["train_samples"] == N and rec["warmup_samples"] == WARMUP and rec["decay_samples"] == DECAY
    assert rec["last_step"] == 7 and rec["last_lr"] == 0.5 and rec["total_steps"] == N // G
    t = parse_model(JobConfig, _cfg(steps=30, warmup_steps=5, lr_decay_steps=20), source="x").training
    assert scheduler_record(t, 3, 0.25) == {"kind": t.lr_schedule, "lr": t.lr, "min_lr": t.min_lr, "warmup_steps": 5,
                                            "total_steps": 30, "decay_steps": 20, "last_step": 3, "last_lr": 0.25}


def test_the_megatron_checkpoint_scheduler_and_args_are_in_samples():
    cfg = parse_model(JobConfig, _cfg(global_batch_size=G, micro_batch_size=4, train_samples=N,
                                      lr_warmup_samples=WARMUP, lr_decay_samples=DECAY), source="x")
    sd = scheduler_state(cfg, 5)
    assert (sd["lr_warmup_steps"], sd["lr_decay_steps"], sd["wd_incr_steps"], sd["num_steps"]) == \
        (WARMUP, DECAY, N, 5 * G)
    assert differences(sd, cfg, 5) == []
    other = dict(sd, lr_warmup_steps=112)
    (d,) = differences(other, cfg, 5)
    assert d.field == "lr_warmup_steps" and d.change.startswith("training.lr_warmup_samples = 112")
    a = megatron_args(cfg, dp=2)
    assert (a.train_iters, a.train_samples, a.lr_warmup_samples, a.lr_decay_samples, a.lr_decay_iters,
            a.lr_warmup_iters) == (62, N, WARMUP, DECAY, None, 0)


@pytest.mark.parametrize("training, needle", [
    ({"train_samples": -5}, "training.train_samples: value -5"),
    ({"train_samples": 1000, "lr_warmup_samples": -1}, "training.lr_warmup_samples: value -1"),
    ({"train_samples": 1000, "lr_decay_samples": 0}, "training.lr_decay_samples: value 0"),
    ({"train_samples": 1000, "lr_warmup_samples": 900, "lr_decay_samples": 900},
     "training.lr_warmup_samples: 900 is not less than the decay's 900 samples (training.lr_decay_samples)"),
    ({"train_samples": 1000, "lr_warmup_samples": 1000},
     "training.lr_warmup_samples: 1000 is not less than the decay's 1000 samples (training.train_samples"),
    ({"train_samples": 1000, "warmup_steps": 5}, "training.warmup_steps: 5 beside training.train_samples (1000)"),
    ({"train_samples": 1000, "lr_decay_steps": 50}, "training.lr_decay_steps: 50 beside training.train_samples"),
    ({"steps": 50, "lr_decay_samples": 500}, "training.lr_decay_samples: 500 is set but training.train_samples"),
    ({"steps": 50, "lr_warmup_samples": 10}, "training.lr_warmup_samples: 10 is set but training.train_samples"),
    ({"train_samples": 10}, "training.train_samples: 10 is less than one global batch (training.global_batch_size 16)"),
])
def test_bad_sample_counts_are_refused_naming_field_value_and_allowed(training, needle):
    with pytest.raises(ConfigError) as exc:
        parse_model(JobConfig, _cfg(global_batch_size=G, micro_batch_size=4, **training), source="x")
    text = str(exc.value)
    assert needle in text, text
    assert "allowed" in text or "greater than or equal" in text, text


def test_submit_exits_2_on_a_warmup_not_shorter_than_the_decay(tmp_path):
    cfg = yaml.safe_load((ROOT / "examples" / "gpt-small.yaml").read_text())
    cfg["data"]["path"] = str(ROOT / "data" / "stdlib")
    t = cfg["training"]
    t.pop("steps", None)
    t.pop("warmup_steps", None)
    t.update(train_samples=50 * t["global_batch_size"], lr_warmup_samples=60, lr_decay_samples=60)
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    res = CliRunner().invoke(cli, ["submit", "--site", "local", "--dry-run", str(p)])
    assert res.exit_code == 2, res.output
    assert "training.lr_warmup_samples: 60 is not less than the decay's 60 samples" in res.output
    assert "Traceback" not in res.output


def test_a_sample_warmup_past_the_samples_trained_is_warned_about():
    from phoenix_hpc.config.resolve import sample_warmup_warning

    assert sample_warmup_warning(_training()) is None  # 100 warm-up samples of 992 trained
    t = _training(lr_warmup_samples=992, lr_decay_samples=2000)
    text = sample_warmup_warning(t)
    assert "training.lr_warmup_samples (992) is not less than the 992 samples the run trains" in text
    assert "to 1 x training.lr at the last step" in text
    assert sample_warmup_warning(_training(lr_warmup_samples=991, lr_decay_samples=2000)) is None
    assert sample_warmup_warning(parse_model(JobConfig, _cfg(steps=10, warmup_steps=20), source="x").training) is None
