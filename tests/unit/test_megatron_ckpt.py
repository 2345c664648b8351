"""Megatron-LM checkpoints in and out (engines/megatron_layout.py, engines/megatron_ckpt.py), on CPU.

What runs here: the layout (tracker file, iteration folders), the submit-time check of
``resilience.checkpoint.load_megatron`` (exit-2 problems naming the file or field), the state dict the engine
writes (real megatron-core GPTModel ``sharded_state_dict`` built on CPU, common keys, RNG object) saved with
megatron-core's ``dist_checkpointing.save`` (torch_dist) and loaded back into a freshly built GPTModel with
``dist_checkpointing.load``, and the shapes the check expects against those megatron-core writes.

The engine functions ``save_engine`` / ``load_engine`` run around a real DDP-wrapped GPTModel, with a recording
stand-in for the optimizer: megatron-core's DistributedOptimizer allocates on CUDA, so its sharded state dict,
the optimizer's load and the whole engine round trip (bitwise next step) are the GPU check's
(gpucheck/check_megatron_ckpt.py). megatron-core's torch_dist writer calls ``torch.cuda.synchronize()`` and
allocates one flag on ``torch.cuda.current_device()``, and its DDP allocates its buffers there; on this
CPU-only torch the tests replace those two calls by their CPU equivalents (a no-op, and the CPU device);
everything else is megatron-core's own code.
"""

from __future__ import annotations

import math

import argparse
import json
import os
import warnings
from pathlib import Path

import pytest
import torch

from phoenix_hpc.config.schema import JobConfig
from phoenix_hpc.engines import megatron_ckpt as mck
from phoenix_hpc.engines import megatron_layout as ml

warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine).*")

GPT = {"layers": 2, "hidden_size": 64, "heads": 4, "vocab_size": 256, "seq_length": 32}
LLAMA = {"layers": 2, "hidden_size": 64, "heads": 8, "num_query_groups": 2, "ffn_hidden_size": 176,
         "vocab_size": 256, "seq_length": 32, "position_embedding_type": "rope", "activation": "swiglu",
         "normalization": "RMSNorm", "add_bias_linear": False, "untie_embeddings_and_output_weights": True}


def job(model=None, engine="megatron", steps=20, **ckpt) -> JobConfig:
    return JobConfig.model_validate({"name": "m", "engine": engine, "data": {"path": "d"}, "model": model or GPT,
                                     "training": {"steps": steps, "global_batch_size": 8, "micro_batch_size": 2,
                                                  "warmup_steps": 4, "lr": 1e-3, "min_lr": 1e-4},
                                     "resilience": {"checkpoint": ckpt}})


# --- the layout ------------------------------------------------------------------------------------------
def test_iteration_folders_are_named_as_megatron_lm_names_them():
    assert ml.iter_dir("/c", 100) == Path("/c/iter_0000100")
    assert ml.iter_dir("/c", 1234567) == Path("/c/iter_1234567")
    assert ml.iter_dir("/c", "release") == Path("/c/release")


def test_tracker_file_round_trip_and_refusals(tmp_path):
    with pytest.raises(ValueError, match=r"latest_checkpointed_iteration\.txt does not exist"):
        ml.read_tracker(tmp_path)
    assert ml.write_tracker(tmp_path, 42) == tmp_path / ml.TRACKER
    assert (tmp_path / ml.TRACKER).read_text() == "42" and ml.read_tracker(tmp_path) == 42
    (tmp_path / ml.TRACKER).write_text("release\n")
    assert ml.read_tracker(tmp_path) == "release"
    (tmp_path / ml.TRACKER).write_text("iter_42")
    with pytest.raises(ValueError, match=r"holds 'iter_42'; allowed: an iteration number \(digits\) or 'release'"):
        ml.read_tracker(tmp_path)
    (tmp_path / ml.TRACKER).write_text("4\u00b2")  # str.isdigit() is true for a superscript two; int() refuses it
    with pytest.raises(ValueError, match=r"holds '4\u00b2'; allowed: an iteration number \(digits\) or 'release'"):
        ml.read_tracker(tmp_path)


def test_start_step_is_the_iteration_only_with_optimizer_state():
    assert mck.start_step(100, True, 100) == 100
    assert mck.start_step(100, True, None) == 100
    assert mck.start_step(100, False, 100) == 0  # weights only: a new run from them
    assert mck.start_step("release", True, None) == 0


def test_scheduler_state_counts_samples_as_megatron_lm_does():
    s = mck.scheduler_state(job(), 5)
    assert s == {"max_lr": 1e-3, "lr_warmup_steps": 32, "num_steps": 40, "lr_decay_style": "cosine",
                 "lr_decay_steps": 160, "min_lr": 1e-4, "start_wd": 0.01, "end_wd": 0.01, "wd_incr_style": "constant",
                 "wd_incr_steps": 160}  # the schema's defaults: cosine, weight decay 0.01


