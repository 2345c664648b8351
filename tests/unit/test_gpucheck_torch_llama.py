"""The ``torch_llama`` GPU check's items run on CPU (the same functions, device ``cpu``, gloo for NCCL): the
comparison passes, a wrong key/value head mapping or rotary table on the "device" side is reported as
failed, bad numbers are named, the engine learns, and the dry run lists both items."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from phoenix_hpc.engines import torch_gpt
from phoenix_hpc.gpucheck import CHECKS
from phoenix_hpc.gpucheck import check_torch_llama as C
from phoenix_hpc.gpucheck import run as R

CPU = torch.device("cpu")


def test_matches_cpu_passes_on_cpu_with_the_stated_tolerances():
    it = C.matches_item(CPU)
    assert it["name"] == "torch_llama.matches_cpu" and it["status"] == "passed", it["reason"]
    n = it["numbers"]
    assert n["max_abs_diff"] == 0.0 and n["logit_max_abs"] > 1.0  # the same device: the same numbers
    assert abs(n["bf16_loss_diff"]) < C.BF16_LOSS_TOL and n["fp32_rtol"] == C.FP32_RTOL
    assert n["loss_fp32_cpu"] == n["loss_fp32_device"]


class _Faulty(nn.Module):
    """A moved stage whose forward runs with a broken kernel, as a device with a wrong kernel would."""

    def __init__(self, stage: nn.Module, fault: str):
        super().__init__()
        self.stage, self.fault = stage, fault

    def forward(self, x):
        real_sdpa, real_rope = F.scaled_dot_product_attention, torch_gpt.rope_tables

        def tiled_sdpa(q, k, v, enable_gqa=False, **kw):  # query head i reads group i % groups, not i // (h/g)
            if enable_gqa:
                r = q.shape[1] // k.shape[1]
                k, v = k.repeat(1, r, 1, 1), v.repeat(1, r, 1, 1)
            return real_sdpa(q, k, v, **kw)

        def wrong_rope(seq, d, base, dtype, device=None):  # angles of another base (a shift of every position
            return real_rope(seq, d, 10 * base, dtype, device)  # by one would not show: RoPE is relative)

        saved = {}
        try:
            if self.fault == "gqa":
                saved["sdpa"] = torch_gpt.F.scaled_dot_product_attention
                torch_gpt.F.scaled_dot_product_attention = tiled_sdpa
            else:
                saved["rope"] = torch_gpt.rope_tables
                torch_gpt.rope_tables = wrong_rope
            return self.stage(x)
        finally:
            if "sdpa" in saved:
                torch_gpt.F.scaled_dot_product_attention = saved["sdpa"]
            if "rope" in saved:
                torch_gpt.rope_tables = saved["rope"]


@pytest.mark.parametrize("fault", ["gqa", "rope"])
def test_a_wrong_kv_head_mapping_or_rotary_table_on_the_device_fails_the_item(monkeypatch, fault):
    real_to = torch_gpt.GPTStage.to

    def to(self, *a, **kw):  # the moves to the "device" (the constructor's own cast passes a dtype)
        if a and isinstance(a[0], torch.device):
            return _Faulty(real_to(self, *a, **kw), fault)
        return real_to(self, *a, **kw)

    monkeypatch.setattr(torch_gpt.GPTStage, "to", to)
    it = C.matches_item(CPU)
    assert it["status"] == "failed" and "float32 logits differ from CPU's" in it["reason"], it
    n = it["numbers"]
    assert n["max_abs_diff"] > 100 * C.FP32_RTOL * n["logit_max_abs"]  # far beyond the tolerance


def test_match_problems_name_each_missed_tolerance():
    good = {"max_abs_diff": 1e-6, "logit_max_abs": 5.0, "loss_fp32_cpu": 6.2, "loss_fp32_device": 6.2,
            "loss_bf16_device": 6.21}
    assert C.match_problems(good) == []
    assert "more than 0.0001 x the largest CPU logit 5" in C.match_problems({**good, "max_abs_diff": 1e-3})[0]
    assert "nats from the CPU float32 loss" in C.match_problems({**good, "loss_bf16_device": 6.3})[0]
    assert "non-finite" in C.match_problems({**good, "loss_bf16_device": float("nan")})[0]


def test_an_exception_in_an_item_is_its_failure_with_a_reason(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("no kernel image is available for execution on the device")

    monkeypatch.setattr(C, "compare", boom)
    it = C.matches_item(CPU)
    assert it["status"] == "failed"
    assert it["reason"] == "RuntimeError: no kernel image is available for execution on the device"
    monkeypatch.setattr(C, "config", boom)
    it = C.learns_item(tmp_path, CPU)
    assert it["name"] == "torch_llama.learns" and it["status"] == "failed" and "RuntimeError" in it["reason"]


LEARNS = r"""
import json, sys
from pathlib import Path
import torch
from phoenix_hpc.gpucheck import check_torch_llama as C
import torch.distributed as dist

it = C.learns_item(Path(sys.argv[1]), torch.device("cpu"))
print("RESULT " + json.dumps({"item": it, "left": dist.is_initialized()}))
"""


def test_learns_trains_the_torch_engine_s_llama_on_cpu(child_result):
    out = child_result(LEARNS)
    it = out["item"]
    assert it["status"] == "passed", it
    n = it["numbers"]
    assert abs(n["loss_first"] - math.log(256)) < 1.0 and n["loss_first"] - n["loss_last"] > C.LEARN_DROP
    assert len(n["losses"]) == C.STEPS and not out["left"]  # the default group destroyed


def test_dry_run_lists_both_items_as_planned(tmp_path, capsys):
    assert CHECKS.index("torch_llama") == CHECKS.index("torch_engine") + 1
    assert R.dry_run(tmp_path, ["torch_llama"]) == 0
    rep = json.loads((tmp_path / "gpu-report.json").read_text())
    (check,) = rep["checks"]
    assert [i["name"] for i in check["items"]] == ["torch_llama.matches_cpu", "torch_llama.learns"]
    planned = json.loads(check["items"][0]["reason"][len("dry run (planned: "):-1])
    m = planned["model"]
    assert (m["position_embedding_type"], m["num_query_groups"], m["activation"], m["normalization"],
            m["add_bias_linear"]) == ("rope", 2, "swiglu", "RMSNorm", False)
    assert planned["match"] == {"init_method_std": 0.1, "fp32_rtol": 1e-4, "bf16_loss_tol": 0.05, "batch": 2}
