"""Persistent checkpoint round trip through torch.distributed.checkpoint on a real 2-rank gloo group.

The engine here is a minimal Engine with plain tensors (the checkpoint code only uses the Engine interface);
dp=2: the param shard is replicated on both ranks, each rank owns its optimizer shard.
"""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from phoenix_hpc.engines.base import Engine, GridCoord
from phoenix_hpc.recovery.checkpoint import latest_step, load_checkpoint, save_checkpoint, step_dir


class TinyEngine(Engine):
    def __init__(self, dp_rank: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.coord = GridCoord(0, dp_rank, 0)
        self.step = 0
        self.w = torch.randn(4, 3, generator=g)
        self.opt = {k: torch.randn(6, generator=g) for k in ("main", "exp_avg", "exp_avg_sq")}
        self.data_pos = 0

    def forward_backward(self):
        return None

    def reduce_gradients(self):
        pass

    def optimizer_step(self):
        self.step += 1
        self.w += 0.5
        for t in self.opt.values():
            t.mul_(0.9)
        self.data_pos += 2

    def optimizer_shard(self):
        p = self.coord.shard_prefix()
        return [(f"{p}/w/{k}", t) for k, t in self.opt.items()]

    def param_shard(self):
        return [("param/pp0/tp0/w", self.w)]

    def envelope(self):
        return {"step": self.step, "data_pos": self.data_pos}

    def load_optimizer_shard(self, tensors):
        p = self.coord.shard_prefix()
        for k in self.opt:
            self.opt[k].copy_(tensors[f"{p}/w/{k}"])

    def load_param_shard(self, tensors):
        self.w.copy_(tensors["param/pp0/tp0/w"])

    def load_envelope(self, envelope):
        self.step, self.data_pos = envelope["step"], envelope["data_pos"]

    def rebind(self, groups, coord):
        pass


def _worker(rank: int, port: int, root: str, out: dict) -> None:
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0)
    dist.init_process_group("gloo", store=dist.PrefixStore("gen0", store), rank=rank, world_size=2)
    pg = dist.new_group([0, 1], backend="gloo")  # an explicit group, not the default one
    e = TinyEngine(rank, seed=7 + rank)
    e.w.copy_(torch.arange(12.0).view(4, 3))  # params are identical on DP peers
    for _ in range(3):
        e.optimizer_step()
    saved = e.state_hash()
    save_checkpoint(e, root, pg)
    for _ in range(2):  # move on past the checkpoint, then fall back to it
        e.optimizer_step()
    fresh = TinyEngine(rank, seed=100 + rank)
    step = load_checkpoint(fresh, root, pg)
    out[rank] = (saved, fresh.state_hash(), step, fresh.data_pos, e.state_hash())
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_save_then_load_restores_every_rank_exactly(tmp_path):
    root = tmp_path / "ckpt"
    with mp.Manager() as m:
        out = m.dict()
        mp.spawn(_worker, args=(_free_port(), str(root), out), nprocs=2, join=True)
        res = dict(out)
    assert latest_step(root) == 3 and (step_dir(root, 3) / ".metadata").exists()
    for rank in (0, 1):
        saved, loaded, step, data_pos, moved_on = res[rank]
        assert loaded == saved and step == 3 and data_pos == 6
        assert moved_on != saved  # the hash does see the difference
    assert res[0][0] != res[1][0]  # different optimizer shards per DP rank
    assert oct(os.stat(root / "latest").st_mode & 0o777) == "0o600"


def test_missing_checkpoint_is_a_recovery_error(tmp_path):
    import pytest

    from phoenix_hpc.errors import RecoveryError

    assert latest_step(tmp_path) is None
    with pytest.raises(RecoveryError, match="no complete persistent checkpoint under"):
        load_checkpoint(TinyEngine(0, 1), tmp_path, process_group=None)