def test_args_carry_the_shape_under_megatron_lm_names():
    a = mck.megatron_args(job(LLAMA), dp=4)
    assert isinstance(a, argparse.Namespace)
    assert (a.num_layers, a.hidden_size, a.num_attention_heads, a.num_query_groups, a.ffn_hidden_size) == (2, 64, 8, 2, 176)
    assert a.group_query_attention and a.swiglu and a.untie_embeddings_and_output_weights
    assert not a.add_position_embedding and a.position_embedding_type == "rope" and a.normalization == "RMSNorm"
    assert (a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.data_parallel_size) == (1, 1, 4)
    assert a.ckpt_format == "torch_dist" and a.use_distributed_optimizer
    assert (a.train_iters, a.lr_decay_iters) == (20, 20)  # training.lr_decay_steps unset: training.steps
    assert a.init_method_std == 0.02
    cfg = job(LLAMA)
    cfg = cfg.model_copy(update={"training": cfg.training.model_copy(update={"lr_decay_steps": 16})})
    assert (mck.megatron_args(cfg, dp=4).lr_decay_iters, mck.scheduler_state(cfg, 5)["lr_decay_steps"]) == (16, 128)


# --- the submit-time check without a checkpoint ----------------------------------------------------------
def test_fields_refused_for_another_engine_and_relative_paths(tmp_path):
    p = job(engine="torch", load_megatron=str(tmp_path), save_megatron="ckpts")
    problems = ml.load_problems(p)
    assert any(x.startswith("resilience.checkpoint.load_megatron:") and "engine 'torch'" in x for x in problems)
    assert any(x.startswith("resilience.checkpoint.save_megatron: value 'ckpts' is a relative path") for x in problems)
    assert ml.load_problems(job()) == []


def test_save_megatron_needs_persistent_checkpoints(tmp_path):
    cfg = JobConfig.model_validate({"name": "m", "engine": "megatron", "data": {"path": "d"},
                                    "resilience": {"enabled": False, "checkpoint": {"save_megatron": str(tmp_path)}}})
    assert ml.load_problems(cfg) == [f"resilience.checkpoint.save_megatron: value {str(tmp_path)!r} -- no persistent "
                                     "checkpoint is written with resilience.enabled false; allowed with "
                                     "resilience.enabled true"]


def test_a_directory_without_the_tracker_file_is_refused_naming_it(tmp_path):
    (p,) = ml.load_problems(job(load_megatron=str(tmp_path)))
    assert p.startswith("resilience.checkpoint.load_megatron: ") and str(tmp_path / ml.TRACKER) in p
    assert "does not exist" in p
    (p,) = ml.load_problems(job(load_megatron=str(tmp_path / "nope")))
    assert "is not a directory" in p


def test_a_load_folder_that_is_also_save_megatron_says_how_to_start_from_scratch(tmp_path):
    for root in (tmp_path, tmp_path / "nope"):  # empty, and not there yet: Megatron-LM would start from scratch
        (p,) = ml.load_problems(job(load_megatron=str(root), save_megatron=str(root)))
        assert p.startswith("resilience.checkpoint.load_megatron: ") and "leave out load_megatron" in p
        assert "it is also resilience.checkpoint.save_megatron" in p
    (p,) = ml.load_problems(job(load_megatron=str(tmp_path), save_megatron=str(tmp_path / "other")))
    assert "leave out" not in p


def test_data_on_cluster_leaves_a_load_folder_not_here_to_the_ranks_and_says_what_was_not_checked(tmp_path):
    gone = job(load_megatron=str(tmp_path / "on-the-cluster"))
    assert ml.load_problems(gone, on_cluster=True) == []
    w = ml.load_not_checked(gone, on_cluster=True)
    assert w.startswith(f"resilience.checkpoint.load_megatron: {tmp_path / 'on-the-cluster'} is not a directory here")
    assert all(x in w for x in (ml.TRACKER, "model shape", "learning-rate schedule", "--data-on-cluster"))
    assert ml.load_not_checked(gone) is None and ml.load_not_checked(gone, resuming=True, on_cluster=True) is None
    (p,) = ml.load_problems(gone)
    assert "is not a directory" in p
    # a folder that is here is checked in full, and the fields themselves always
    here = job(load_megatron=str(tmp_path))
    (p,) = ml.load_problems(here, on_cluster=True)
    assert str(tmp_path / ml.TRACKER) in p and ml.load_not_checked(here, on_cluster=True) is None
    (p,) = ml.load_problems(job(load_megatron="rel/ckpt"), on_cluster=True)
    assert "is a relative path" in p


