"""Adam's step counter survives a restore whichever optimizer keeps it: torch's Adam/AdamW (per parameter,
``state[p]["step"]``) and a FusedAdam-style optimizer (per group, ``param_groups[i]["step"]``, as Transformer
Engine's and Apex's FusedAdam do). A restored optimizer continues bitwise like the original."""

from __future__ import annotations

import json

import pytest
import torch

from phoenix_hpc.engines.adam_step import (
    GROUP,
    STATE,
    ensure_step_entries,
    read_adam_step,
    step_location,
    write_adam_step,
)
from phoenix_hpc.errors import EngineError


class GroupStepAdam(torch.optim.Optimizer):
    """Adam with the step counter in the parameter group, as TE/Apex FusedAdam keep it (``group["step"]``
    created at 1 by the first step, incremented after; empty groups skipped). Decoupled weight decay."""

    def __init__(self, params, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            if not group["params"]:
                continue
            group["step"] = group["step"] + 1 if "step" in group else 1
            t, (b1, b2) = group["step"], group["betas"]
            for p in group["params"]:
                st = self.state[p]
                if not st:
                    st["exp_avg"], st["exp_avg_sq"] = torch.zeros_like(p), torch.zeros_like(p)
                p.mul_(1 - group["lr"] * group["weight_decay"])
                st["exp_avg"].lerp_(p.grad, 1 - b1)
                st["exp_avg_sq"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                denom = (st["exp_avg_sq"] / (1 - b2**t)).sqrt_().add_(group["eps"])
                p.addcdiv_(st["exp_avg"], denom, value=-group["lr"] / (1 - b1**t))


GroupStepAdam.__module__ = "transformer_engine.pytorch.optimizers.fused_adam"  # where TE's FusedAdam lives


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(4, 3, generator=g)), torch.nn.Parameter(torch.randn(3, generator=g))]


def _make(kind, params):
    groups = [{"params": params[:1], "weight_decay": 0.1}, {"params": params[1:], "weight_decay": 0.0},
              {"params": [], "weight_decay": 0.0}]
    if kind == "torch":
        return torch.optim.AdamW(groups, lr=1e-2, betas=(0.9, 0.95))
    return GroupStepAdam(groups, lr=1e-2)


def _train(opt, params, steps, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()


def _snapshot(opt, params):
    """What the engine saves: the tensors of the shard and the envelope's counter (through JSON)."""
    tensors = [p.detach().clone() for p in params] + [
        opt.state[p][k].clone() for p in params for k in ("exp_avg", "exp_avg_sq")]
    return tensors, json.loads(json.dumps({"adam_step": read_adam_step([opt])}))


def _init_state(opt, params):
    """What the engine does at construction: megatron-core's init_state_fn creates the moments, then the
    counter's entries are created (torch creates a parameter's state only when it is empty)."""
    for p in params:
        opt.state[p].setdefault("exp_avg", torch.zeros_like(p))
        opt.state[p].setdefault("exp_avg_sq", torch.zeros_like(p))
    ensure_step_entries(opt)


def _restore(opt, params, snap):
    tensors, env = snap
    _init_state(opt, params)
    live = [p.data for p in params] + [opt.state[p][k] for p in params for k in ("exp_avg", "exp_avg_sq")]
    for dst, src in zip(live, tensors):
        dst.copy_(src)
    write_adam_step([opt], env["adam_step"])


@pytest.mark.parametrize("kind,where", [("torch", STATE), ("fused", GROUP)])
def test_step_location(kind, where):
    assert step_location(_make(kind, _params())) == where


@pytest.mark.parametrize("kind", ["torch", "fused"])
def test_restored_optimizer_continues_bitwise(kind):
    a_params = _params()
    a = _make(kind, a_params)
    _init_state(a, a_params)
    assert read_adam_step([a]) == 0
    _train(a, a_params, 5, seed=1)
    assert read_adam_step([a]) == 5
    snap = _snapshot(a, a_params)
    _train(a, a_params, 3, seed=2)

    b_params = _params(seed=9)  # a fresh optimizer on other values: a spare, a rollback, a restart
    b = _make(kind, b_params)
    _restore(b, b_params, snap)
    assert read_adam_step([b]) == 5
    _train(b, b_params, 3, seed=2)
    assert read_adam_step([b]) == read_adam_step([a]) == 8
    for pa, pb in zip(a_params, b_params):
        assert torch.equal(pa, pb)


@pytest.mark.parametrize("kind", ["torch", "fused"])
def test_without_the_counter_the_restore_would_differ(kind):
    """The test above can fail: restoring everything but the counter gives a different next update."""
    a_params = _params()
    a = _make(kind, a_params)
    _train(a, a_params, 5, seed=1)
    tensors, _ = _snapshot(a, a_params)
    _train(a, a_params, 1, seed=2)
    b_params = _params(seed=9)
    b = _make(kind, b_params)
    _restore(b, b_params, (tensors, {"adam_step": 0}))
    _train(b, b_params, 1, seed=2)
    assert not torch.equal(a_params[0], b_params[0])


def test_rollback_in_place_sets_the_counter_back():
    params = _params()
    opt = _make("fused", params)
    _train(opt, params, 4, seed=1)
    write_adam_step([opt], 2)
    assert [g.get("step") for g in opt.param_groups] == [2, 2, None]  # the empty group keeps none
    opt_t = _make("torch", params)
    _train(opt_t, params, 4, seed=1)
    write_adam_step([opt_t], 2)
    assert all(float(opt_t.state[p]["step"]) == 2.0 and opt_t.state[p]["step"].dtype == torch.float32 for p in params)


def test_disagreeing_counters_are_an_error():
    params = _params()
    opt = _make("torch", params)
    _train(opt, params, 2, seed=1)
    opt.state[params[1]]["step"].fill_(7)
    with pytest.raises(EngineError, match=r"disagree.*\[2, 7\]"):
        read_adam_step([opt])
