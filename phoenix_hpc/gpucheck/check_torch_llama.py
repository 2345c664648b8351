"""Torch engine's built-in GPT in the Llama shape on CUDA: the same function as on CPU, and it learns.

The model is the ``megatron`` check's small Llama (:data:`MODEL`: 2 layers, hidden 128, 4 query heads in 2
key/value groups, rotary embeddings, SwiGLU with ffn 352, RMSNorm, no linear biases; vocabulary 256,
sequence 128), built by :class:`~phoenix_hpc.engines.torch_gpt.GPTStage`, whose attention calls
``F.scaled_dot_product_attention(..., enable_gqa=True)`` and whose rotary tables are computed on the device.

Items:

- ``torch_llama.matches_cpu``: two stages built from the same seed, one left on CPU, one moved to the
  device as the engine moves it, in float32, run one micro-batch (:data:`BATCH` sequences) with the same
  tokens: the largest logit difference is at most :data:`FP32_RTOL` times the largest CPU logit; the same
  stage built in bfloat16 on the device gives a loss within :data:`BF16_LOSS_TOL` nats of the CPU float32 loss
  (:func:`compare`, :func:`matches_item`). The weights are drawn with ``init_method_std`` :data:`MATCH_STD`
  (5 x the default), so that attention is far from uniform: then a wrong key/value head mapping or a wrong
  rotary table moves the logits by about their own size, far beyond the tolerance (tested on CPU);
- ``torch_llama.learns``: the torch engine (``create_engine``, the path of check ``torch_engine``: one rank,
  groups from the launcher's own ``init_generation``) trained :data:`STEPS` steps in bfloat16 with fp32
  ZeRO-1 AdamW state on the check's dataset: the first loss within ``FIRST_LOSS_TOL`` nats of ln(vocab)
  (:func:`~phoenix_hpc.gpucheck.check_megatron.first_loss_problem`) and the loss falls by more than
  :data:`LEARN_DROP` nats (:func:`learns_item`).

Both functions take the device, so the CPU test suite runs them with ``torch.device("cpu")`` (gloo instead of
NCCL); only the device differs on the GPU. An exception inside an item is that item's failure; the other
still runs.
"""

from __future__ import annotations

import math
from pathlib import Path

from phoenix_hpc.gpucheck import check_megatron, common
from phoenix_hpc.gpucheck.report import item

NAME = "torch_llama"
TIMEOUT_S = 60
ITEMS = ("torch_llama.matches_cpu", "torch_llama.learns")
MODEL = {**check_megatron.MODEL, **check_megatron.LLAMA}
TRAINING = {"steps": 12, "micro_batch_size": 4, "global_batch_size": 8, "lr": 3e-3, "warmup_steps": 2, "seed": 3}
STEPS, LEARN_DROP = TRAINING["steps"], check_megatron.LEARN_DROP
#: init_method_std of the matches_cpu models: 5 x megatron-core's default 0.02 (module doc)
MATCH_STD = 0.1
#: sequences in the matches_cpu micro-batch, and the seed of its tokens
BATCH, TOKEN_SEED = 2, 7
#: float32: largest |logit(device) - logit(CPU)| allowed, as a fraction of the largest |logit(CPU)|
FP32_RTOL = 1e-4
#: bfloat16 on the device: largest |loss(bf16, device) - loss(fp32, CPU)| allowed, nats/token
BF16_LOSS_TOL = 0.05
MATCH_LIMIT = (f"one forward pass of {BATCH} sequences of {MODEL['seq_length']} tokens: the attention and matmul "
               "kernels the device picks for this shape and dtype only, no backward pass")


def config(work: Path):
    """The job config of ``torch_llama.learns`` (CPU only; the dry run builds it)."""
    return common.job_config("torch", common.dataset(work), MODEL, TRAINING)


def shape(init_method_std: float = MATCH_STD):
    """The :class:`~phoenix_hpc.engines.torch_gpt.GPTShape` of :data:`MODEL` (as the engine derives it from the
    ``model`` section), weights drawn with ``init_method_std``."""
    from phoenix_hpc.engines.torch_gpt import GPTShape

    m = common.job_config("torch", "unused", {**MODEL, "init_method_std": init_method_std}, TRAINING).model
    return GPTShape(**{f: getattr(m, f) for f in GPTShape.__dataclass_fields__})


def plan(work: Path) -> dict:
    """Dry run: the config, the shape and the stage built on CPU (no CUDA call)."""
    from phoenix_hpc.engines.torch_gpt import GPTStage

    cfg = config(work)
    GPTStage(shape(), 1, 0, TRAINING["seed"])
    return {"model": cfg.model.model_dump(), "match": {"init_method_std": MATCH_STD, "fp32_rtol": FP32_RTOL,
                                                       "bf16_loss_tol": BF16_LOSS_TOL, "batch": BATCH}}