def test_a_tracker_naming_a_missing_iteration_is_refused(tmp_path):
    ml.write_tracker(tmp_path, 7)
    (p,) = ml.load_problems(job(load_megatron=str(tmp_path)))
    assert f"names iteration 7, and {tmp_path / 'iter_0000007'} does not exist" in p


def test_another_backend_is_refused_naming_metadata_json(tmp_path):
    ml.write_tracker(tmp_path, 7)
    d = ml.iter_dir(tmp_path, 7)
    d.mkdir()
    (d / "metadata.json").write_text(json.dumps({"sharded_backend": "zarr"}))
    (p,) = ml.load_problems(job(load_megatron=str(tmp_path)))
    assert "sharded_backend 'zarr'; allowed: torch_dist" in p and str(d / "metadata.json") in p


def test_written_grid_reads_the_rng_object_keys():
    assert ml.written_grid({"model.x", mck.rng_key((1, 4), (0, 2))}) == (2, 4)
    assert ml.written_grid({"model.x"}) is None


# --- real megatron-core on CPU: state dict, save, load ---------------------------------------------------
def _gpt(cfg, seed: int):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer import TransformerConfig

    from phoenix_hpc.engines.megatron_spec import gpt_model_kwargs, layer_spec, transformer_config_kwargs

    torch.manual_seed(seed)
    tc = TransformerConfig(**transformer_config_kwargs(cfg), use_cpu_initialization=True)
    return GPTModel(config=tc, transformer_layer_spec=layer_spec(cfg), **gpt_model_kwargs(cfg))


@pytest.fixture(scope="module")
def world():
    import torch.distributed as dist

    from phoenix_hpc.engines.megatron_parallel import destroy_parallel_state, init_parallel_state

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    init_parallel_state(1, 1, timeout_s=60.0)
    yield dist.group.WORLD
    destroy_parallel_state()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def saved(world, tmp_path_factory):
    """Checkpoints of a GPT- and a Llama-shaped GPTModel (no optimizer: megatron-core's DistributedOptimizer
    needs CUDA) written by :func:`mck.state_dict` + :func:`mck.save`, as the engine writes them."""
    mp = pytest.MonkeyPatch()
    mp.setattr(torch.cuda, "synchronize", lambda *a, **k: None)  # CPU tensors: nothing to wait for
    mp.setattr(torch.cuda, "current_device", lambda: "cpu")  # megatron-core's failure flag, reduced over gloo
    out = {}
    try:
        for name, model in (("gpt", GPT), ("llama", LLAMA)):
            cfg = job(model)
            gpt = _gpt(cfg, seed=1)
            root = tmp_path_factory.mktemp(name)
            torch.manual_seed(99)
            rng = mck.rng_object([mck.rng_states({})], (0, 1), (0, 1), 0)
            rng_cpu = torch.get_rng_state().clone()
            sd = mck.state_dict(gpt, None, cfg=cfg, iteration=7, dp=1, rng=rng)
            mck.save(sd, root, 7)
            out[name] = {"cfg": cfg, "root": root, "model": gpt, "rng_cpu": rng_cpu}
        # optimizer state as a checkpoint of Megatron-LM's distributed optimizer names it, written at (tp, pp) =
        # (1, 2): only what the submit check and the start step read of it (the real one needs CUDA)
        from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor

        cfg = job(GPT, steps=40)  # the schedule the checkpoint's opt_param_scheduler records: decay over 40
        root = tmp_path_factory.mktemp("with_opt")
        sd = mck.state_dict(_gpt(cfg, seed=1), None, cfg=cfg, iteration=30, dp=1,
                            rng=mck.rng_object([mck.rng_states({})], (0, 2), (0, 1), 0))
        sd["optimizer"] = {"param_state": ShardedTensor.from_rank_offsets("optimizer.distributed.dp_group_idx_0.x",
                                                                          torch.zeros(4)),
                           "rest": ShardedObject("optimizer.distributed.dp_group_idx_0.y", {"a": 1}, (1,), (0,))}
        from megatron.core import dist_checkpointing

        d = ml.iter_dir(root, 30)
        d.mkdir()  # one process writes stage 0 of 2: the other stage's rng object is absent, as it may be
        dist_checkpointing.save(sd, str(d), validate_access_integrity=False, content_metadata=mck.content_metadata())
        ml.write_tracker(root, 30)
        out["with_opt"] = {"cfg": cfg, "root": root}
    finally:
        mp.undo()
    return out


