"""The final checkpoint of a planned end in Megatron-LM's layout (launch/final_megatron.py, launch/final.py), on
CPU.

:func:`final_megatron.export` runs as in a job: a fresh default group over a real store under the export's own
prefix, a real megatron-core parallel state, a real DDP-wrapped GPTModel built on CPU that takes the host
snapshot, megatron-core's ``dist_checkpointing.save``; what is read back with ``dist_checkpointing.load`` into a
fresh GPTModel is the snapshot's. megatron-core's DistributedOptimizer needs CUDA: a recording stand-in takes
the optimizer part (tests/unit/test_megatron_ckpt.py's), and the engine with the real optimizer is the GPU
check's (gpucheck/check_megatron_ckpt.py, item ``megatron_ckpt.from_snapshot``). The member is a stand-in with
the methods the export calls on :class:`phoenix_hpc.launch.execute.Member`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import warnings

import pytest
import torch

from phoenix_hpc.engines import megatron_ckpt as mck
from phoenix_hpc.engines import megatron_layout as ml
from phoenix_hpc.launch import final, final_megatron
from phoenix_hpc.topology import Grid

warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine).*")


def _job(root, mode="phoenix"):
    from tests.unit.test_megatron_ckpt import GPT, job

    cfg = job(GPT, save_megatron=str(root))
    return cfg.model_copy(update={"resilience": cfg.resilience.model_copy(update={"mode": mode})})


class SnapshotEngine:
    """The engine built for the export: a real DDP-wrapped GPTModel (``model``), the recording optimizer;
    ``load_*`` take a snapshot as the Megatron engine's do (params by the engine's names, step from the
    envelope)."""

    def __init__(self, cfg, seed: int):
        from tests.unit.test_megatron_ckpt import _engine

        self.ns = _engine(cfg, seed=seed, state=torch.zeros(6))
        self.loaded_opt = None

    def __getattr__(self, name):
        return getattr(self.ns, name)

    def load_optimizer_shard(self, tensors):
        self.loaded_opt = dict(tensors)

    def load_param_shard(self, tensors):
        with torch.no_grad():
            for n, p in self.ns.model.module.named_parameters():
                p.copy_(tensors[f"param/pp0/tp0/{n}"])

    def load_envelope(self, envelope):
        self.ns.step = int(envelope["step"])

    def release_groups(self):
        from phoenix_hpc.engines.megatron_parallel import destroy_parallel_state

        destroy_parallel_state()


class FakeMember:
    """What :func:`final_megatron.export` uses of a Member, with a real store and real groups."""

    def __init__(self, cfg, run_dir):
        import torch.distributed as dist

        from phoenix_hpc.engines.base import GridCoord

        self.env = argparse.Namespace(cfg=cfg, run_dir=run_dir, backend="gloo", device=torch.device("cpu"),
                                      grid=Grid(1, 1, 1))
        self.generation, self.logical, self.n_ranks, self.coord = 3, 0, 1, GridCoord(0, 0, 0)
        self.store, self.engine, self.groups, self.calls = dist.HashStore(), "old engine", None, []
        self.aborter = None

    def _store(self):
        return self.store

    def _teardown_engine(self):
        self.calls.append("teardown")
        self.engine = None

    def _construct_engine(self, state_follows=False):
        import torch.distributed as dist

        from phoenix_hpc.engines.megatron_parallel import init_parallel_state

        assert dist.is_initialized() and self.groups.world is dist.group.WORLD and state_follows
        self.calls.append("construct")
        init_parallel_state(1, 1, timeout_s=60.0)
        self.engine = SnapshotEngine(self.env.cfg, seed=2)

    def release_groups(self):
        from phoenix_hpc.launch.execute import Member

        self.calls.append("release")
        Member.release_groups(self)  # the member's own: the aborter, destroy_process_group, the engine's


@pytest.fixture
def cpu_writer(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)  # CPU tensors: nothing to wait for
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")  # megatron-core's flag; DDP's buffers


@contextlib.contextmanager
def _world():
    """A one-rank gloo default group and megatron-core's parallel state, gone afterwards."""
    import torch.distributed as dist

    from phoenix_hpc.engines.megatron_parallel import destroy_parallel_state, init_parallel_state

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    init_parallel_state(1, 1, timeout_s=60.0)
    try:
        yield
    finally:
        destroy_parallel_state()
        dist.destroy_process_group()


def _snapshot(cfg, step: int):
    """A host snapshot of ``step`` as the protector unpacks it: a model's parameters under the engine's
    names, an optimizer part, an envelope."""
    from tests.unit.test_megatron_ckpt import _gpt

    with _world():
        gpt = _gpt(cfg, seed=11)
    tensors = {f"param/pp0/tp0/{n}": p.detach().clone() for n, p in gpt.named_parameters()}
    tensors["opt/pp0/tp0/dp0/x/param"] = torch.arange(4, dtype=torch.float32)
    return argparse.Namespace(tensors=tensors, envelope={"step": step}), gpt


