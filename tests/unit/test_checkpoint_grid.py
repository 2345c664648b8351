"""A persistent checkpoint written at another dp (a run that shrank) is loaded at the job's grid: the
compatibility rules (pure) and the re-partitioning load, in one process (world of 1 over gloo) of checkpoints
written at dp = 2 and loaded at dp = 1, as :func:`phoenix_hpc.recovery.checkpoint.load_checkpoint` does at a
resumed job's start. The slices at dp = 2 are cut by the shrink's own re-partitioning
(:meth:`phoenix_hpc.engines.zero.ShardedAdamW.load_resharded`)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist

from phoenix_hpc.config.schema import JobConfig
from phoenix_hpc.data.indexed import TokenSamples
from phoenix_hpc.engines.base import GridCoord, ProcessGroups
from phoenix_hpc.engines.torch_engine import TorchEngine
from phoenix_hpc.engines.zero import ShardedAdamW
from phoenix_hpc.errors import RecoveryError
from phoenix_hpc.launch.loop import train
from phoenix_hpc.recovery.checkpoint import (dcp_layout, load_checkpoint, mark_complete, step_dir,
                                             write_snapshot_shard)
from phoenix_hpc.recovery.ckpt_compat import describe_changes, grid_problem, model_changes, model_record

STEP = 5


# --- pure rules ------------------------------------------------------------------------------------------
def test_another_dp_loads_with_an_engine_that_re_partitions_and_another_tp_or_pp_never():
    assert grid_problem(7, (1, 2, 1), (1, 2, 2), "torch") is None
    assert grid_problem(7, (1, 2, 2), (1, 2, 2), "megatron") is None
    why = grid_problem(7, (1, 2, 1), (1, 2, 2), "megatron")
    assert "cannot re-partition" in why and "parallelism.dp = 1" in why
    why = grid_problem(7, (1, 2, 2), (1, 4, 1), "torch")
    assert "(1, 2, 2)" in why and "(1, 4, 1)" in why and "tp and pp must be" in why
    assert grid_problem(7, None, (1, 1, 2), "torch") is None


def test_model_changes_name_each_field_with_both_values():
    a = {"engine": "torch", "model": {"hidden_size": 128, "dtype": "float32", "options": {}}}
    b = {"engine": "torch", "model": {"hidden_size": 256, "dtype": "bfloat16", "options": {}}}
    ch = model_changes(a, b)
    assert ch == [("model.dtype", "float32", "bfloat16"), ("model.hidden_size", 128, 256)]
    assert describe_changes(ch, "the run", "new.yaml") == (
        "model.dtype: 'bfloat16' in new.yaml, the run has 'float32'; model.hidden_size: 256 in new.yaml, "
        "the run has 128")
    assert model_changes(a, a) == []
    newer = {"engine": "torch", "model": {**a["model"], "hidden_dropout": 0.0}}  # a field added since
    assert model_changes(a, newer) == [("model.hidden_dropout", None, 0.0)]
    assert model_changes(a, newer, recorded_only=True) == []


# --- the re-partitioning load ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dataset(small_dataset):
    return small_dataset


def _cfg(dataset, dp=1):
    return JobConfig.model_validate({
        "name": "t", "data": {"path": dataset},
        "model": {"layers": 2, "hidden_size": 32, "heads": 2, "vocab_size": 256, "seq_length": 32},
        "parallelism": {"tp": 1, "pp": 1, "dp": dp},
        "training": dict(steps=10, micro_batch_size=2, global_batch_size=4, lr=3e-3, warmup_steps=2, seed=11),
    })


def _engine(cfg, groups):
    return TorchEngine(cfg, GridCoord(0, 0, 0), groups, TokenSamples(cfg.data.path, cfg.model.seq_length, 11, 256))


def _cut(engine, dp):
    """The engine's optimizer state cut over ``dp`` ranks, as a shrink re-partitions it: ``[{name: tensor}]``
    per DP index (names of that index)."""
    own = {n: t.clone() for n, t in engine.optimizer_shard()}
    out = []
    for d in range(dp):
        z = ShardedAdamW(list(engine.model.named_parameters()), d, dp)
        z.load_resharded(own, 1, lambda o: f"opt/pp0/tp0/dp{o}")
        out.append({n: t.clone() for n, t in z.named_state(f"opt/pp0/tp0/dp{d}")})
    return out


def _envelope_at(engine, d, dp):
    return {**engine.envelope(), "coord": {"pp": 0, "dp": d, "tp": 0}, "grid": {"tp": 1, "pp": 1, "dp": dp}}


def _trained(cfg, groups):
    a = _engine(cfg, groups)
    train(a, STEP, 128)
    return a


def test_a_snapshot_written_at_dp_2_loads_at_dp_1_as_the_state_it_was_cut_from(dataset, world1, tmp_path):
    cfg = _cfg(dataset)
    a = _trained(cfg, world1)
    params = {n: t.clone() for n, t in a.param_shard()}
    files = {}
    for d, opt in enumerate(_cut(a, 2)):
        info = write_snapshot_shard(tmp_path, STEP, GridCoord(0, d, 0), {**opt, **params}, _envelope_at(a, d, 2))
        files[info["file"]] = {"sha256": info["sha256"], "bytes": info["bytes"]}
    mark_complete(tmp_path, STEP, "snapshot", grid=[1, 1, 2], files=files)
    b = _engine(cfg, world1)
    assert load_checkpoint(b, tmp_path, world1.world) == STEP
    assert b.state_hash() == a.state_hash() and b.envelope()["grid"] == {"tp": 1, "pp": 1, "dp": 1}
    assert b.data_position == a.data_position == STEP * 4  # the global batch and sample order of the run
    train(a, 10, 128)
    train(b, 10, 128)
    assert b.state_hash() == a.state_hash()


def test_a_dcp_checkpoint_written_at_dp_2_loads_at_dp_1_and_a_short_data_file_is_named(dataset, world1, tmp_path):
    import torch.distributed.checkpoint as dcp

    cfg = _cfg(dataset)
    a = _trained(cfg, world1)
    sd = {n: t.clone() for n, t in a.param_shard()}
    for d, opt in enumerate(_cut(a, 2)):
        sd.update(opt)
        sd[f"envelope/pp0/tp0/dp{d}"] = json.dumps(_envelope_at(a, d, 2), sort_keys=True)
    dcp.save(sd, checkpoint_id=str(step_dir(tmp_path, STEP)), process_group=world1.world)
    mark_complete(tmp_path, STEP, "dcp")  # as written before the marker recorded the grid
    assert dcp_layout(step_dir(tmp_path, STEP)) == ((1, 1, 2), [])
    b = _engine(cfg, world1)
    assert load_checkpoint(b, tmp_path, world1.world) == STEP
    assert b.state_hash() == a.state_hash()
    data = sorted(step_dir(tmp_path, STEP).glob("*.distcp"))[0]
    data.write_bytes(data.read_bytes()[:-10])
    _, problems = dcp_layout(step_dir(tmp_path, STEP))
    assert len(problems) == 1 and data.name in problems[0] and "its index needs" in problems[0], problems
    (step_dir(tmp_path, STEP) / ".metadata").write_bytes(b"not a pickle")
    grid, problems = dcp_layout(step_dir(tmp_path, STEP))
    assert grid is None and ".metadata cannot be read" in problems[0], problems


def test_a_checkpoint_of_another_pp_is_refused_at_load(dataset, world1, tmp_path):
    cfg = _cfg(dataset)
    a = _trained(cfg, world1)
    info = write_snapshot_shard(tmp_path, STEP, GridCoord(0, 0, 0), {**dict(a.optimizer_shard()),
                                                                     **dict(a.param_shard())}, a.envelope())
    mark_complete(tmp_path, STEP, "snapshot", grid=[1, 2, 1], files={info["file"]: info})
    with pytest.raises(RecoveryError, match=r"written for grid \(tp, pp, dp\) = \(1, 2, 1\)"):
        load_checkpoint(_engine(cfg, world1), tmp_path, world1.world)


def test_the_model_record_is_the_engine_and_the_model_section(dataset):
    rec = model_record(_cfg(dataset))
    assert rec["engine"] == "torch" and rec["model"]["hidden_size"] == 32 and rec["model"]["dtype"] == "float32"


# --- the other way: a checkpoint of dp = 1 (a run that shrank) loaded by a job of dp = 2 ------------------
def _grow_worker(rank: int, root: str, dataset: str, out: str) -> None:
    """One of the two ranks of a dp = 2 job (gloo): load the newest checkpoint under ``root``, write what it
    holds then to ``out/rank{rank}.pt``, train two more steps."""
    from phoenix_hpc.recovery.checkpoint import load_checkpoint as load

    dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=rank, world_size=2)
    try:
        g = dist.group.WORLD
        singles = [dist.new_group([r]) for r in range(2)]
        groups = ProcessGroups(world=g, dp=g, pp=singles[rank], tp=singles[rank], generation=0)
        cfg = _cfg(dataset, dp=2)
        e = TorchEngine(cfg, GridCoord(0, rank, 0), groups, TokenSamples(dataset, cfg.model.seq_length, 11, 256))
        step = load(e, root, g)
        z = e.optimizer
        torch.save({"step": step, "position": e.data_position, "lr": e.last_lr, "grid": e.envelope()["grid"],
                    "params": {n: t.clone() for n, t in e.param_shard()},
                    **{k: getattr(z, k).clone() for k in ("main", "exp_avg", "exp_avg_sq")}}, f"{out}/rank{rank}.pt")
        train(e, step + 2, 128)
    finally:
        dist.destroy_process_group()


def test_a_dcp_checkpoint_written_at_dp_1_is_re_partitioned_over_dp_2(dataset, tmp_path):
    import torch.multiprocessing as mp

    from phoenix_hpc.recovery.checkpoint import save_checkpoint

    cfg = _cfg(dataset)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        g = dist.group.WORLD
        a = _trained(cfg, ProcessGroups(world=g, dp=g, pp=g, tp=g, generation=0))
        save_checkpoint(a, tmp_path / "ck", g, record=model_record(cfg))
    finally:
        dist.destroy_process_group()
    marker = json.loads((step_dir(tmp_path / "ck", STEP) / "complete.json").read_text())
    assert marker["grid"] == [1, 1, 1] and marker["model"]["hidden_size"] == 32 and marker["engine"] == "torch"
    mp.start_processes(_grow_worker, args=(str(tmp_path / "ck"), dataset, str(tmp_path)), nprocs=2,
                       start_method="spawn")
    got = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    z, n = a.optimizer, a.optimizer.numel
    for kind in ("main", "exp_avg", "exp_avg_sq"):  # the two new slices, end to end, are the old vector
        assert torch.equal(torch.cat([g[kind] for g in got])[:n], getattr(z, kind)[:n]), kind
    for r, g in enumerate(got):
        assert (g["step"], g["position"], g["lr"]) == (STEP, a.data_position, a.last_lr)
        assert g["grid"] == {"tp": 1, "pp": 1, "dp": 2}
        assert all(torch.equal(t, dict(a.param_shard())[k]) for k, t in g["params"].items())
