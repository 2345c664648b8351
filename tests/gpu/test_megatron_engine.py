"""The megatron engine on one GPU (tp=pp=dp=1): trains on real text, restores bit-identically, and exposes
the DistributedOptimizer's shard under logical names. Run by scripts/gpu-check.sh; skipped without CUDA."""

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
    g = dist.group.WORLD
    yield ProcessGroups(world=g, dp=g, pp=g, tp=g, generation=0)
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


def _cfg(dataset, dtype="float32"):
    from phoenix_hpc.config.schema import JobConfig

    return JobConfig.model_validate({
        "name": "meg", "engine": "megatron", "data": {"path": dataset},
        "model": {"layers": 2, "hidden_size": 64, "heads": 4, "vocab_size": 256, "seq_length": 64, "dtype": dtype},
        "parallelism": {"tp": 1, "pp": 1, "dp": 1},
        "training": {"steps": 30, "micro_batch_size": 4, "global_batch_size": 8, "lr": 3e-3, "warmup_steps": 2, "seed": 3},
    })


def _engine(cfg, groups):
    from phoenix_hpc.engines.base import GridCoord
    from phoenix_hpc.engines.megatron_engine import MegatronEngine

    return MegatronEngine(cfg, GridCoord(0, 0, 0), groups, torch.device("cuda", 0))


def test_megatron_trains_and_restores_identically(dataset, world1):
    from phoenix_hpc.launch.loop import train

    cfg = _cfg(dataset)
    a = _engine(cfg, world1)
    recs = train(a, 5, 512)
    saved = ({n: t.clone() for n, t in a.optimizer_shard()}, {n: t.clone() for n, t in a.param_shard()}, a.envelope())
    recs += train(a, 30, 512)
    losses = [r.loss for r in recs]
    print("megatron losses:", [round(x, 3) for x in losses])
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.3, losses
    b = _engine(cfg, world1)
    b.load_param_shard(saved[1])
    b.load_optimizer_shard(saved[0])
    b.load_envelope(saved[2])
    train(b, 30, 512)
    assert b.state_hash() == a.state_hash()


def test_megatron_shard_names_cover_params(dataset, world1):
    cfg = _cfg(dataset)
    e = _engine(cfg, world1)
    opt, par = dict(e.optimizer_shard()), dict(e.param_shard())
    assert all(n.startswith("opt/pp0/tp0/dp0/") and t.dtype == torch.float32 for n, t in opt.items())
    for pname, p in par.items():
        short = pname.split("/", 3)[3]
        main = opt[f"opt/pp0/tp0/dp0/{short}/main"]
        assert main.numel() == p.numel() and torch.equal(main, p.reshape(-1).float()), pname
    from phoenix_hpc.errors import EngineError

    with pytest.raises(EngineError, match="missing"):
        e.load_optimizer_shard({})


def test_megatron_bf16_runs(dataset, world1):
    from phoenix_hpc.launch.loop import train

    e = _engine(_cfg(dataset, "bfloat16"), world1)
    recs = train(e, 3, 512)
    assert all(r.loss == r.loss and r.loss < 10 for r in recs)
    assert all(t.dtype == torch.bfloat16 for _, t in e.param_shard())
    assert all(t.dtype == torch.float32 for _, t in e.optimizer_shard())