def test_store_prefix_is_no_generations():
    assert final_megatron.store_prefix(3, 40) == "final-megatron/gen3/step40"
    assert not final_megatron.store_prefix(3, 40).startswith("gen")  # init_generation's prefix is gen{g}


def test_already_written_reads_the_tracker_and_the_folder(tmp_path):
    assert not final_megatron.already_written(tmp_path, 40)  # no tracker
    ml.write_tracker(tmp_path, 40)
    assert not final_megatron.already_written(tmp_path, 40)  # the tracker without its folder
    ml.iter_dir(tmp_path, 40).mkdir()
    assert final_megatron.already_written(tmp_path, 40)
    assert not final_megatron.already_written(tmp_path, 41)
    (tmp_path / ml.TRACKER).write_text("garbage")
    assert not final_megatron.already_written(tmp_path, 40)


def test_export_writes_the_snapshot_in_megatron_lms_layout(tmp_path, cpu_writer):
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    from tests.unit.test_megatron_ckpt import _gpt

    root = tmp_path / "mlm"
    cfg = _job(root)
    m = FakeMember(cfg, tmp_path / "run")
    u, source = _snapshot(cfg, 40)
    out = final_megatron.export(m, u, 40)
    assert set(out) == {"megatron"}, out
    assert out["megatron"]["dir"] == str(root) and out["megatron"]["iteration"] == 40 and out["megatron"]["write_s"] >= 0
    assert out["megatron"]["folder"] == "iter_0000040"
    assert m.calls == ["teardown", "construct", "release"] and not dist.is_initialized()
    assert m.aborter is not None and m.aborter.aborted  # the export's groups released as a generation's
    assert (root / ml.TRACKER).read_text() == "40"
    assert torch.equal(m.engine.loaded_opt["opt/pp0/tp0/dp0/x/param"], torch.arange(4, dtype=torch.float32))
    log = [json.loads(x) for x in (tmp_path / "run" / "ranks" / "rank0.persist.jsonl").read_text().splitlines()]
    assert log[-1]["event"] == "save_megatron" and log[-1]["step"] == 40 and log[-1]["final"] is True
    # the folder loads into a freshly built GPTModel, as Megatron-LM's scripts do: the snapshot's weights
    with _world():
        fresh = _gpt(cfg, seed=5)
        d = ml.iter_dir(root, 40)
        loaded = dist_checkpointing.load({"model": fresh.sharded_state_dict(), "iteration": None}, str(d))
        fresh.load_state_dict(loaded["model"])
        assert loaded["iteration"] == 40
        want = dict(source.named_parameters())
        assert all(torch.equal(p, want[n]) for n, p in fresh.named_parameters())
        common = dist_checkpointing.load_common_state_dict(str(d))
        assert common["opt_param_scheduler"]["num_steps"] == 40 * cfg.training.global_batch_size


def test_export_skips_a_step_the_periodic_export_wrote(tmp_path):
    root = tmp_path / "mlm"
    ml.iter_dir(root, 40).mkdir(parents=True)
    ml.write_tracker(root, 40)
    m = FakeMember(_job(root), tmp_path / "run")
    out = final_megatron.export(m, None, 40)
    assert out == {"megatron": {"dir": str(root), "iteration": 40, "skipped": "written by the periodic export"}}
    assert m.calls == [] and m.engine == "old engine"  # nothing built, nothing written


def test_a_failed_export_is_reported_not_raised(tmp_path, cpu_writer):
    import torch.distributed as dist

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    cfg = _job(blocker / "mlm")  # a directory below a file cannot be made
    m = FakeMember(cfg, tmp_path / "run")
    u, _ = _snapshot(cfg, 40)
    out = final_megatron.export(m, u, 40)
    assert set(out) == {"megatron_error"} and out["megatron_error"].split(":")[0] in ("FileExistsError",
                                                                                     "NotADirectoryError"), out
    assert m.calls[-1] == "release" and not dist.is_initialized()


# --- launch/final.py: the member's planned end calls the export after its shard, and reports it -----------
class Client:
    def __init__(self, step):
        self.msgs = [{"type": "write_checkpoint", "step": step}, {"type": "stop", "job_state": "stopped"}]
        self.reports, self.timeouts = [], []

    def report_stopping(self, generation, steps):
        self.reports.append(("stopping", steps))

    def wait_instruction(self, types, timeout):
        self.timeouts.append(timeout)
        return self.msgs.pop(0)

    def report_shard_written(self, step, info):
        self.reports.append(("shard_written", step, info))


