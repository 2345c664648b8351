"""Dropout in the torch engine's GPT: masks are a pure function of (seed, sample position of the micro-batch,
stage), so a restored engine replays a step with the same masks and a micro-batch draws the same masks
whichever DP rank reads it; with dropout at 0 nothing changes; the config refuses dropout where no engine
implements it."""

from __future__ import annotations

import pytest
import torch

from phoenix_hpc.config.schema import JobConfig
from phoenix_hpc.data.indexed import TokenSamples
from phoenix_hpc.engines.base import GridCoord
from phoenix_hpc.engines.torch_engine import TorchEngine
from phoenix_hpc.engines.torch_gpt import GPTShape, GPTStage, dropout_seed
from phoenix_hpc.errors import ConfigError
from phoenix_hpc.launch.loop import train

SHAPE = GPTShape(2, 16, 2, 32, 8, attention_dropout=0.2, hidden_dropout=0.2)


def test_masks_follow_seed_position_and_stage_only():
    m = GPTStage(SHAPE, 1, 0, seed=3)
    x = torch.randint(0, 32, (4, 8))
    m.begin_step(5, 100, 2)
    a, b = m(x[:2]), m(x[2:])
    torch.manual_seed(12345)  # the global generator's state does not matter
    m.begin_step(5, 100, 2)
    assert torch.equal(m(x[:2]), a) and torch.equal(m(x[2:]), b)
    m.begin_step(5, 102, 2)  # the same micro-batch read as the first of another rank's run
    assert torch.equal(m(x[2:]), b)
    m.begin_step(6, 100, 2)
    assert not torch.equal(m(x[:2]), a)  # another seed
    m.begin_step(5, 104, 2)
    assert not torch.equal(m(x[:2]), a)  # another position
    assert dropout_seed(5, 100, 0) != dropout_seed(5, 100, 1)  # another stage


def test_the_global_generator_is_left_as_it_was():
    m = GPTStage(SHAPE, 1, 0, seed=3)
    x = torch.randint(0, 32, (2, 8))
    torch.manual_seed(7)
    want = torch.rand(3)
    torch.manual_seed(7)
    m.begin_step(5, 0, 2)
    m(x)
    assert torch.equal(torch.rand(3), want)


def test_eval_mode_and_zero_dropout_draw_nothing():
    m = GPTStage(SHAPE, 1, 0, seed=3).eval()
    x = torch.randint(0, 32, (2, 8))
    assert torch.equal(m(x), m(x))  # no begin_step needed
    plain = GPTStage(GPTShape(2, 16, 2, 32, 8), 1, 0, seed=3)
    assert torch.equal(plain(x), plain(x))
    assert torch.equal(plain(x), m(x))  # same weights; dropout off in eval mode


def test_forward_without_begin_step_is_refused_in_training():
    with pytest.raises(RuntimeError, match="begin_step"):
        GPTStage(SHAPE, 1, 0, seed=3)(torch.randint(0, 32, (2, 8)))


@pytest.fixture(scope="module")
def dataset(small_dataset):
    return small_dataset


def _engine(dataset, groups, dropout: float):
    cfg = JobConfig.model_validate({
        "name": "t", "data": {"path": dataset},
        "model": {"layers": 2, "hidden_size": 32, "heads": 2, "vocab_size": 256, "seq_length": 32,
                  "attention_dropout": dropout, "hidden_dropout": dropout},
        "parallelism": {"tp": 1, "pp": 1, "dp": 1},
        "training": {"steps": 8, "micro_batch_size": 2, "global_batch_size": 4, "lr": 3e-3, "seed": 11}})
    return TorchEngine(cfg, GridCoord(0, 0, 0), groups, TokenSamples(dataset, 32, 11, 256))


def test_a_restored_engine_replays_with_the_same_masks(dataset, world1):
    a = _engine(dataset, world1, 0.1)
    train(a, 3, 128)
    saved = ({n: t.clone() for n, t in a.optimizer_shard()}, {n: t.clone() for n, t in a.param_shard()}, a.envelope())
    train(a, 6, 128)
    b = _engine(dataset, world1, 0.1)
    b.load_optimizer_shard(saved[0])
    b.load_param_shard(saved[1])
    b.load_envelope(saved[2])
    torch.manual_seed(999)  # another process's generator state (the engine's construction seeds it)
    train(b, 6, 128)
    assert b.state_hash() == a.state_hash()
    c = _engine(dataset, world1, 0.0)  # dropout changes the training (the masks are really drawn)
    train(c, 6, 128)
    assert c.state_hash() != a.state_hash()


def _cfg(engine: str, model: dict) -> dict:
    return {"name": "t", "engine": engine, "data": {"path": "d"},
            "model": {"layers": 2, "hidden_size": 32, "heads": 2, **model}}


@pytest.mark.parametrize("engine, model, needle", [
    ("megatron", {"attention_dropout": 1.0}, "model.attention_dropout: value 1.0 -- Input should be less than 1"),
    ("torch", {"hidden_dropout": 1.0}, "model.hidden_dropout: value 1.0 -- Input should be less than 1"),
    ("torch", {"hidden_dropout": -0.1},
     "model.hidden_dropout: value -0.1 -- Input should be greater than or equal to 0"),
    ("torch", {"factory": "m:f", "attention_dropout": 0.1}, "apply to the built-in GPT only"),
])
def test_dropout_the_engine_cannot_run_is_refused(engine, model, needle):
    from phoenix_hpc.validation import parse_model

    with pytest.raises(ConfigError) as exc:
        parse_model(JobConfig, _cfg(engine, model), source="test")
    assert needle in str(exc.value), str(exc.value)
