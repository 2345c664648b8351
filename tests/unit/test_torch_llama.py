"""The torch engine's GPT with the Llama options (rotary embeddings, grouped-query attention, SwiGLU, RMSNorm,
no linear biases): each piece against an independent formula, the whole model against megatron-core's
GPTModel built on CPU with the same weights, the pipeline split, training on CPU, and the parameter count the
memory plans use."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from phoenix_hpc.config.memory import stage_params
from phoenix_hpc.config.schema import JobConfig
from phoenix_hpc.data.indexed import TokenSamples
from phoenix_hpc.engines.base import GridCoord
from phoenix_hpc.engines.torch_engine import TorchEngine
from phoenix_hpc.engines.torch_gpt import GPTShape, GPTStage, Block, apply_rope, empty_stage, lm_loss, rope_tables
from phoenix_hpc.launch.loop import train

warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine).*")

LLAMA = {"layers": 2, "hidden_size": 64, "heads": 8, "num_query_groups": 2, "ffn_hidden_size": 176,
         "vocab_size": 256, "seq_length": 32, "position_embedding_type": "rope", "rotary_base": 500,
         "activation": "swiglu", "normalization": "RMSNorm", "add_bias_linear": False}


def shape_of(model: dict) -> GPTShape:
    m = JobConfig.model_validate({"name": "t", "engine": "torch", "data": {"path": "d"}, "model": model}).model
    return GPTShape(**{f: getattr(m, f) for f in GPTShape.__dataclass_fields__})


# --- the pieces against their formulas -----------------------------------------------------------------
def test_rope_rotates_each_pair_by_the_complex_factor_of_its_position():
    """RoFormer eq. 34, non-interleaved: the pair (t_j, t_{j+d/2}) at position m, read as t_j + i t_{j+d/2},
    is multiplied by e^{i m theta_j}, theta_j = base^(-2j/d)."""
    s, d, base = 12, 16, 10000.0
    t = torch.randn(2, 3, s, d, dtype=torch.float64)
    got = apply_rope(t, *rope_tables(s, d, base, torch.float64))
    m = torch.arange(s, dtype=torch.float64)[:, None]
    theta = base ** (-2 * torch.arange(d // 2, dtype=torch.float64) / d)
    z = torch.complex(t[..., : d // 2], t[..., d // 2:]) * torch.exp(1j * m * theta)
    want = torch.cat((z.real, z.imag), dim=-1)
    assert torch.allclose(got, want, atol=1e-6), (got - want).abs().max()
    # a query/key score depends on the positions' difference only
    q, k = torch.randn(d, dtype=torch.float64), torch.randn(d, dtype=torch.float64)
    cos, sin = rope_tables(s, d, base, torch.float64)
    rq, rk = apply_rope(q.expand(s, d), cos, sin), apply_rope(k.expand(s, d), cos, sin)
    assert torch.allclose(rq[7] @ rk[3], rq[5] @ rk[1]) and not torch.allclose(rq[7] @ rk[3], rq[7] @ rk[4])


def test_grouped_query_attention_equals_multi_head_with_each_kv_head_repeated():
    """Query head i reads key/value head i // (heads / groups): the GQA block equals the MHA block whose
    key/value weights repeat each group's rows heads / groups times, in order."""
    torch.manual_seed(0)
    gqa_shape = shape_of({**LLAMA, "add_bias_linear": True})
    mha_shape = shape_of({**LLAMA, "add_bias_linear": True, "num_query_groups": None})
    gqa, mha = Block(gqa_shape), Block(mha_shape)
    h, hd, heads, groups = 64, 8, 8, 2
    assert gqa.qkv.weight.shape == (h + 2 * groups * hd, h) and mha.qkv.weight.shape == (3 * h, h)

    def widen(t: torch.Tensor, repeat) -> torch.Tensor:
        q, k, v = t.split([h, groups * hd, groups * hd])
        k, v = (repeat(x.reshape(groups, hd, *x.shape[1:]), heads // groups).reshape(h, *x.shape[1:]) for x in (k, v))
        return torch.cat((q, k, v))

    x = torch.randn(2, 32, h)
    outs = {}
    for name, repeat in (("interleave", lambda x, n: x.repeat_interleave(n, dim=0)),
                         ("tile", lambda x, n: x.repeat(n, *[1] * (x.dim() - 1)))):
        with torch.no_grad():
            for (n, p), (n2, p2) in zip(gqa.named_parameters(), mha.named_parameters()):
                assert n == n2
                p2.copy_(widen(p, repeat) if n.startswith("qkv.") else p)
        outs[name] = mha(x, rope_tables(32, hd, 500, torch.float32))
    y = gqa(x, rope_tables(32, hd, 500, torch.float32))
    assert torch.allclose(y, outs["interleave"], atol=1e-5), (y - outs["interleave"]).abs().max()
    assert not torch.allclose(y, outs["tile"], atol=1e-3)  # the grouping is consecutive heads, not a cycle


def test_swiglu_mlp_and_rmsnorm_follow_their_formulas():
    """With the attention's output projection at 0 the block is x + W2 (silu(n W_gate^T) * (n W_up^T)),
    n = x / sqrt(mean(x^2) + 1e-5) * g: fc1's first f rows are the gate, the next f the up projection."""
    torch.manual_seed(1)
    blk = Block(shape_of(LLAMA))
    f = 176
    assert blk.fc.weight.shape == (2 * f, 64) and blk.fc_out.weight.shape == (64, f)
    assert all(p.dim() == 2 for n, p in blk.named_parameters() if not n.startswith("ln"))  # no biases
    assert dict(blk.ln2.named_parameters()).keys() == {"weight"}  # RMSNorm: a weight only
    with torch.no_grad():
        blk.proj.weight.zero_()
        blk.ln2.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 32, 64, dtype=torch.float64)
    blk.double()
    n = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * blk.ln2.weight
    gate, up = blk.fc.weight[:f], blk.fc.weight[f:]
    want = x + (n @ gate.T * torch.sigmoid(n @ gate.T)) * (n @ up.T) @ blk.fc_out.weight.T
    got = blk(x, rope_tables(32, 8, 500, torch.float64))
    assert torch.allclose(got, want, atol=1e-10), (got - want).abs().max()


# --- the whole model -------------------------------------------------------------------------------------
def _megatron_llama(world):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer import TransformerConfig

    from phoenix_hpc.engines.megatron_spec import gpt_model_kwargs, layer_spec, transformer_config_kwargs

    cfg = JobConfig.model_validate({"name": "m", "engine": "megatron", "data": {"path": "d"}, "model": LLAMA})
    tc = TransformerConfig(**transformer_config_kwargs(cfg), use_cpu_initialization=True)
    return GPTModel(config=tc, transformer_layer_spec=layer_spec(cfg), **gpt_model_kwargs(cfg))


def _from_megatron(name: str, t: torch.Tensor, heads: int, groups: int) -> tuple[str, torch.Tensor]:
    """A megatron-core GPTModel parameter as this GPT's: name, and the fused QKV rows regrouped from
    megatron-core's per-group [q of the group's heads, k, v] to [all q | all k | all v]."""
    name = (name.replace("embedding.word_embeddings", "tok_embed").replace("decoder.layers.", "blocks.")
            .replace("decoder.final_layernorm", "ln_f").replace("output_layer", "head")
            .replace("input_layernorm", "ln1").replace("pre_mlp_layernorm", "ln2")
            .replace("self_attention.linear_qkv", "qkv").replace("self_attention.linear_proj", "proj")
            .replace("mlp.linear_fc1", "fc").replace("mlp.linear_fc2", "fc_out"))
    if name.endswith("qkv.weight"):
        per = t.reshape(groups, heads // groups + 2, -1, t.shape[-1])
        t = torch.cat([per[:, : heads // groups].reshape(-1, t.shape[-1]), per[:, -2].reshape(-1, t.shape[-1]),
                       per[:, -1].reshape(-1, t.shape[-1])])
    return name, t


def test_llama_stage_computes_megatron_core_s_gpt_model(world1, monkeypatch):
    """The same weights in megatron-core's GPTModel (built on CPU from the same model section by the Megatron
    engine's own spec, transformer_impl local) and in the torch engine's GPT give the same logits."""
    from megatron.core.tensor_parallel.random import initialize_rng_tracker

    from phoenix_hpc.engines.megatron_parallel import destroy_parallel_state, init_parallel_state

    init_parallel_state(1, 1, timeout_s=30.0)
    initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)  # no dropout RNG (needs CUDA)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")  # where RotaryEmbedding moves inv_freq
    try:
        ref = _megatron_llama(world1).eval()
        ours = GPTStage(shape_of(LLAMA), 1, 0, seed=0).eval()
        theirs = dict(_from_megatron(n, p.detach(), 8, 2) for n, p in ref.named_parameters())
        assert theirs.keys() == dict(ours.named_parameters()).keys()
        ours.load_state_dict(theirs, strict=True)
        x = torch.randint(0, 256, (2, 32))
        mask = torch.triu(torch.ones(1, 1, 32, 32), diagonal=1).bool()  # True: masked (the causal mask)
        with torch.no_grad():
            want = ref(x, torch.arange(32).expand(2, 32), mask)
            got = ours(x)
    finally:
        initialize_rng_tracker(force_reset=True)
        destroy_parallel_state()
    assert got.shape == want.shape == (2, 32, 256)
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()


def test_llama_model_is_the_same_built_as_one_or_two_pipeline_stages():
    shape = shape_of(LLAMA)
    whole = GPTStage(shape, 1, 0, seed=5)
    s0, s1 = GPTStage(shape, 2, 0, seed=5), GPTStage(shape, 2, 1, seed=5)
    parts = {**dict(s0.named_parameters()), **dict(s1.named_parameters())}
    assert dict(whole.named_parameters()).keys() == parts.keys()
    assert all(torch.equal(p, parts[n]) for n, p in whole.named_parameters())
    assert "pos_embed.weight" not in parts and not any(n.endswith(".bias") for n in parts)
    x, y = torch.randint(0, 256, (2, 32)), torch.randint(0, 256, (2, 32))
    assert torch.allclose(lm_loss(whole(x), y), lm_loss(s1(s0(x)), y), atol=1e-6)
    # a stage to be loaded (a joining spare) has the same parameters, and no buffer left unset
    empty = empty_stage(shape, 2, 1, torch.float32, torch.device("cpu"))
    assert {n: p.shape for n, p in empty.named_parameters()} == {n: p.shape for n, p in s1.named_parameters()}
    assert list(empty.buffers()) == []


@pytest.mark.parametrize("model", [
    LLAMA, {**LLAMA, "add_bias_linear": True}, {**LLAMA, "normalization": "LayerNorm"},
    {**LLAMA, "position_embedding_type": "learned_absolute", "activation": "gelu"},
    {"layers": 2, "hidden_size": 64, "heads": 8, "seq_length": 32},
], ids=["llama", "bias", "layernorm", "gelu-learned", "gpt2"])
@pytest.mark.parametrize("pp", [1, 2])
def test_memory_plans_count_the_parameters_of_the_torch_engine_s_stage(model, pp):
    cfg = JobConfig.model_validate({"name": "t", "engine": "torch", "data": {"path": "d"}, "model": model,
                                    "parallelism": {"pp": pp}})
    for stage in range(pp):
        module = GPTStage(shape_of(model), pp, stage, seed=0)
        assert stage_params(cfg.model, pp, stage, 1) == sum(p.numel() for p in module.parameters())


def test_engine_trains_a_llama_shaped_model_on_cpu(small_dataset, world1):
    cfg = JobConfig.model_validate({
        "name": "t", "engine": "torch", "data": {"path": small_dataset}, "model": LLAMA,
        "parallelism": {"tp": 1, "pp": 1, "dp": 1},
        "training": {"steps": 12, "micro_batch_size": 2, "global_batch_size": 4, "lr": 3e-3, "warmup_steps": 2,
                     "seed": 11},
    })
    engine = TorchEngine(cfg, GridCoord(0, 0, 0), world1, TokenSamples(small_dataset, 32, 11, 256))
    params = dict(engine.model.named_parameters())
    assert params["blocks.0.fc.weight"].shape == (2 * 176, 64) and params["blocks.0.qkv.weight"].shape == (96, 64)
    assert "pos_embed.weight" not in params
    losses = [r.loss for r in train(engine, 12, 128)]
    assert all(math.isfinite(v) for v in losses)
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.2, losses  # real text: loss falls