class Prot:
    def close(self, abandon=False):
        pass

    def copy_steps(self):
        return [40], {}

    def local_snapshot(self, step):
        return argparse.Namespace(tensors={}, envelope={"step": step})


def _planned_end(tmp_path, monkeypatch, cfg, write_error=None, export_s=1.5):
    from phoenix_hpc.recovery import checkpoint

    clock = [1000.0]
    monkeypatch.setattr(final.time, "monotonic", lambda: clock[0])

    def write(root, step, coord, tensors, envelope):
        if write_error:
            raise OSError(write_error)
        return {"file": "f", "sha256": "0", "bytes": 1}

    exports = []
    monkeypatch.setattr(checkpoint, "write_snapshot_shard", write)
    def export(member, u, step):
        exports.append(step)
        clock[0] += export_s
        return {"megatron": {"dir": "/m", "iteration": step, "write_s": export_s}}

    monkeypatch.setattr(final_megatron, "export", export)
    lines = []
    m = argparse.Namespace(env=argparse.Namespace(client=Client(40), cfg=cfg, run_dir=tmp_path, log=lines.append),
                           protector=Prot(), generation=2, wait_s=5.0, coord=None, logical=0,
                           release_groups=lambda: None)
    stop = final.final_checkpoint(m, {"type": "stop", "checkpoint": True})
    assert stop["job_state"] == "stopped"
    (_, step, info), = [r for r in m.env.client.reports if r[0] == "shard_written"]
    return exports, info, lines, m.env.client.timeouts


def test_the_planned_end_exports_the_final_step_when_save_megatron_is_set(tmp_path, monkeypatch):
    exports, info, lines, _ = _planned_end(tmp_path, monkeypatch, _job(tmp_path / "mlm"))
    assert exports == [40] and info["megatron"] == {"dir": "/m", "iteration": 40, "write_s": 1.5}
    assert info["file"] == "f"  # the shard of phoenix's format is reported as before
    assert any("final checkpoint of step 40 in Megatron-LM's layout: iteration 40 written to /m" in x for x in lines)


def test_no_export_without_save_megatron_or_after_a_failed_shard(tmp_path, monkeypatch):
    from tests.unit.test_megatron_ckpt import GPT, job

    exports, info, _, _ = _planned_end(tmp_path, monkeypatch, job(GPT))
    assert exports == [] and "megatron" not in info
    exports, info, _, _ = _planned_end(tmp_path, monkeypatch, _job(tmp_path / "mlm"), write_error="disk full")
    assert exports == [] and info["error"].startswith("OSError: disk full")


def test_megatron_note_words():
    assert final.megatron_note({"megatron_error": "OSError: x"}) == "failed: OSError: x"
    assert final.megatron_note({"megatron": {"dir": "/m", "iteration": 4, "skipped": "written by the periodic "
                                             "export"}}) == "/m already holds iteration 4 (written by the periodic export)"


def test_the_coordinators_write_round_and_the_warning_lead_count_the_export(tmp_path):
    import yaml

    from phoenix_hpc.config.resolve import FINAL_WRITE_TIMEOUT_S, final_write_timeout_s, warning_lead_s
    from phoenix_hpc.control.settings import timing_from_run_dir

    assert final_write_timeout_s(False, 30.0) == FINAL_WRITE_TIMEOUT_S == 120.0
    assert final_write_timeout_s(True, 30.0) == 270.0
    assert warning_lead_s(120, 30.0, 30.0, 10.0) == 120
    assert warning_lead_s(120, 30.0, 30.0, 10.0, save_megatron=True) == 190  # 100 + 30 + 2 x 30
    for cfg, want in ((_job(tmp_path / "mlm"), 240.0 + _job(tmp_path).resilience.collective_timeout_s),
                      (_job(tmp_path).model_copy(update={"resilience": _job(tmp_path).resilience.model_copy(
                          update={"checkpoint": _job(tmp_path).resilience.checkpoint.model_copy(
                              update={"save_megatron": None})})}), 120.0)):
        (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
        assert timing_from_run_dir(tmp_path)[0].final_write_timeout_s == want


def test_an_export_longer_than_the_instruction_timeout_still_waits_for_the_final_stop(tmp_path, monkeypatch):
    """The member waits ``wait_s`` for the coordinator's final stop counted from its report, not from the
    start of the planned end: an export of 200 s (wait_s 5 s) leaves it the whole wait."""
    exports, info, _, timeouts = _planned_end(tmp_path, monkeypatch, _job(tmp_path / "mlm"), export_s=200.0)
    assert exports == [40] and timeouts == [5.0, 5.0]