def test_saved_layout_is_megatron_lms(saved):
    from megatron.core import dist_checkpointing

    root = saved["gpt"]["root"]
    assert (root / ml.TRACKER).read_text() == "7"
    d = root / "iter_0000007"
    assert json.loads((d / "metadata.json").read_text())["sharded_backend"] == "torch_dist"
    assert (d / ".metadata").is_file() and list(d.glob("__*_*.distcp")) and (d / "common.pt").is_file()
    common = dist_checkpointing.load_common_state_dict(str(d))
    assert common["iteration"] == 7 and common["checkpoint_version"] == 3.0
    assert common["args"].num_layers == 2 and common["args"].hidden_size == 64
    assert common["opt_param_scheduler"]["num_steps"] == 7 * 8
    assert dist_checkpointing.load_content_metadata(str(d))["distrib_optim_sharding_type"] == "dp_reshardable"
    _, it, with_opt, keys = mck.checkpoint_folder(root)
    assert it == 7 and not with_opt and mck.rng_key((0, 1), (0, 1)) in keys
    assert ml.start_iteration(root) == 0  # no optimizer state: a new run from these weights


@pytest.mark.parametrize("name", ["gpt", "llama"])
def test_expected_shapes_are_those_megatron_core_writes(saved, name):
    s = saved[name]
    shapes = ml.shape_of_checkpoint(s["root"] / "iter_0000007")
    for key, want in ml.expected_shapes(s["cfg"].model).items():
        assert shapes.get(key) == want, key
    assert ml.load_problems(job(s["cfg"].model.model_dump(), load_megatron=str(s["root"]))) == []


def test_a_checkpoint_of_another_shape_is_refused_naming_the_fields(saved):
    root = str(saved["gpt"]["root"])
    problems = ml.load_problems(job({**GPT, "hidden_size": 128, "layers": 3}, load_megatron=root))
    assert problems and all(p.startswith("resilience.checkpoint.load_megatron: ") for p in problems)
    qkv = next(p for p in problems if ml.QKV in p)
    assert "(2, 192, 64) there, (3, 384, 128) for this config" in qkv and "model.layers" in qkv
    problems = ml.load_problems(job(LLAMA, load_megatron=root))
    said = " ".join(problems)
    for fld in ("model.normalization", "model.add_bias_linear",
                "model.activation", "model.position_embedding_type"):
        assert fld in said, fld


def test_load_into_a_fresh_gpt_model_gives_the_saved_weights_and_rng(saved):
    from megatron.core import dist_checkpointing

    for s in (saved["gpt"], saved["llama"]):
        fresh = _gpt(s["cfg"], seed=2)
        before = {k: v.clone() for k, v in fresh.state_dict().items() if torch.is_tensor(v)}
        want = {k: v for k, v in s["model"].state_dict().items() if torch.is_tensor(v)}
        assert any(not torch.equal(before[k], want[k]) for k in want)  # a different start
        d, it, with_opt, keys = mck.checkpoint_folder(s["root"])
        req = mck.load_request(fresh, None, d, keys, pp=(0, 1), tp=(0, 1), dp_rank=0)
        loaded = dist_checkpointing.load(req, str(d))
        fresh.load_state_dict(loaded["model"])
        got = {k: v for k, v in fresh.state_dict().items() if torch.is_tensor(v)}
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
        assert loaded["iteration"] == 7
        torch.manual_seed(5)
        mck.restore_rng(loaded["rng_state"][0], torch.device("cpu"))
        assert torch.equal(torch.get_rng_state(), s["rng_cpu"])


def test_rng_is_not_requested_at_another_grid(saved):
    s = saved["gpt"]
    d, _, _, keys = mck.checkpoint_folder(s["root"])
    req = mck.load_request(_gpt(s["cfg"], 3), None, d, keys, pp=(0, 2), tp=(0, 1), dp_rank=0)
    assert "rng_state" not in req and "model" in req and "optimizer" not in req


def test_submit_refuses_a_bad_checkpoint_with_exit_2(saved, tmp_path, monkeypatch):
    """Through ``phoenix submit --dry-run``: exit 2, the file and field named, no script."""
    import yaml
    from click.testing import CliRunner

    from phoenix_hpc.cli.main import cli

    empty = tmp_path / "empty"
    empty.mkdir()
    for load, want in ((empty, ml.TRACKER), (saved["gpt"]["root"], ml.QKV)):
        cfg = {"name": "m", "engine": "megatron", "data": {"path": str(tmp_path / "d")},
               "model": {**GPT, "layers": 4}, "resilience": {"checkpoint": {"load_megatron": str(load)}}}
        (tmp_path / "job.yaml").write_text(yaml.safe_dump(cfg))
        monkeypatch.chdir(tmp_path)
        r = CliRunner().invoke(cli, ["submit", "--site", "perlmutter", "job.yaml", "--dry-run", "--data-on-cluster"])
        assert r.exit_code == 2, r.output
        assert "resilience.checkpoint.load_megatron" in r.output and want in r.output
        assert "#SBATCH" not in r.output and "Traceback" not in r.output
        assert sorted(f.name for f in tmp_path.iterdir()) == ["empty", "job.yaml"]  # nothing written


