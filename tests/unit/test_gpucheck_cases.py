"""The users' cases of the GPU check, on CPU: bytes per second of step from the examples, the sizing, the
verdicts (a ratio above target fails; a variant missing or broken fails)."""

from __future__ import annotations

import re

import pytest

from phoenix_hpc.gpucheck import check_cases as C


def test_each_example_gives_its_snapshot_over_its_step_from_the_memory_estimate():
    p, v = C.example_rate("perlmutter-7b.yaml"), C.example_rate("vista-7b.yaml")
    assert (p["tp"], p["pp"], p["dp"], p["gpus"]) == (4, 2, 8, 64) and (v["tp"], v["pp"], v["dp"], v["gpus"]) == (1, 4, 8, 32)
    # about 3 GB over 12.4 s and 6 GB over 8.9 s (the examples' own step times)
    assert 2.8e9 < p["snapshot_bytes_per_gpu"] < 3.1e9 and abs(p["step_s"] - 12.37) < 0.05
    assert 5.8e9 < v["snapshot_bytes_per_gpu"] < 6.3e9 and abs(v["step_s"] - 8.86) < 0.05
    assert p["bytes_per_step_s"] == round(p["snapshot_bytes_per_gpu"] / p["step_s"], -0) or \
        abs(p["bytes_per_step_s"] - p["snapshot_bytes_per_gpu"] / p["step_s"]) < 1e6
    assert p["sequence_parallel"] is True
    # a faster GPU shortens the step, raising the bytes per second
    assert C.example_rate("vista-7b.yaml", 2 * 7400.0)["bytes_per_step_s"] > 1.9 * v["bytes_per_step_s"]


@pytest.mark.parametrize("name", sorted(C.ASSUMED_TOKENS_PER_GPU_S))
def test_the_assumed_tokens_per_second_are_the_examples_own(name):
    text = (C.EXAMPLES_DIR / name).read_text()
    stated = re.search(r"assumed ([\d,]+) tokens/s per", text)
    assert stated and float(stated.group(1).replace(",", "")) == C.ASSUMED_TOKENS_PER_GPU_S[name]


def test_micro_batches_make_the_step_as_long_as_the_rate_asks():
    assert C.micro_batches_for(2_000_000_000, 1e9, 0.1) == 20  # 2 s of step at 0.1 s per micro-batch
    assert C.micro_batches_for(10, 1e9, 0.1) == 1


def test_fit_layers_sizes_a_case_down_for_time_and_memory():
    assert C.fit_layers(8, 1.0, 10, 20.0, 1e9, 1e12) == 8
    assert C.fit_layers(8, 1.0, 10, 5.0, 1e9, 1e12) == 4  # 10 s of steps in a 5 s budget: half the layers
    assert C.fit_layers(8, 1.0, 10, 20.0, 1e9, 3e9) == 3  # 3 GB free for 1 GB per layer
    assert C.fit_layers(8, 100.0, 10, 1.0, 1e9, 1e12) == 1


def test_variant_timeout_shares_what_is_left():
    assert C.variant_timeout(1000.0, 2) == C.VARIANT_BUDGET_S
    assert C.variant_timeout(105.0, 2) == 50.0
    assert C.variant_timeout(0.0, 1) == 1.0


def _nums(ratio):
    return {"ratio": ratio, "ratio_ci95": [ratio - 0.01, ratio + 0.01], "steps_on": 6, "steps_off": 6}


def test_a_ratio_above_its_target_fails_with_its_numbers():
    ok = C.verdict("d2h.vista_7b", {"default": _nums(1.01), "one_connection": _nums(1.015)}, [])
    assert ok["status"] == "passed" and ok["numbers"]["ratio"] == 1.01 and ok["numbers"]["one_connection.ratio"] == 1.015
    bad = C.verdict("d2h.vista_7b", {"default": _nums(1.01), "one_connection": _nums(1.3)}, [])
    assert bad["status"] == "failed" and "one_connection: ratio 1.3 > target 1.02" in bad["reason"]
    harsh = C.verdict("d2h.harsh", {"default": _nums(1.08), "one_connection": _nums(1.09)}, ["default: 20 -> 10 layers"])
    assert harsh["status"] == "passed" and harsh["numbers"]["sized_down"] == "default: 20 -> 10 layers"


