"""The evaluation after the job's last step (Megatron-LM's ``pretrain`` evaluates once more after training):
its schedule and validation positions, that a job shorter than its eval_interval (from-megatron's default
1000 with --train-iters 10) evaluates once, at its end, and that a fault in it is redone like any evaluation."""

from __future__ import annotations

import pytest
import torch

from phoenix_hpc.config.megatron_args import convert
from phoenix_hpc.config.schema import JobConfig
from phoenix_hpc.data.blend import valid_samples
from phoenix_hpc.launch.evaluate import Evaluator, evaluations_after, evaluator_of, final_eval_position
from phoenix_hpc.launch.loop import train
from phoenix_hpc.validation import parse_model
from test_eval_logging import _FakeEngine, _cfg, dataset  # noqa: F401 -- dataset is a fixture
from test_megatron_args import SMALL, ZERO


def test_the_last_step_is_followed_by_one_more_evaluation_on_the_next_validation_batches():
    # shorter than the interval: no periodic evaluation, one after the last step, from the first batch
    assert [(s, evaluations_after(s, 1000, 3, 8, 10)) for s in range(1, 11) if evaluations_after(s, 1000, 3, 8, 10)] \
        == [(10, [(0, True)])]
    # the last step is not a multiple: periodic at 4 and 8, then after 10 the third run of 3 batches
    assert {s: evaluations_after(s, 4, 3, 8, 10) for s in range(1, 11) if evaluations_after(s, 4, 3, 8, 10)} \
        == {4: [(0, False)], 8: [(24, False)], 10: [(48, True)]}
    # the last step is a multiple: its periodic evaluation, then Megatron-LM's after training on the next batches
    assert evaluations_after(12, 4, 3, 8, 12) == [(48, False), (72, True)]
    assert evaluations_after(12, None, 3, 8, 12) == [] and evaluations_after(12, 4, 3, 8, None) == [(48, False)]
    with pytest.raises(ValueError, match="not a step"):
        final_eval_position(0, 4, 3, 8)


@pytest.mark.parametrize("steps, interval, iters", [(10, 1000, 100), (10, 4, 3), (12, 4, 3), (1, 1, 1), (7, 7, 2)])
def test_the_evaluation_after_training_reads_the_last_batches_megatron_lm_sizes_the_validation_part_for(
        steps, interval, iters):
    cfg = parse_model(JobConfig, {"name": "ev", "data": {"blend": [{"path": "ds"}], "split": "90,10,0"},
                                  "model": {"layers": 2, "hidden_size": 32, "heads": 4, "vocab_size": 256,
                                            "seq_length": 32},
                                  "training": {"steps": steps, "micro_batch_size": 2, "global_batch_size": 4,
                                               "eval_interval": interval, "eval_iters": iters}}, source="test")
    (pos, final), = evaluations_after(steps, interval, iters, 4, steps)[-1:]
    assert final and pos + iters * 4 == valid_samples(cfg.training)  # the very end of the validation part


def test_from_megatrons_default_interval_with_ten_iterations_evaluates_once_at_the_end():
    cfg = parse_model(JobConfig, convert(SMALL + ZERO).config, source="test")
    assert (cfg.training.steps, cfg.training.eval_interval) == (10, 1000)
    ev = evaluator_of(cfg)
    assert ev.last_step == 10 and [s for s in range(1, 11) if ev.due(s)] == [10]


def test_a_fault_in_the_evaluation_after_training_is_redone_with_the_last_step():
    eng, order, hook = _FakeEngine(fail_eval_at=5), [], []
    ev = Evaluator(1000, 3, 8, on_eval=lambda r: order.append(("eval", r.step, r.position, r.final)), last_step=5)
    with pytest.raises(RuntimeError, match="during the evaluation"):
        train(eng, 5, 100, on_step=lambda r: order.append(("step", r.step)), evaluator=ev,
              phase_hook=lambda s, p: hook.append((s, p)))
    assert order == [("step", s) for s in range(1, 5)] and hook[-1] == (5, "evaluate")  # step 5 never recorded
    eng.step = 4  # the recovery restores S(4) (S(5)'s snapshot would start in iteration 6): step 5 again
    train(eng, 5, 100, on_step=lambda r: order.append(("step", r.step)), evaluator=ev)
    assert order[4:] == [("eval", 5, 0, True), ("step", 5)] and eng.evaluated == [(5, 0, 3)]


def test_the_torch_engine_evaluates_its_final_parameters_after_a_job_shorter_than_the_interval(dataset, world1):
    from phoenix_hpc.engines.base import GridCoord
    from phoenix_hpc.engines.factory import create_engine

    cfg = _cfg(dataset, {"eval_interval": 1000, "eval_iters": 2})
    eng = create_engine(cfg, GridCoord(0, 0, 0), world1, torch.device("cpu"))
    records = []
    train(eng, cfg.training.steps, 128, evaluator=evaluator_of(cfg, records.append))
    (rec,) = records
    assert (rec.step, rec.position, rec.iters, rec.final) == (cfg.training.steps, 0, 2, True)
    assert rec.loss is not None and rec.loss == eng.evaluate(0, 2)  # the final parameters' validation loss
