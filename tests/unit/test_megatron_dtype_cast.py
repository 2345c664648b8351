"""The Megatron engine's cast of a model's stray fp32 parameters to ``model.dtype`` (CPU, plain torch)."""

import torch

from phoenix_hpc.engines.megatron_engine import cast_to_params_dtype


class _Stage(torch.nn.Module):
    """A bf16 linear layer beside an fp32 RMSNorm, as megatron-core's torch fallback norm builds it."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8, bias=False, dtype=torch.bfloat16)
        self.norm = torch.nn.RMSNorm(8)
        self.register_buffer("steps", torch.zeros(2, dtype=torch.int64))
        self.register_buffer("scale", torch.ones(3))


def test_stray_fp32_params_and_buffers_are_cast_and_named():
    m = _Stage()
    w = m.norm.weight.detach().clone()
    cast = cast_to_params_dtype(m, torch.bfloat16)
    assert cast == ["norm.weight"]
    assert {p.dtype for p in m.parameters()} == {torch.bfloat16}
    assert m.scale.dtype == torch.bfloat16
    assert m.steps.dtype == torch.int64  # integer buffers are not touched
    assert torch.equal(m.norm.weight.float(), w.bfloat16().float())


def test_fp32_model_and_uniform_model_are_left_alone():
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    before = [p.data_ptr() for p in m.parameters()]
    assert cast_to_params_dtype(m, torch.float32) == []
    assert [p.data_ptr() for p in m.parameters()] == before and all(p.dtype == torch.float32 for p in m.parameters())
    b = torch.nn.Linear(4, 4, dtype=torch.bfloat16)
    ptr = b.weight.data_ptr()
    assert cast_to_params_dtype(b, torch.bfloat16) == []
    assert b.weight.dtype == torch.bfloat16 and b.weight.data_ptr() == ptr  # nothing re-allocated
