"""Pipeline parallelism for the torch engine: ``torch.distributed.pipelining`` over an explicit pp group.

Each DP replica has its own pipeline sub-group (``ProcessGroups.pp``); a :class:`PipelineRunner` wraps one
stage's module in a :class:`~torch.distributed.pipelining.PipelineStage` bound to that group and runs a
1F1B schedule (``Schedule1F1B``; GPipe when there are fewer micro-batches than stages, which 1F1B does not
accept). Gradients are accumulated over the micro-batches and divided by their number (the schedule's
``scale_grads``), so they equal those of the mean loss of the step.

Why static shapes, and the finding behind it. A probe of torch 2.13 on gloo had found that with one
pipeline sub-group per DP replica (pp=2 x dp=2) (a) runtime shape inference deadlocked in backward and
(b) with static ``input_args``/``output_args`` training ran but stage 0 got no gradients. Re-checked here:

* (b) is caused by the example tensors: ``PipelineStage`` copies ``requires_grad`` from the static example
  tensors into its receive-buffer metadata (``_StageMeta``) and only makes received activations
  ``requires_grad`` when that flag is set. Examples made with ``torch.zeros(...)`` have
  ``requires_grad=False``, so the next stage computes no input gradient and stage 0 receives ``None``.
  Passing float examples with ``requires_grad=True`` (as done below) gives stage 0 the same gradients as
  runtime inference does.
* (a) did not reproduce: with runtime shape inference, sub-groups created by every rank in the same
  order, an embedding first stage and a linear last stage, 1F1B and GPipe both trained and gave the
  same gradients as above. The earlier probe's code was not kept, so its cause is unknown; creating
  ``new_group``s in different orders on different ranks (or only one's own groups) is a classic cause
  of such hangs, which is why :mod:`phoenix_hpc.launch.groups` creates every group on every rank in
  one fixed order.

Static shapes are used anyway: they skip the metadata round trip (pickled objects over the pp group) on the
first step and after every :meth:`rebind`, and every micro-batch has the same shape here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


class PipelineRunner:
    """Run one training step's forward and backward passes of one pipeline stage.

    Args:
        module: this stage's chunk (first stage takes tokens ``(mbs, S)`` int64; others take hidden states
            ``(mbs, S, H)`` in ``dtype``; the last stage returns logits ``(mbs, S, V)``).
        stage: this rank's stage index (its pp coordinate); ``num_stages``: pp size.
        group: the pp process group of this DP replica (ranks ordered by stage).
        n_micro: micro-batches per step; ``micro_batch``, ``seq_length``, ``hidden_size``, ``vocab_size``:
            shapes of the tensors crossing stage boundaries.
        loss_fn: ``loss_fn(logits, targets) -> scalar`` mean loss of one micro-batch (last stage).
    """

    def __init__(
        self,
        module: nn.Module,
        stage: int,
        num_stages: int,
        group: Any,
        device: torch.device,
        n_micro: int,
        micro_batch: int,
        seq_length: int,
        hidden_size: int,
        vocab_size: int,
        dtype: torch.dtype,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    ):
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        self.stage = stage
        self.is_first = stage == 0
        self.is_last = stage == num_stages - 1
        hidden = torch.zeros(micro_batch, seq_length, hidden_size, dtype=dtype, device=device, requires_grad=True)
        if self.is_first:
            example_in = torch.zeros(micro_batch, seq_length, dtype=torch.long, device=device)
        else:
            example_in = hidden
        if self.is_last:
            example_out = torch.zeros(
                micro_batch, seq_length, vocab_size, dtype=dtype, device=device, requires_grad=True
            )
        else:
            example_out = hidden
        self._stage = PipelineStage(
            module, stage, num_stages, device, input_args=(example_in,), output_args=(example_out,), group=group
        )
        sched = Schedule1F1B if n_micro >= num_stages else ScheduleGPipe
        self.schedule_name = sched.__name__
        self._schedule = sched(self._stage, n_microbatches=n_micro, loss_fn=loss_fn, scale_grads=True)

    def run(self, inputs: torch.Tensor | None, targets: torch.Tensor | None) -> float | None:
        """One step over ``n_micro`` micro-batches (``inputs``/``targets``: ``(n_micro * mbs, S)`` int64 on
        the first/last stage, None elsewhere). Returns the mean micro-batch loss on the last stage, else
        None. Gradients are left in the module's ``.grad``."""
        if self.is_last:
            losses: list[torch.Tensor] = []
            if self.is_first:
                self._schedule.step(inputs, target=targets, losses=losses)
            else:
                self._schedule.step(target=targets, losses=losses)
            return float(torch.stack([l.detach().float() for l in losses]).mean())
        if self.is_first:
            self._schedule.step(inputs)
        else:
            self._schedule.step()
        return None

    def eval(self, inputs: torch.Tensor | None, targets: torch.Tensor | None) -> float | None:
        """As :meth:`run`, forward only (the schedule's ``eval``: no backward, no gradient); the caller sets
        eval mode and ``torch.no_grad``. Returns the mean micro-batch loss on the last stage, else None."""
        if self.is_last:
            losses: list[torch.Tensor] = []
            args = (inputs,) if self.is_first else ()
            self._schedule.eval(*args, target=targets, losses=losses)
            return float(torch.stack([l.detach().double() for l in losses]).mean())
        self._schedule.eval(*((inputs,) if self.is_first else ()))
        return None
