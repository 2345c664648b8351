"""Dropout in the Megatron engine, the parts that need no GPU: the per-step seed is a pure function of
(seed, step, pp, dp); the engine reseeds megatron-core's random states before every step's schedule, so a
step replayed by a fresh engine with another random state draws the first try's masks (megatron-core's
``tensor_parallel`` module and the schedule are stand-ins here: the stand-in seeds torch's CPU generator and
the schedule draws dropout masks from it); the config passes dropout to ``TransformerConfig``. The same on a
GPU with megatron-core's own tracker: gpucheck item ``megatron.dropout``."""

from __future__ import annotations

import types
import warnings

import pytest
import torch

from phoenix_hpc.config.schema import JobConfig
from phoenix_hpc.engines.megatron_rng import SEED_BITS, reseed, step_seed
from phoenix_hpc.topology import GridCoord

warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine).*")


def test_step_seed_is_pure_and_differs_by_step_stage_and_replica():
    s = step_seed(3, 5, 1, 2)
    assert s == step_seed(3, 5, 1, 2) and 0 <= s < 2**SEED_BITS
    others = {step_seed(3, 6, 1, 2), step_seed(3, 5, 0, 2), step_seed(3, 5, 1, 3), step_seed(4, 5, 1, 2)}
    assert s not in others and len(others) == 4
    assert len({step_seed(0, n, 0, 0) for n in range(1, 2001)}) == 2000
    with pytest.raises(ValueError, match="must be >= 0"):
        step_seed(3, -1, 0, 0)


class StandInTensorParallel:
    """``megatron.core.tensor_parallel`` as far as :func:`reseed` uses it: records the seeds; seeds torch's CPU
    generator (megatron-core seeds the CUDA one and its tracker)."""

    def __init__(self):
        self.seeds: list[int] = []

    def model_parallel_cuda_manual_seed(self, seed: int) -> None:
        self.seeds.append(seed)
        torch.manual_seed(seed)


def test_reseed_calls_model_parallel_cuda_manual_seed_with_the_step_seed():
    tp = StandInTensorParallel()
    assert reseed(tp, 3, 7, 1, 0) == step_seed(3, 7, 1, 0)
    assert tp.seeds == [step_seed(3, 7, 1, 0)]


def _engine(step: int, coord: GridCoord, masks: list, tp: StandInTensorParallel):
    """A MegatronEngine without its CUDA parts: the attributes ``forward_backward`` reads, and a schedule that
    draws one dropout mask per micro-batch from torch's generator (as megatron-core's dropout does)."""
    from phoenix_hpc.engines.megatron_engine import MegatronEngine

    e = object.__new__(MegatronEngine)
    e.cfg = types.SimpleNamespace(training=types.SimpleNamespace(seed=11, micro_batch_size=2, global_batch_size=4),
                                  model=types.SimpleNamespace(seq_length=8))
    e.step, e.coord, e.n_micro, e.dp = step, coord, 2, 1
    e.model = types.SimpleNamespace(zero_grad_buffer=lambda: None)
    e.optimizer = types.SimpleNamespace(zero_grad=lambda: None)

    def schedule(**kw):
        masks.append(torch.stack([torch.nn.functional.dropout(torch.ones(16), 0.5) for _ in range(kw["num_microbatches"])]))
        return []

    e._mc = {"tensor_parallel": tp, "get_forward_backward_func": lambda: schedule,
             "parallel_state": types.SimpleNamespace(is_pipeline_last_stage=lambda: False)}
    e._iterator = lambda *a, **k: iter(())
    return e


def test_a_replayed_step_draws_the_masks_of_its_first_try_whatever_the_random_state():
    first, tp = [], StandInTensorParallel()
    a = _engine(0, GridCoord(1, 0, 0), first, tp)
    for _ in range(3):
        assert a.forward_backward() is None  # not the last stage
        a.step += 1  # what optimizer_step does
    assert tp.seeds == [step_seed(11, n, 1, 0) for n in (1, 2, 3)]
    assert not torch.equal(first[1], first[2])  # each step its own masks

    torch.manual_seed(987654)  # a spare: another process, another random state
    torch.rand(5)
    replay: list = []
    b = _engine(1, GridCoord(1, 0, 0), replay, StandInTensorParallel())  # restored at step 1
    b.forward_backward()
    assert torch.equal(replay[0], first[1])

    other: list = []  # the same step on another DP replica draws other masks
    _engine(1, GridCoord(1, 1, 0), other, StandInTensorParallel()).forward_backward()
    assert not torch.equal(other[0], first[1])


def _job(model: dict) -> JobConfig:
    return JobConfig.model_validate({"name": "m", "engine": "megatron", "data": {"path": "d"},
                                     "model": {"layers": 2, "hidden_size": 32, "heads": 2, **model}})


def test_the_config_passes_dropout_to_megatron_cores_transformer_config():
    from megatron.core.transformer import TransformerConfig

    from phoenix_hpc.engines.megatron_spec import build_problems, transformer_config_kwargs

    cfg = _job({"attention_dropout": 0.1, "hidden_dropout": 0.2})
    tc = TransformerConfig(**transformer_config_kwargs(cfg))
    assert (tc.attention_dropout, tc.hidden_dropout, tc.deterministic_mode) == (0.1, 0.2, True)
    assert build_problems(cfg) == []
    off = TransformerConfig(**transformer_config_kwargs(_job({})))
    assert (off.attention_dropout, off.hidden_dropout) == (0.0, 0.0)
