"""Adam's step counter, wherever the optimizer keeps it.

Adam's bias correction divides by ``1 - beta**t`` with ``t`` the optimizer's own step counter, so a restored
optimizer must continue with the same ``t`` or its next update differs. Where ``t`` lives depends on the
optimizer megatron-core picks (``megatron/core/optimizer/__init__.py``):

- ``torch.optim.Adam`` / ``AdamW`` (no Transformer Engine or Apex installed): per parameter, in
  ``state[p]["step"]`` (a 0-dim float32 tensor; on the parameter's device when ``fused`` or ``capturable``);
- Transformer Engine's and Apex's ``FusedAdam``: per parameter group, in ``param_groups[i]["step"]`` (an
  int, created at the first ``step()``; groups without parameters are skipped and have none).

megatron-core's own checkpointing reads and writes both (``DistributedOptimizer.state_dict``); so do
:func:`read_adam_step` and :func:`write_adam_step`. The counter is one integer per optimizer: every entry
holds the same value.
"""

from __future__ import annotations

import torch

from phoenix_hpc.errors import EngineError

STATE, GROUP = "state", "group"


def step_location(opt) -> str:
    """``"state"`` for torch's own optimizers (module ``torch.optim``), ``"group"`` for the fused ones
    (Transformer Engine, Apex) that keep the counter in their parameter groups."""
    return STATE if type(opt).__module__.startswith("torch.optim") else GROUP


def ensure_step_entries(opt) -> None:
    """Create the counter at 0 where a fresh optimizer has none yet, so that the state saved before the first
    step has the same entries as after it: ``state[p]["step"]`` for torch (as torch creates it: float32, on
    the parameter's device with ``fused``/``capturable``, else on CPU), ``group["step"] = 0`` for the fused
    ones (their ``step()`` adds 1 to an existing counter, as from a missing one). Call it after the moments
    exist (megatron-core's ``init_state_fn``): torch creates a parameter's state only when it is empty."""
    for group in opt.param_groups:
        if not group["params"]:
            continue
        if step_location(opt) == GROUP:
            group.setdefault("step", 0)
            continue
        on_dev = group.get("fused") or group.get("capturable")
        for p in group["params"]:
            st = opt.state[p]
            if "step" not in st:
                st["step"] = torch.zeros((), dtype=torch.float32, device=p.device if on_dev else "cpu")


def read_adam_step(optimizers) -> int:
    """The step counter of ``optimizers`` (inner torch-style optimizers with ``state`` and ``param_groups``),
    0 when none has one yet.

    Raises:
        EngineError: two entries disagree (the optimizer was partly restored).
    """
    seen: set[int] = set()
    for opt in optimizers:
        for group in opt.param_groups:
            if not group["params"]:
                continue
            if step_location(opt) == GROUP:
                if "step" in group:
                    seen.add(int(group["step"]))
                continue
            for p in group["params"]:
                st = opt.state.get(p, {})
                if "step" in st:
                    seen.add(int(st["step"]))
    if len(seen) > 1:
        raise EngineError(f"Adam step counters disagree across parameters/groups: {sorted(seen)}")
    return seen.pop() if seen else 0


def write_adam_step(optimizers, step: int) -> None:
    """Set the step counter of every parameter (torch) or non-empty parameter group (fused) to ``step``,
    keeping each tensor's dtype and device."""
    for opt in optimizers:
        ensure_step_entries(opt)
        for group in opt.param_groups:
            if not group["params"]:
                continue
            if step_location(opt) == GROUP:
                group["step"] = int(step)
                continue
            for p in group["params"]:
                t = opt.state[p]["step"]
                if torch.is_tensor(t):
                    t.fill_(step)
                else:
                    opt.state[p]["step"] = int(step)