def test_optimizer_state_makes_the_iteration_the_start_step_and_pins_tp_pp(saved):
    root = saved["with_opt"]["root"]
    _, it, with_opt, keys = mck.checkpoint_folder(root)
    assert it == 30 and with_opt and ml.written_grid(keys) == (1, 2)
    assert ml.start_iteration(root) == 30
    def with_steps(steps):
        return job(GPT, steps=steps, load_megatron=str(root))

    (p,) = ml.load_problems(with_steps(40))  # the job's (tp, pp) is (1, 1); the schedule is the checkpoint's
    assert p.startswith("resilience.checkpoint.load_megatron: ") and "written at (tp, pp) = (1, 2)" in p
    assert "parallelism.tp = 1 and parallelism.pp = 2" in p
    problems = ml.load_problems(with_steps(30))
    assert len(problems) == 3 and any("is at iteration 30, and the run continues from it to training.steps = 30" in x
                                      and "allowed: training.steps > 30" in x for x in problems), problems
    assert any("opt_param_scheduler.lr_decay_steps is 320 there and 240 for this config" in x for x in problems)


def test_persist_starts_from_the_megatron_checkpoint_only_without_a_checkpoint_of_its_own(saved, tmp_path, monkeypatch):
    """launch/persist.py: ``start_step`` and ``restore_latest`` (the load itself, which needs the CUDA engine,
    replaced by a recorder: what is tested is which checkpoint is chosen)."""
    from phoenix_hpc.engines import megatron_ckpt
    from phoenix_hpc.launch import persist
    from phoenix_hpc.recovery import checkpoint

    root = str(saved["with_opt"]["root"])
    cfg = job(GPT, load_megatron=root)
    calls = []
    monkeypatch.setattr(megatron_ckpt, "load_engine", lambda engine, d: calls.append(d) or 30)
    monkeypatch.setattr(persist, "_rank", lambda groups: 0)
    assert persist.start_step(cfg, tmp_path) == 30
    assert persist.restore_latest(object(), None, cfg, tmp_path) == 30 and calls == [root]
    log = [json.loads(x) for x in (tmp_path / "ranks" / "rank0.persist.jsonl").read_text().splitlines()]
    assert log[-1]["event"] == "load_megatron" and log[-1]["step"] == 30 and log[-1]["dir"] == root
    assert persist.start_step(job(GPT), tmp_path) == 0  # without load_megatron: nothing
    # a run with a complete checkpoint of its own resumes from it, not from the Megatron-LM one
    monkeypatch.setattr(checkpoint, "load_checkpoint", lambda engine, r, group, step: step)
    ckpts = tmp_path / "checkpoints"
    from phoenix_hpc.recovery.ckpt_files import mark_complete

    ckpts.mkdir()
    (ckpts / "step_00000040").mkdir()
    mark_complete(ckpts, 40, "dcp")
    assert persist.start_step(cfg, tmp_path) == 40
    groups = argparse.Namespace(world=None)
    assert persist.restore_latest(object(), groups, cfg, tmp_path) == 40 and calls == [root]


# --- the engine functions (save_engine / load_engine) around a real DDP-wrapped GPTModel ----------------
class RecordingOptimizer:
    """Stands in for megatron-core's DistributedOptimizer, which cannot be built without CUDA: one sharded
    tensor of optimizer state (or none), the param groups' rates in the common state (as the real one writes
    its ``optimizer.param_groups``), and a record of the calls load_engine makes."""

    def __init__(self, params, state: torch.Tensor | None):
        self.state, self.loaded, self.reloaded = state, None, False
        self.optimizer = torch.optim.Adam(params)  # what ensure_step_entries walks (dist_opts[i].optimizer)

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def sharded_state_dict(self, model_sd, is_loading=False, metadata=None):
        from megatron.core.dist_checkpointing.mapping import ShardedTensor

        assert metadata["distrib_optim_sharding_type"] == mck.SHARDING
        if self.state is None:
            return {}
        return {"param_state": ShardedTensor.from_rank_offsets("optimizer.state.param_state", self.state),
                "optimizer": {"param_groups": [{"lr": g["lr"]} for g in self.param_groups]}}

    def load_state_dict(self, sd):
        self.loaded = sd

    def reload_model_params(self):
        self.reloaded = True