def test_a_broken_or_missing_variant_fails():
    got = C.verdict("d2h.contention", {"default": {"error": "RuntimeError: boom"}}, [])
    assert got["status"] == "failed"
    assert "default: RuntimeError: boom" in got["reason"] and "one_connection: not measured" in got["reason"]


def test_the_plan_is_every_case_with_both_variants(tmp_path):
    plan = C.plan(tmp_path)
    assert set(C.ITEMS) - {"d2h.contention"} <= set(plan) and plan["kept_steps_per_mode"] >= 6
    assert plan["targets"] == {"d2h.perlmutter_7b": 1.02, "d2h.vista_7b": 1.02, "d2h.harsh": 1.10,
                               "d2h.contention": 1.05}
    assert plan["d2h.harsh"]["protect_every_max"] > 1 and 0.9e9 < plan["d2h.harsh"]["params"] < 1.1e9


CHILD = r"""
import json, sys
from pathlib import Path
import torch
from phoenix_hpc.gpucheck import check_cases as C, check_d2h
tiny = {"layers": 2, "hidden_size": 32, "heads": 4, "vocab_size": 256, "seq_length": 32, "dtype": "float32"}
C.USER_MODEL = tiny
C.USER_MBS = 2
check_d2h.MODEL = tiny
check_d2h.TRAINING = {**check_d2h.TRAINING, "micro_batch_size": 2, "global_batch_size": 2}
C.CASE_BUDGET_S = {"d2h.perlmutter_7b": 1e-6, "d2h.vista_7b": 60.0}  # perlmutter's must be sized down
res, saves = {}, []
C.measure(Path(sys.argv[1]), torch.device("cpu"), res, lambda: saves.append(sorted(k for k in res if k != "_notes")))
print("RESULT " + json.dumps({"res": res, "saves": saves}))
"""


def test_every_case_measures_on_cpu_and_a_case_too_long_for_its_budget_is_sized_down(child_result):
    """The code the GPU runs, on CPU tensors with tiny models (gloo instead of NCCL): the numbers of every case."""
    import os

    out = child_result(CHILD, timeout=600, env={**os.environ, C.SCALE_ENV: "0.5"})
    res = out["res"]
    assert res["_notes"]["d2h.harsh"][0] == "2 -> 1 layers: 0.50 of the variant's time was left"  # half the time
    assert out["saves"][-1] == sorted(C.ITEMS) and len(out["saves"]) == 4  # saved after every case
    for name in C.ITEMS:
        assert "error" not in res[name], (name, res[name])
        assert res[name]["ratio"] > 0 and len(res[name]["ratio_ci95"]) == 2, name
    for name in ("d2h.perlmutter_7b", "d2h.vista_7b", "d2h.harsh"):
        assert res[name]["steps_on"] == res[name]["steps_off"] == C.KEPT_PER_MODE >= 6, name
    assert res["d2h.contention"]["kept_steps"] == C.KEPT_PER_MODE and res["d2h.contention"]["copy_chunked_ratio"] > 0
    assert res["d2h.perlmutter_7b"]["layers"] == 1 and "2 -> 1 layers" in res["_notes"]["d2h.perlmutter_7b"][0]
    assert res["d2h.vista_7b"]["layers"] == 2 and res["_notes"]["d2h.vista_7b"] == []
    assert res["d2h.vista_7b"]["micro_batches"] >= 1 and res["d2h.vista_7b"]["bytes_per_step_s_target"] > 1e8