def compare(dev, gpt_shape=None) -> dict:
    """The numbers of ``torch_llama.matches_cpu`` on device ``dev`` (any torch device; CPU in the unit test):
    float32 stages built from seed ``TRAINING["seed"]`` on CPU and on ``dev``, one micro-batch of
    :data:`BATCH` x seq tokens (int64, drawn from :data:`TOKEN_SEED`), logits ``(BATCH, seq, vocab)``; and
    the bfloat16 stage on ``dev``. Returns ``max_abs_diff`` and ``logit_max_abs`` (float32 logits),
    ``loss_fp32_cpu``, ``loss_fp32_device``, ``loss_bf16_device`` (nats/token, fp32 cross entropy).

    Raises:
        what torch raises on ``dev``."""
    import torch

    from phoenix_hpc.engines.torch_gpt import GPTStage, lm_loss

    sh = gpt_shape or shape()
    seed = TRAINING["seed"]
    g = torch.Generator().manual_seed(TOKEN_SEED)
    x = torch.randint(0, sh.vocab_size, (BATCH, sh.seq_length + 1), generator=g)
    inp, tgt = x[:, :-1], x[:, 1:]
    with torch.no_grad():
        ref = GPTStage(sh, 1, 0, seed, torch.float32).eval()(inp)
        got = GPTStage(sh, 1, 0, seed, torch.float32).to(dev).eval()(inp.to(dev)).cpu()
        low = GPTStage(sh, 1, 0, seed, torch.bfloat16).to(dev).eval()(inp.to(dev))
        loss_low = lm_loss(low, tgt.to(dev)).item()
    return {"max_abs_diff": (got - ref).abs().max().item(), "logit_max_abs": ref.abs().max().item(),
            "loss_fp32_cpu": lm_loss(ref, tgt).item(), "loss_fp32_device": lm_loss(got, tgt).item(),
            "loss_bf16_device": loss_low}


def match_problems(n: dict) -> list[str]:
    """What of :func:`compare`'s numbers misses :data:`FP32_RTOL` or :data:`BF16_LOSS_TOL` (pure; empty: both
    met)."""
    out = []
    vals = [n["max_abs_diff"], n["logit_max_abs"], n["loss_fp32_cpu"], n["loss_bf16_device"]]
    if not all(math.isfinite(v) for v in vals):
        return [f"a non-finite number: {n}"]
    allowed = FP32_RTOL * n["logit_max_abs"]
    if n["max_abs_diff"] > allowed:
        out.append(f"float32 logits differ from CPU's by up to {n['max_abs_diff']:.3g}, more than {FP32_RTOL:g} x "
                   f"the largest CPU logit {n['logit_max_abs']:.3g} = {allowed:.3g}")
    d = abs(n["loss_bf16_device"] - n["loss_fp32_cpu"])
    if d > BF16_LOSS_TOL:
        out.append(f"bfloat16 loss {n['loss_bf16_device']:.4f} is {d:.4f} nats from the CPU float32 loss "
                   f"{n['loss_fp32_cpu']:.4f}, more than {BF16_LOSS_TOL}")
    return out


def matches_item(dev) -> dict:
    """``torch_llama.matches_cpu`` (module doc) on ``dev``; an exception is the item's failure."""
    try:
        n = compare(dev)
    except Exception as exc:  # noqa: BLE001 -- reported as this item's failure
        return item(ITEMS[0], "failed", f"{type(exc).__name__}: {str(exc)[:300]}", {}, MATCH_LIMIT)
    problems = match_problems(n)
    nums = {**{k: round(v, 6) if k.startswith("loss") else v for k, v in n.items()},
            "bf16_loss_diff": round(n["loss_bf16_device"] - n["loss_fp32_cpu"], 6), "fp32_rtol": FP32_RTOL,
            "bf16_loss_tol": BF16_LOSS_TOL, "init_method_std": MATCH_STD}
    return item(ITEMS[0], "failed" if problems else "passed", "; ".join(problems), nums, MATCH_LIMIT)


def learns_item(work: Path, dev) -> dict:
    """``torch_llama.learns`` (module doc): a generation of world size 1 (NCCL on CUDA, gloo on CPU), the
    engine of :func:`config` on ``dev``, :data:`STEPS` steps; the default group is destroyed afterwards. An
    exception is the item's failure."""
    import torch.distributed as dist

    from phoenix_hpc.engines.factory import create_engine
    from phoenix_hpc.launch.groups import Grid, init_generation
    from phoenix_hpc.launch.loop import train

    try:
        cfg = config(work)
        backend = "nccl" if dev.type == "cuda" else "gloo"
        kw = {"device_id": dev} if backend == "nccl" else {}
        groups, coord = init_generation(dist.HashStore(), 0, 0, Grid(1, 1, 1), backend, 120.0, **kw)
        try:
            eng = create_engine(cfg, coord, groups, dev)
            recs = train(eng, STEPS, cfg.training.global_batch_size * cfg.model.seq_length)
        finally:
            dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 -- reported as this item's failure
        return item(ITEMS[1], "failed", f"{type(exc).__name__}: {str(exc)[:300]}", {}, common.ONE_RANK)
    losses = common.losses(recs)
    why = check_megatron.first_loss_problem(losses[0], cfg.model.vocab_size)
    last = losses[-1]
    if not why and (last is None or not math.isfinite(last)):
        why = f"last loss {last!r} is not a finite number"
    drop = losses[0] - last if not why else 0.0
    if not why and not drop > LEARN_DROP:
        why = f"loss fell by {drop:.3f} nats over {STEPS} steps, not > {LEARN_DROP}"
    nums = {**common.step_numbers(recs), "steps": STEPS, "ln_vocab": round(math.log(cfg.model.vocab_size), 4),
            "learn_drop": LEARN_DROP, "losses": losses}
    return item(ITEMS[1], "failed" if why else "passed", why, nums, common.ONE_RANK)


def run(work: Path) -> list[dict]:
    dev = common.prepare_cuda()
    return [matches_item(dev), learns_item(work, dev)]