def _engine(cfg, seed: int, state, step: int = 0):
    from megatron.core import tensor_parallel
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    from phoenix_hpc.engines.base import GridCoord

    gpt = _gpt(cfg, seed)
    ddp = DistributedDataParallel(gpt.config, DistributedDataParallelConfig(use_distributed_optimizer=True), gpt)
    opt = RecordingOptimizer(gpt.parameters(), state)
    return argparse.Namespace(cfg=cfg, coord=GridCoord(pp=0, dp=0, tp=0), pp=1, tp=1, dp=1, model=ddp, optimizer=opt,
                              dist_opts=[opt], _mc={"tensor_parallel": tensor_parallel}, device=torch.device("cpu"),
                              groups=None, step=step, data_position=step * 8, last_lr=0.0)


@pytest.mark.parametrize("with_state", [True, False])
def test_save_engine_then_load_engine(world, tmp_path, monkeypatch, with_state):
    from megatron.core import dist_checkpointing

    from phoenix_hpc.engines.schedule import lr_for

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    cfg = job(GPT)
    state = torch.arange(6, dtype=torch.float32) if with_state else None
    a = _engine(cfg, seed=1, state=state, step=12)
    torch.manual_seed(77)
    rng = torch.get_rng_state().clone()
    assert mck.save_engine(a, tmp_path) == tmp_path / "iter_0000012"
    assert (tmp_path / ml.TRACKER).read_text() == "12"
    b = _engine(cfg, seed=2, state=torch.zeros(6) if with_state else None)
    torch.manual_seed(3)
    step = mck.load_engine(b, tmp_path)
    want = {k: v for k, v in a.model.module.state_dict().items() if torch.is_tensor(v)}
    got = {k: v for k, v in b.model.module.state_dict().items() if torch.is_tensor(v)}
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert torch.equal(torch.get_rng_state(), rng)
    t = cfg.training
    if with_state:  # optimizer state and iteration: the run continues at step 12
        assert step == b.step == 12 and b.data_position == 12 * t.global_batch_size and not b.optimizer.reloaded
        assert torch.equal(b.optimizer.loaded["param_state"], state)
        # iteration 12 trained at the rate of position 11 (cosine from 4 to 20, lr 1e-3, min_lr 1e-4); the next
        # update at position 12, where Megatron-LM's scheduler stands after loading num_steps = 12 x 8
        assert b.last_lr == pytest.approx(1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * 7 / 16)), abs=1e-15)
        assert lr_for(t, 13) == pytest.approx(1e-4 + 0.9e-3 * 0.5 * (1 + math.cos(math.pi * 8 / 16)), abs=1e-15)
        common = dist_checkpointing.load_common_state_dict(str(tmp_path / "iter_0000012"))
        assert common["opt_param_scheduler"]["num_steps"] == 12 * t.global_batch_size
        # the written param groups hold the next update's rate, as Megatron-LM's saved iteration 12 does
        assert [g["lr"] for g in common["optimizer"]["optimizer"]["param_groups"]] == [lr_for(t, 13)]
    else:  # weights only: step 0, the fp32 main params taken from the loaded weights
        assert step == b.step == 0 and b.data_position == 0 and b.optimizer.reloaded and b.optimizer.loaded is None


def test_load_engine_names_the_field_for_a_directory_without_tracker(world, tmp_path, monkeypatch):
    from phoenix_hpc.errors import EngineError

    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")  # DDP's buffers

    with pytest.raises(EngineError, match=r"^resilience\.checkpoint\.load_megatron: .*latest_checkpointed_iteration"):
        mck.load_engine(_engine(job(GPT), 1, None), tmp_path)


# --- the checkpoint's learning-rate scheduler against the config's schedule (submit) -----------------------
def _opt_job(root, **training):
    cfg = job(GPT, steps=40, load_megatron=str(root))
    return cfg.model_copy(update={"training": cfg.training.model_copy(update=training)})


def _scheduler_problems(problems):
    return [p for p in problems if "opt_param_scheduler." in p]


def test_the_same_schedule_says_nothing(saved):
    assert _scheduler_problems(ml.load_problems(_opt_job(saved["with_opt"]["root"]))) == []


@pytest.mark.parametrize("change, field, there, here, allowed", [
    ({"lr": 2e-3}, "max_lr", "0.001", "0.002", "training.lr = 0.001"),
    ({"min_lr": 0.0}, "min_lr", "0.0001", "0.0", "training.min_lr = 0.0001"),
    ({"warmup_steps": 10}, "lr_warmup_steps", "32", "80", "training.warmup_steps = 4"),
    ({"steps": 50}, "lr_decay_steps", "320", "400", "training.steps = 40"),
    ({"steps": 50, "lr_decay_steps": 30}, "lr_decay_steps", "320", "240", "training.lr_decay_steps = 40"),
    ({"lr_schedule": "linear"}, "lr_decay_style", "'cosine'", "'linear'", "training.lr_schedule = cosine"),
    ({"weight_decay": 0.1}, "start_wd", "0.01", "0.1", "training.weight_decay = 0.01"),
])
def test_a_schedule_that_differs_is_refused_naming_file_field_values_and_change(saved, change, field, there, here,
                                                                                 allowed):
    root = saved["with_opt"]["root"]
    (p,) = _scheduler_problems(ml.load_problems(_opt_job(root, **change)))
    common = root / "iter_0000030" / "common.pt"
    assert p.startswith(f"resilience.checkpoint.load_megatron: {common}: opt_param_scheduler.{field} is {there} "
                        f"there and {here} for this config"), p
    assert f"allowed: {allowed}" in p


