"""The protector with a k=0 placement (local snapshot only), driven as the GPU checks drive it, on CPU:
ABBA blocks, a flush whose committed snapshot equals the live state, the memory plan of 2 x snapshot.
Runs in a child process (MPI initialised there as a singleton, COMM_WORLD of size 1; gloo world of size 1)."""

from __future__ import annotations

CHILD = r"""
from mpi4py import MPI
from phoenix_hpc.gpucheck import protect

train(engine, 1, 64)
prot = protect.make_protector(engine, MPI.COMM_WORLD, torch.device("cpu"))
steps = protect.abba(engine, prot, 64, 2, 3)
summary = protect.summarize_abba(steps)
prot.flush(engine)
bad = protect.snapshot_matches(prot, engine)
engine.optimizer_shard()[0][1].add_(1.0)  # the check must see a difference
bad_after = protect.snapshot_matches(prot, engine)
state = sum(t.numel() * t.element_size() for _, t in engine.optimizer_shard() + engine.param_shard())
out = {"steps": steps, "summary": summary, "bad": bad, "bad_after": bad_after, "committed": prot.committed_step,
       "step": engine.step, "plan": prot.memory_plan.total_bytes, "snapshot": prot.memory_plan.snapshot_bytes,
       "state": state, "holders": list(prot.holders)}
prot.close()
local = prot.buffers.local
# one_copy of 9 MiB + 1 byte: chunked_copy copies it in three 4 MiB pieces and a short last one
out["contention"] = protect.contention(engine, prot, local.begin_write(local.target_idx()), 64, 3, (9 << 20) + 1)
out["step_after"] = engine.step
out["copy_only"] = protect.contention(engine, prot, local.begin_write(local.target_idx()), 64, 7, kinds=("copy",))
try:
    protect.contention(engine, prot, local.begin_write(local.target_idx()), 64, 1, kinds=("nap",))
except ValueError as e:
    out["bad_kind"] = str(e)
# the options a case passes through: the device checksum and chunked copies, the adaptive interval
p2 = protect.make_protector(engine, MPI.COMM_WORLD, torch.device("cpu"), checksum="wsum64",
                            d2h_copy_chunk_bytes=64, interval_cap=4)
train(engine, engine.step + 3, 64, protector=p2)
p2.flush(engine)
out["wsum_bad"] = protect.snapshot_matches(p2, engine)
out["wsum_algo"] = p2.checksum
out["wsum_cap"] = p2.interval_cap
p2.close()
print("RESULT " + json.dumps(out))
"""


def test_k0_protector_runs_abba_and_commits_the_live_state(child_result, torch_engine_child):
    out = child_result(torch_engine_child(2) + CHILD)
    assert [s["mode"] for s in out["steps"]][::3] == ["on", "off", "off", "on"]
    assert all(s["wait_ms"] == 0.0 for s in out["steps"] if s["mode"] == "off")
    assert out["summary"]["steps_on"] == out["summary"]["steps_off"] == 4  # 6 each, first of each block dropped
    assert out["bad"] == [] and len(out["bad_after"]) == 1
    assert out["committed"] == out["step"] == 13 and out["holders"] == []
    assert out["plan"] == 2 * out["snapshot"] and out["state"] < out["snapshot"] < out["state"] + (1 << 20)
    c = out["contention"]  # nine blocks of 3 unprotected steps, each beside one kind of background work
    assert out["step_after"] == out["step"] + 30  # and first 3 steps with no thread, the reference
    assert c["alone_ms_median"] > 0 and len(c["alone_steps_ms"]) == 2
    kinds = ("copy", "copy_chunked", "copy_coalesced", "checksum", "one_copy", "chunked_copy", "registered_copy", "gil", "host_copy")
    for kind in kinds:
        assert c[f"{kind}_only_ms_median"] > 0 and c[f"{kind}_passes_per_step"] > 0, kind
        assert len(c[f"{kind}_steps_ms"]) == 2, kind
    one = out["copy_only"]  # one kind asked: the reference and that kind, 6 kept steps each
    assert sorted(k for k in one if k.endswith("_only_ms_median")) == ["copy_only_ms_median"]
    assert len(one["copy_steps_ms"]) == len(one["alone_steps_ms"]) == 6
    assert "contention kinds ['nap']" in out["bad_kind"]
    assert out["wsum_bad"] == [] and out["wsum_algo"] == "wsum64" and out["wsum_cap"] == 4
    for kind in ("alone",) + kinds:
        ph = c[f"{kind}_phase_ms"]
        assert list(ph) == ["forward_backward", "reduce_gradients", "optimizer_step"], kind
        assert all(v > 0 for v in ph.values()) and sum(ph.values()) <= c[f"{kind}_ms_median" if kind == "alone" else f"{kind}_only_ms_median"] * 1.5


def test_phase_times_split_each_step_at_its_marks():
    from phoenix_hpc.gpucheck.protect import median_phases, phase_times

    marks = [("forward_backward", 0.0), ("reduce_gradients", 0.010), ("optimizer_step", 0.012), ("end", 0.015),
             ("forward_backward", 0.015), ("reduce_gradients", 0.045), ("wait_commit", 0.046),
             ("optimizer_step", 0.050), ("end", 0.051)]
    steps = phase_times(marks)
    assert steps == [{"forward_backward": 10.0, "reduce_gradients": 2.0, "optimizer_step": 3.0},
                     {"forward_backward": 30.0, "reduce_gradients": 1.0, "wait_commit": 4.0, "optimizer_step": 1.0}]
    assert median_phases(steps) == {"forward_backward": 20.0, "reduce_gradients": 1.5, "optimizer_step": 2.0}
    assert phase_times([]) == [] and median_phases([]) == {}
    from types import SimpleNamespace

    from phoenix_hpc.gpucheck.protect import step_medians

    recs = [SimpleNamespace(step_time_ms=t) for t in (500.0, 20.0, 30.0)]  # the first step is dropped
    assert step_medians(recs, steps + [steps[1]]) == (25.0, median_phases([steps[1], steps[1]]))
    assert step_medians(recs[:1], steps[:1]) == (500.0, median_phases(steps[:1]))  # one step: kept


def test_steps_ratio_is_the_ratio_of_medians_with_an_interval_around_it():
    from phoenix_hpc.gpucheck.protect import steps_ratio

    r = steps_ratio([110.0, 112.0, 111.0, 109.0, 110.0, 111.0], [100.0, 101.0, 99.0, 100.0, 100.0, 102.0])
    assert r["ratio"] == 1.105 and r["ratio_ci95"][0] <= 1.105 <= r["ratio_ci95"][1] and r["ratio_ci95"][0] > 1.0
