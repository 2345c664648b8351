"""Engines that break one rule of the conformance kit each (loaded by ``engine: broken_engines:Class``)."""

from __future__ import annotations

import time

import torch

from phoenix_hpc.engines.factory import open_samples
from phoenix_hpc.engines.torch_engine import TorchEngine


class _Base(TorchEngine):
    def __init__(self, cfg, coord, groups, device):
        super().__init__(cfg, coord, groups, open_samples(cfg), device)


class ClockEngine(_Base):
    """Data order depends on the wall clock: each step reads samples at an offset taken from time.time_ns()."""

    def _local_batch(self):
        per_dp = self.cfg.training.global_batch_size // self.dp
        shift = time.time_ns() % 997
        x, y = self.samples.batch(self.data_position + shift + self.coord.dp * per_dp, per_dp)
        return x.to(self.device), y.to(self.device)


class RenamingEngine(_Base):
    """Shard names change on rebind: the new generation's number goes into every name."""

    def rebind(self, groups, coord):
        super().rebind(groups, coord)
        self._param_prefix = f"param/pp{coord.pp}/tp{coord.tp}/gen{groups.generation}"
        self._opt_state = self.optimizer.named_state(f"{coord.shard_prefix()}/gen{groups.generation}")


class EagerEngine(_Base):
    """Applies the update already in reduce_gradients (parameters change outside optimizer_step)."""

    def reduce_gradients(self):
        super().reduce_gradients()
        with torch.no_grad():
            for p in self.model.parameters():
                p.add_(1e-3)


class NotAnEngine:
    """A class that is no Engine subclass."""