def test_another_global_batch_size_moves_warmup_decay_and_position(saved):
    problems = _scheduler_problems(ml.load_problems(_opt_job(saved["with_opt"]["root"], global_batch_size=16)))
    said = {p.split("opt_param_scheduler.")[1].split(" ")[0]: p for p in problems}
    assert set(said) == {"lr_warmup_steps", "lr_decay_steps", "num_steps"}, problems
    assert "num_steps is 240 there and 480 for this config" in said["num_steps"]
    assert "allowed: training.global_batch_size = 8" in said["num_steps"]


def test_the_scheduler_is_read_without_the_tensor_files(saved, tmp_path):
    """Submit reads the tracker, .metadata and common.pt only: the same check with every data file gone."""
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(saved["with_opt"]["root"], root)
    data = list((root / "iter_0000030").glob("*.distcp"))
    assert data
    for f in data:
        f.unlink()
    (p,) = _scheduler_problems(ml.load_problems(_opt_job(root, lr=5e-4)))
    assert "opt_param_scheduler.max_lr is 0.001 there and 0.0005 for this config" in p


def test_a_checkpoint_without_optimizer_state_starts_a_new_schedule(saved):
    cfg = job(GPT, load_megatron=str(saved["gpt"]["root"]))  # weights only: step 0, the config's schedule
    cfg = cfg.model_copy(update={"training": cfg.training.model_copy(update={"lr": 5e-2})})
    assert ml.load_problems(cfg) == []


def test_an_unreadable_common_state_is_refused_naming_it(saved, tmp_path):
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(saved["with_opt"]["root"], root)
    common = root / "iter_0000030" / "common.pt"
    common.write_bytes(b"not a torch file")
    (p,) = [x for x in ml.load_problems(_opt_job(root)) if "common.pt" in x]
    assert p.startswith(f"resilience.checkpoint.load_megatron: {common} cannot be read (")
    common.unlink()
    (p,) = [x for x in ml.load_problems(_opt_job(root)) if "common.pt" in x]
    assert p == f"resilience.checkpoint.load_megatron: {common} does not exist (a torch_dist checkpoint folder " \
                "holds one: its common state)"


def test_submit_refuses_another_schedule_with_exit_2(saved, tmp_path, monkeypatch):
    import yaml
    from click.testing import CliRunner

    from phoenix_hpc.cli.main import cli

    cfg = {"name": "m", "engine": "megatron", "data": {"path": str(tmp_path / "d")}, "model": GPT,
           "parallelism": {"pp": 2},
           "training": {"steps": 40, "global_batch_size": 8, "micro_batch_size": 2, "warmup_steps": 4, "lr": 3e-3,
                        "min_lr": 1e-4},
           "resilience": {"checkpoint": {"load_megatron": str(saved["with_opt"]["root"])}}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(cfg))
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli, ["submit", "--site", "perlmutter", "job.yaml", "--dry-run", "--data-on-cluster"])
    assert r.exit_code == 2, r.output
    flat = " ".join(r.output.split())
    assert "common.pt: opt_param_scheduler.max_lr is 0.001 there and 0.003 for this config" in flat, r.output
    assert "allowed: training.lr = 0.001" in flat and "#SBATCH" not in r.output and "Traceback" not in r.output
    cfg["training"]["lr"] = 1e-3
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(cfg))
    r = CliRunner().invoke(cli, ["submit", "--site", "perlmutter", "job.yaml", "--dry-run", "--data-on-cluster"])
    assert "opt_param_scheduler" not in r.output, r.output


def test_a_submit_and_a_load_read_the_metadata_once(saved, monkeypatch):
    """.metadata is read once by the submit check (shapes, the grid and the optimizer's layout from one read)
    and once by the engine's load (checkpoint_folder)."""
    from torch.distributed.checkpoint import FileSystemReader

    reads = []
    real = FileSystemReader.read_metadata

    def counted(self):
        reads.append(self.path)
        return real(self)

    monkeypatch.setattr(FileSystemReader, "read_metadata", counted)
    root = saved["with_opt"]["root"]
    problems = ml.load_problems(job(GPT, steps=40, load_megatron=str(root)))  # at (1, 1): every branch runs
    assert any("written at (tp, pp) = (1, 2)" in p for p in problems)
    assert len(reads) == 1, reads
    reads.clear()
    mck.checkpoint_folder(root)
    assert len(reads) == 1, reads


