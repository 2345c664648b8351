"""The megatron engine on one GPU (tp=pp=dp=1): trains on real text, is torn down and rebuilt in the same
process (the rebuild recovery path) and continues bit-identically from a saved state, keeps Adam's step
counter, builds the Llama shape, and exposes the DistributedOptimizer's shard under logical names. Run by
scripts/gpu-check.sh; skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from phoenix_hpc.data.prepare import prepare_dataset, stdlib_dir

    out = tmp_path_factory.mktemp("data") / "stdlib"
    prepare_dataset(stdlib_dir(), out, max_bytes=500_000)
    return str(out)


@pytest.fixture(scope="module")
def world1():
    import torch.distributed as dist

    from phoenix_hpc.engines.base import ProcessGroups

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    # the engine owns its groups: the launcher passes the generation's default group only
    yield ProcessGroups(world=dist.group.WORLD, dp=None, pp=None, tp=None, generation=0)
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


@pytest.fixture
def engines():
    """Engines built by a test; each is torn down at its end (the next one needs a fresh parallel state)."""
    built = []
    yield built
    for e in built:
        e.teardown()


LLAMA = {"position_embedding_type": "rope", "activation": "swiglu", "normalization": "RMSNorm",
         "add_bias_linear": False, "num_query_groups": 2, "ffn_hidden_size": 176}


def _cfg(dataset, dtype="float32", **model):
    from phoenix_hpc.config.schema import JobConfig

    return JobConfig.model_validate({
        "name": "meg", "engine": "megatron", "data": {"path": dataset},
        "model": {"layers": 2, "hidden_size": 64, "heads": 4, "vocab_size": 256, "seq_length": 64, "dtype": dtype,
                  **model},
        "parallelism": {"tp": 1, "pp": 1, "dp": 1},
        "training": {"steps": 30, "micro_batch_size": 4, "global_batch_size": 8, "lr": 3e-3, "warmup_steps": 2, "seed": 3},
    })


def _engine(cfg, groups, engines):
    from phoenix_hpc.engines.base import GridCoord
    from phoenix_hpc.engines.megatron_engine import MegatronEngine

    e = MegatronEngine(cfg, GridCoord(0, 0, 0), groups, torch.device("cuda", 0))
    engines.append(e)
    return e


def test_megatron_trains_tears_down_rebuilds_and_continues_identically(dataset, world1, engines):
    from megatron.core import parallel_state

    from phoenix_hpc.launch.loop import train

    cfg = _cfg(dataset)
    a = _engine(cfg, world1, engines)
    assert a.groups.dp is not None and a.groups.world is world1.world
    recs = train(a, 5, 512)
    saved = ({n: t.clone() for n, t in a.optimizer_shard()}, {n: t.clone() for n, t in a.param_shard()}, a.envelope())
    assert saved[2]["adam_step"] == 5
    recs += train(a, 30, 512)
    losses = [r.loss for r in recs]
    print("megatron losses:", [round(x, 3) for x in losses])
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.3, losses
    want = a.state_hash()
    a.teardown()
    assert not parallel_state.model_parallel_is_initialized()
    b = _engine(cfg, world1, engines)  # the next generation, same process
    b.load_param_shard(saved[1])
    b.load_optimizer_shard(saved[0])
    b.load_envelope(saved[2])
    assert b.envelope()["adam_step"] == 5
    train(b, 30, 512)
    assert b.state_hash() == want


def test_megatron_llama_shape_trains(dataset, world1, engines):
    from phoenix_hpc.launch.loop import train

    e = _engine(_cfg(dataset, "bfloat16", **LLAMA), world1, engines)
    names = [n for n, _ in e.param_shard()]
    assert not any(n.endswith(".bias") for n in names) and not any("position_embeddings" in n for n in names)
    recs = train(e, 5, 512)
    assert all(r.loss == r.loss and r.loss < 10 for r in recs)
    assert e.envelope()["adam_step"] == 5


def test_megatron_shard_names_cover_params(dataset, world1, engines):
    cfg = _cfg(dataset)
    e = _engine(cfg, world1, engines)
    opt, par = dict(e.optimizer_shard()), dict(e.param_shard())
    assert all(n.startswith("opt/pp0/tp0/dp0/") and t.dtype == torch.float32 for n, t in opt.items())
    for pname, p in par.items():
        short = pname.split("/", 3)[3]
        main = opt[f"opt/pp0/tp0/dp0/{short}/main"]
        assert main.numel() == p.numel() and torch.equal(main, p.reshape(-1).float()), pname
    from phoenix_hpc.errors import EngineError

    with pytest.raises(EngineError, match="missing"):
        e.load_optimizer_shard({})


def test_megatron_bf16_runs(dataset, world1, engines):
    from phoenix_hpc.launch.loop import train

    e = _engine(_cfg(dataset, "bfloat16"), world1, engines)
    recs = train(e, 3, 512)
    assert all(r.loss == r.loss and r.loss < 10 for r in recs)
    assert all(t.dtype == torch.bfloat16 for _, t in e.param_shard())
    assert all(t.dtype == torch.float32 for _, t in e.optimizer_shard())
