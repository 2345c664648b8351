"""The torch engine in one process (world of 1 over gloo), its pure parts, and the launch helpers."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from phoenix_hpc.config.load import parse_model
from phoenix_hpc.config.schema import JobConfig
from phoenix_hpc.data.indexed import TokenSamples
from phoenix_hpc.data.prepare import prepare_dataset, stdlib_dir
from phoenix_hpc.engines.base import GridCoord, ProcessGroups
from phoenix_hpc.engines.factory import check_engine_runnable
from phoenix_hpc.engines.styles import ENGINE_RECOVERY_STYLES, recovery_path_of
from phoenix_hpc.engines.user_code import load_engine_class
from phoenix_hpc.engines.schedule import lr_at
from phoenix_hpc.engines.torch_engine import TorchEngine, micro_batches
from phoenix_hpc.engines.torch_gpt import GPTShape, GPTStage
from phoenix_hpc.engines.zero import flat_pieces
from phoenix_hpc.errors import ConfigError, EngineError
from phoenix_hpc.launch.env import check_against_mpi, slot_from_env
from phoenix_hpc.launch.groups import resolve_grid
from phoenix_hpc.launch.loop import train


# --- pure parts -------------------------------------------------------------------------------------
@pytest.mark.parametrize("dp", [1, 2, 3, 7])
def test_flat_pieces_cover_every_element_once(dp):
    sizes = [("a", 10), ("b", 1), ("c", 33), ("d", 4)]
    covered = {n: [0] * k for n, k in sizes}
    lens = set()
    for r in range(dp):
        shard_len, pieces = flat_pieces(sizes, r, dp)
        lens.add(shard_len)
        for pc in pieces:
            assert 0 <= pc.shard_offset and pc.shard_offset + pc.length <= shard_len
            for i in range(pc.param_offset, pc.param_offset + pc.length):
                covered[pc.name][i] += 1
    assert len(lens) == 1 and lens.pop() * dp >= 48
    assert all(c == 1 for v in covered.values() for c in v)


def test_lr_schedule():
    kw = dict(lr=1.0, min_lr=0.1, warmup_steps=4, total_steps=14)
    assert [lr_at(n, schedule="cosine", **kw) for n in (0, 1, 2, 4)] == [0.0, 0.25, 0.5, 1.0]
    assert lr_at(14, schedule="cosine", **kw) == pytest.approx(0.1)
    assert lr_at(9, schedule="cosine", **kw) == pytest.approx(0.55)
    assert lr_at(9, schedule="linear", **kw) == pytest.approx(0.55)
    assert lr_at(99, schedule="constant", **kw) == 1.0
    with pytest.raises(ValueError, match="unknown"):
        lr_at(5, schedule="step", **kw)


def test_batch_split_errors():
    assert micro_batches(16, 2, 4) == 2
    with pytest.raises(EngineError, match="global_batch_size \\(12\\).*micro_batch_size \\(2\\) x dp \\(4\\)"):
        micro_batches(12, 2, 4)


def test_megatron_without_cuda_is_refused():
    with pytest.raises(EngineError, match="needs CUDA"):
        check_engine_runnable("megatron", cuda_available=False)
    check_engine_runnable("torch", cuda_available=False)


def test_megatron_with_an_unsupported_megatron_core_is_refused(monkeypatch):
    import phoenix_hpc.engines.megatron_version as mv

    check_engine_runnable("megatron", cuda_available=True)  # the installed version is supported
    monkeypatch.setattr(mv, "installed_version", lambda: "0.14.0")
    with pytest.raises(EngineError, match=r"megatron-core 0\.14\.0 .*>=0\.16,<0\.20"):
        check_engine_runnable("megatron", cuda_available=True)


def test_grid_must_match_active_slots():
    assert resolve_grid(1, 2, None, 4).dp == 2
    assert resolve_grid(2, 2, 2, 8).world_size == 8
    with pytest.raises(ConfigError, match=r"tp \(1\) x pp \(2\) x dp \(3\) = 6 does not match the 4 active"):
        resolve_grid(1, 2, 3, 4)
    with pytest.raises(ConfigError, match="not divisible"):
        resolve_grid(1, 2, None, 5)


def test_slot_from_env_sources():
    s = slot_from_env({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
                       "SLURM_NNODES": "4", "SLURMD_NODENAME": "nid00003", "SLURM_TOPOLOGY_ADDR": "spine.leaf0.nid00003"})
    assert (s.launcher, s.world_rank, s.world_size, s.local_rank, s.node_id) == ("slurm", 5, 8, 1, 2)
    assert s.is_active(3) and not s.is_active(2)
    o = slot_from_env({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "3"})
    assert (o.launcher, o.world_rank, o.world_size, o.node_id) == ("openmpi", 3, 4, 0)
    p = slot_from_env({"PMIX_RANK": "2"})
    assert (p.launcher, p.world_rank, p.world_size) == ("pmix", 2, None)
    assert check_against_mpi(p, 2, 6).world_size == 6
    with pytest.raises(EngineError, match="MPI says rank 0 of 1"):
        check_against_mpi(s, 0, 1)
    with pytest.raises(EngineError, match="not an integer"):
        slot_from_env({"SLURM_PROCID": "x", "SLURM_NTASKS": "2"})


def test_init_method_std_sets_the_weights_and_the_scaled_residual_projections():
    """Weights ~ N(0, std); attention's and the MLP's output projections N(0, std / sqrt(2 L)), as Megatron-LM's
    scaled init. 2 layers: std / 2."""
    shape = GPTShape(layers=2, hidden_size=128, heads=2, vocab_size=256, seq_length=8, init_method_std=0.006)
    p = dict(GPTStage(shape, 1, 0, seed=5).named_parameters())
    for name, want in (("blocks.0.qkv.weight", 0.006), ("blocks.1.fc.weight", 0.006), ("head.weight", 0.006),
                       ("tok_embed.weight", 0.006), ("blocks.0.proj.weight", 0.003), ("blocks.1.fc_out.weight", 0.003)):
        assert float(p[name].detach().std()) == pytest.approx(want, rel=0.05), name
    default = dict(GPTStage(GPTShape(2, 128, 2, 256, 8), 1, 0, seed=5).named_parameters())
    assert float(default["blocks.0.qkv.weight"].detach().std()) == pytest.approx(0.02, rel=0.05)  # 0.02 unless set
    assert float(default["blocks.0.proj.weight"].detach().std()) == pytest.approx(0.01, rel=0.05)


@pytest.mark.parametrize("model, needle", [
    ({"init_method_std": 0.0}, "model.init_method_std: value 0.0 -- Input should be greater than 0"),
    ({"init_method_std": -0.02}, "model.init_method_std: value -0.02 -- Input should be greater than 0"),
    ({"factory": "m:f", "init_method_std": 0.01},
     "model.init_method_std: 0.01 applies to the built-in GPT only (allowed with model.factory: 0.02"),
])
def test_an_init_method_std_the_engine_cannot_obey_is_refused(model, needle):
    with pytest.raises(ConfigError) as exc:
        parse_model(JobConfig, {"name": "t", "data": {"path": "d"}, "model": model}, source="test")
    assert needle in str(exc.value), str(exc.value)
    assert parse_model(JobConfig, {"name": "t", "data": {"path": "d"}, "model": {"factory": "m:f"}},
                       source="test").model.init_method_std == 0.02


def test_model_init_independent_of_pipeline_split():
    shape = GPTShape(layers=4, hidden_size=16, heads=2, vocab_size=256, seq_length=8)
    whole = dict(GPTStage(shape, 1, 0, seed=5).named_parameters())
    parts = {}
    for st in range(2):
        parts.update(GPTStage(shape, 2, st, seed=5).named_parameters())
    assert whole.keys() == parts.keys()
    assert all(torch.equal(whole[k], parts[k]) for k in whole)
    x = torch.randint(0, 256, (2, 8))
    s0, s1 = GPTStage(shape, 2, 0, seed=5), GPTStage(shape, 2, 1, seed=5)
    assert torch.allclose(GPTStage(shape, 1, 0, seed=5)(x), s1(s0(x)), atol=1e-6)


# --- one-process engine -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("data") / "stdlib"
    prepare_dataset(stdlib_dir(), out, max_bytes=300_000)
    return str(out)


def _cfg(dataset, **training):
    t = dict(steps=12, micro_batch_size=2, global_batch_size=4, lr=3e-3, warmup_steps=2, seed=11) | training
    return JobConfig.model_validate({
        "name": "t", "data": {"path": dataset},
        "model": {"layers": 2, "hidden_size": 32, "heads": 2, "vocab_size": 256, "seq_length": 32},
        "parallelism": {"tp": 1, "pp": 1, "dp": 1}, "training": t,
    })


def _engine(cfg, groups):
    t = cfg.training
    return TorchEngine(cfg, GridCoord(0, 0, 0), groups, TokenSamples(cfg.data.path, cfg.model.seq_length, t.seed, 256))


def test_engine_learns_and_restores_bit_identically(dataset, world1):
    cfg = _cfg(dataset)
    a = _engine(cfg, world1)
    recs = train(a, 4, 128)
    saved = ({n: t.clone() for n, t in a.optimizer_shard()}, {n: t.clone() for n, t in a.param_shard()}, a.envelope())
    recs += train(a, 12, 128)
    losses = [r.loss for r in recs]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.2, losses  # real text: loss falls
    b = _engine(cfg, world1)
    b.load_optimizer_shard(saved[0])
    b.load_param_shard(saved[1])
    b.load_envelope(saved[2])
    assert b.step == 4
    # what a restored member reports as evidence: its loaded shards hash as the state they came from
    from phoenix_hpc.runtime.snapshot import part_hash

    assert part_hash(b.optimizer_shard()) == part_hash(list(saved[0].items()))
    assert part_hash(b.param_shard()) == part_hash(list(saved[1].items()))
    train(b, 12, 128)
    assert b.state_hash() == a.state_hash()
    # an untouched fresh engine differs
    assert _engine(cfg, world1).state_hash() != a.state_hash()


def test_engine_builds_its_gpt_with_model_init_method_std(dataset, world1):
    cfg = _cfg(dataset)
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"hidden_size": 128, "init_method_std": 0.005})})
    w = dict(_engine(cfg, world1).model.named_parameters())["blocks.0.fc.weight"]
    assert float(w.detach().float().std()) == pytest.approx(0.005, rel=0.05)


def test_engine_decays_over_training_lr_decay_steps(dataset, world1):
    """training.lr_decay_steps reaches the engine's update: min_lr from the update after that many steps on
    (Megatron-LM's --lr-decay-iters; the update of step s runs at position s - 1), not at the run's last
    step."""
    cfg = _cfg(dataset, lr_schedule="linear", min_lr=3e-4, lr_decay_steps=4)
    a = _engine(cfg, world1)
    train(a, 3, 128)
    assert a.last_lr == 3e-3  # position 2: the warm-up of 2 done, the peak
    train(a, 4, 128)
    assert a.last_lr == pytest.approx(3e-3 - (3e-3 - 3e-4) * 0.5)  # position 3: halfway from 2 to 4
    train(a, 5, 128)
    assert a.last_lr == pytest.approx(3e-4) and a.envelope()["lr_scheduler"]["decay_steps"] == 4


def test_engine_step_1_of_a_warmup_trains_at_0_as_megatron_lm(dataset, world1):
    """Megatron-LM's iteration 1 runs optimizer.step() at the rate its scheduler set at position 0 (the
    warm-up's start, 0) and only then steps the scheduler: the update leaves the weights as they were; step 2
    is the first that moves them."""
    a = _engine(_cfg(dataset), world1)
    before = {n: t.clone() for n, t in a.param_shard()}
    (rec,) = train(a, 1, 128)
    assert a.last_lr == 0.0 and rec.lr == 0.0
    assert all(torch.equal(t, before[n]) for n, t in a.param_shard())
    (rec,) = train(a, 2, 128)
    assert a.last_lr == rec.lr == pytest.approx(1.5e-3)  # position 1 of the 2-step warm-up to 3e-3
    assert any(not torch.equal(t, before[n]) for n, t in a.param_shard())


def test_rebuilt_engine_on_new_groups_continues_bit_identically(dataset, world1):
    """The rebuild recovery path on one rank: the live state copied to host, the engine torn down, the
    process group of the next generation built, a new engine constructed and loaded; it continues exactly
    as the engine that never stopped."""
    cfg = _cfg(dataset)
    ref = _engine(cfg, world1)
    train(ref, 9, 128)
    a = _engine(cfg, world1)
    train(a, 5, 128)
    saved = ({n: t.detach().to("cpu", copy=True) for n, t in a.optimizer_shard()},
             {n: t.detach().to("cpu", copy=True) for n, t in a.param_shard()}, a.envelope())
    a.teardown()
    a.teardown()  # idempotent
    assert a.model is None and a.optimizer is None and a.groups is None and a.optimizer_shard() == []
    torch.manual_seed(99)  # construction and anything before it may move torch's generator
    dist.destroy_process_group()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    g = dist.group.WORLD
    b = _engine(cfg, ProcessGroups(world=g, dp=g, pp=g, tp=g, generation=1))
    b.load_optimizer_shard(saved[0])
    b.load_param_shard(saved[1])
    b.load_envelope(saved[2])
    train(b, 9, 128)
    assert b.state_hash() == ref.state_hash()


def test_engine_built_for_a_recovery_skips_init_and_refuses_to_train_before_its_params_arrive(dataset, world1):
    """``state_follows``: the built-in GPT is allocated without its random draws; training before the
    parameters are loaded is refused; once loaded (the state of another engine), it continues bit for bit."""
    cfg = _cfg(dataset)
    t = cfg.training
    ref = _engine(cfg, world1)
    train(ref, 3, 128)
    saved = ({n: t_.clone() for n, t_ in ref.optimizer_shard()}, {n: t_.clone() for n, t_ in ref.param_shard()},
             ref.envelope())
    train(ref, 6, 128)
    samples = TokenSamples(cfg.data.path, cfg.model.seq_length, t.seed, 256)
    gen = torch.random.get_rng_state()
    b = TorchEngine(cfg, GridCoord(0, 0, 0), world1, samples, state_follows=True)
    assert torch.equal(torch.random.get_rng_state(), gen)  # nothing was drawn
    assert all(p.device.type == "cpu" for p in b.model.parameters())
    with pytest.raises(EngineError, match="never loaded; refusing to train"):
        b.forward_backward()
    b.load_optimizer_shard(saved[0])
    b.load_param_shard(saved[1])
    b.load_envelope(saved[2])
    train(b, 6, 128)
    assert b.state_hash() == ref.state_hash()


def test_recovery_styles_table_matches_the_engine_classes():
    """The config checks ``resilience.recovery_path`` against a torch-free table; the ranks use the engine
    classes' attributes. They must agree."""
    for name, owns_groups in (("torch", False), ("megatron", True)):
        cls = load_engine_class(name)
        assert ENGINE_RECOVERY_STYLES[name] == (cls.recovery_style, cls.supported_recovery_styles), name
        assert cls.owns_groups is owns_groups, name
    assert recovery_path_of("torch", "auto") == "rebind" and recovery_path_of("torch", "rebuild") == "rebuild"
    assert recovery_path_of("megatron", "auto") == "rebuild"
    assert recovery_path_of("mypkg.engine:Mine", "rebuild") is None  # a user engine: its class decides
    with pytest.raises(ValueError, match=r"recovery_path: value 'rebind' is not supported by engine 'megatron' "
                                         r"\(allowed: auto, rebuild\)"):
        recovery_path_of("megatron", "rebind")
    with pytest.raises(ConfigError, match="resilience.recovery_path: value 'rebind'"):
        parse_model(JobConfig, {"name": "t", "engine": "megatron", "data": {"path": "x"},
                                "resilience": {"recovery_path": "rebind"}}, source="t")


def test_state_shapes_names_and_bad_loads(dataset, world1):
    e = _engine(_cfg(dataset), world1)
    opt, par = e.optimizer_shard(), e.param_shard()
    assert all(n.startswith("opt/pp0/tp0/dp0/") and t.dtype == torch.float32 and t.dim() == 1 for n, t in opt)
    assert {n.rsplit("/", 1)[1] for n, _ in opt} == {"main", "exp_avg", "exp_avg_sq"}
    assert sum(t.numel() for _, t in opt) == 3 * sum(t.numel() for _, t in par)
    assert all(n.startswith("param/pp0/tp0/") for n, _ in par)
    good = {n: t.clone() for n, t in opt}
    with pytest.raises(EngineError, match="missing"):
        e.load_optimizer_shard({k: v for k, v in list(good.items())[1:]})
    k0 = next(iter(good))
    with pytest.raises(EngineError, match="expected"):
        e.load_optimizer_shard(good | {k0: torch.zeros(3)})
    env = e.envelope()
    with pytest.raises(EngineError, match="coord"):
        e.load_envelope(env | {"coord": {"pp": 0, "dp": 1, "tp": 0}})
    with pytest.raises(EngineError, match="rebind"):
        e.rebind(e.groups, GridCoord(0, 1, 0))


def test_engine_rejects_unsupported_settings(dataset, world1):
    cfg = _cfg(dataset)
    bad = cfg.model_copy(update={"model": cfg.model.model_copy(update={"dtype": "float16"})})
    with pytest.raises(EngineError, match="float16"):
        _engine(bad, world1)
    bad = cfg.model_copy(update={"training": cfg.training.model_copy(update={"global_batch_size": 3, "micro_batch_size": 3})})
    e = _engine(bad, world1)  # 3 = 3 x 1: fine with dp=1
    assert e.n_micro == 1
