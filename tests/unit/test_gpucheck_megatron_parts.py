"""The Megatron check's parts that run on CPU: the first-loss rule of megatron.learns, and the rebuild
recovery sequence of megatron.rebuild (run here with the torch engine on gloo: same calls, another engine)."""

from __future__ import annotations

import math

from phoenix_hpc.gpucheck.check_megatron import first_loss_problem


def test_a_first_loss_far_from_ln_vocab_fails_and_one_near_it_passes():
    assert first_loss_problem(math.log(256) + 0.2, 256) == ""
    halved = first_loss_problem(math.log(256) / 2, 256)  # a loss divided by two micro-batches
    assert "not within 1.0 nats of ln(256) = 5.545" in halved
    assert "not a finite number" in first_loss_problem(float("nan"), 256)
    assert "not a finite number" in first_loss_problem(None, 256)


CHILD = r"""
from phoenix_hpc.gpucheck.check_megatron import recovery_rebuild

want = ([r.loss for r in train(engine, 8, 128)][4:], engine.state_hash())
eng, recs, nums = recovery_rebuild(cfg, torch.device("cpu"), 128, 4, 8)
print("RESULT " + json.dumps({"want": want, "got": ([r.loss for r in recs], eng.state_hash()), "nums": nums,
                              "gen": eng.groups is not None}))
"""


def test_the_rebuild_sequence_continues_bitwise_from_the_protected_snapshot(child_result, torch_engine_child):
    out = child_result(torch_engine_child(4) + CHILD)
    assert out["got"] == out["want"] and len(out["got"][0]) == 4
    nums = out["nums"]
    assert nums["abort_method"] == "gloo:shutdown" and nums["save_at"] == 4 and out["gen"]
    assert nums["snapshot_pinned"] is False  # CPU: no page-locked memory; the GPU check requires it