def test_a_resumed_run_does_not_check_the_megatron_checkpoint_it_no_longer_loads(saved, tmp_path, monkeypatch):
    """``phoenix submit --resume``: the run loads its own newest checkpoint, so a changed schedule (or any
    other difference from load_megatron's checkpoint) is not refused; a new submit of the same config is."""
    import yaml

    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # test_resume_cli imports test_submit_cli by name
    from tests.unit.test_resume_cli import make_run
    from tests.unit.test_submit_cli import invoke

    monkeypatch.chdir(tmp_path)
    rd = make_run(tmp_path, steps_done=(30,), dp=4)  # its own checkpoint at (tp, pp, dp) = (1, 2, 4)
    (rd / "job.json").write_text(json.dumps({"job_id": "123", "site": "perlmutter"}))
    cfg = yaml.safe_load((rd / "config.yaml").read_text())
    cfg.update(engine="megatron", model=GPT)
    cfg["parallelism"] = {"tp": 1, "pp": 2}
    cfg["resources"].update(nodes=2, spares=0)  # 8 GPUs: dp 4
    cfg["training"].update(steps=40, global_batch_size=8, micro_batch_size=1, warmup_steps=4, lr=3e-3, min_lr=1e-4)
    cfg.setdefault("resilience", {})["mode"] = "checkpoint-restart"  # no replica placement to satisfy here
    cfg["resilience"].setdefault("checkpoint", {})["load_megatron"] = str(saved["with_opt"]["root"])
    (rd / "config.yaml").write_text(yaml.safe_dump(cfg))
    (tmp_path / "new.yaml").write_text(yaml.safe_dump({k: v for k, v in cfg.items() if k != "run_dir"}))
    r = invoke("--site", "perlmutter", "new.yaml", "--dry-run", "--data-on-cluster")
    assert r.exit_code == 2 and "opt_param_scheduler.max_lr" in r.output, r.output
    r = invoke("--resume", rd, "--dry-run", "--data-on-cluster")
    assert "opt_param_scheduler" not in r.output, r.output
    assert r.exit_code == 0, r.output


def test_a_save_folder_holding_a_tracker_this_job_would_replace_is_refused(tmp_path):
    ml.write_tracker(tmp_path, 100)  # Megatron-LM wrote a checkpoint there after the conversion
    cfg = job(path=str(tmp_path), save_megatron=str(tmp_path))
    (p,) = ml.overwrite_problems(cfg, resuming=False, has_own_checkpoint=False)
    assert p.startswith(f"resilience.checkpoint.save_megatron: {tmp_path} already holds "
                        "latest_checkpointed_iteration.txt (iteration 100)")
    assert f"resilience.checkpoint.load_megatron: {tmp_path}" in p
    # resumed, or continuing from a complete checkpoint of its own: the tracker is the run's own
    assert ml.overwrite_problems(cfg, resuming=True, has_own_checkpoint=False) == []
    assert ml.overwrite_problems(cfg, resuming=False, has_own_checkpoint=True) == []
    # continuing from that very folder, or writing into an empty one: nothing is replaced
    cont = job(path=str(tmp_path), save_megatron=str(tmp_path), load_megatron=str(tmp_path))
    assert ml.overwrite_problems(cont, resuming=False, has_own_checkpoint=False) == []
    assert ml.overwrite_problems(job(save_megatron=str(tmp_path / "empty")), False, False) == []


def test_submit_refuses_to_replace_a_tracker_and_accepts_a_run_that_continues_there(tmp_path, monkeypatch):
    import yaml
    from click.testing import CliRunner

    from phoenix_hpc.cli.main import cli
    from phoenix_hpc.recovery.ckpt_files import mark_complete

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    ml.write_tracker(ckpt, 100)
    monkeypatch.chdir(tmp_path)
    cfg = {"name": "m", "engine": "megatron", "data": {"path": str(tmp_path / "d")}, "model": GPT,
           "resources": {"nodes": 2},
           "resilience": {"checkpoint": {"path": str(ckpt), "save_megatron": str(ckpt)}}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(cfg))
    args = ["submit", "--site", "perlmutter", "job.yaml", "--dry-run", "--data-on-cluster"]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 2 and "already holds latest_checkpointed_iteration.txt (iteration 100)" in r.output
    (ckpt / "step_00000040").mkdir()
    mark_complete(ckpt, 40, "full")  # the job's own checkpoint there: it continues from it
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
