"""Pure statistics of the benchmarks: interleaving, warm-up, trimming, summaries, bootstrap ratio."""

import statistics
from pathlib import Path

import pytest

from phoenix_hpc.bench import stats as S
from phoenix_hpc.errors import BenchError


def test_interleaved_order_is_abba():
    assert S.interleaved_order(1) == [True, False]
    assert S.interleaved_order(3) == [True, False, False, True, True, False]
    # every two rounds: on and off occupy mirrored positions, so a linear drift cancels
    order = S.interleaved_order(2)
    pos_on = sum(i for i, x in enumerate(order) if x)
    pos_off = sum(i for i, x in enumerate(order) if not x)
    assert pos_on == pos_off
    with pytest.raises(BenchError, match="rounds"):
        S.interleaved_order(0)


def test_drop_warmup_and_trim():
    xs = [100.0] * 10 + [5.0, 1.0, 3.0, 2.0, 4.0, 50.0, 6.0, 7.0, 8.0, 9.0,
                         10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 17.0, 18.0, 19.0]
    kept = S.drop_warmup(xs, 10)
    assert len(kept) == 20 and 100.0 not in kept
    t = S.trim_slowest(kept, 0.05)  # 5 % of 20 = 1 value: the slowest (50.0)
    assert len(t) == 19 and max(t) == 19.0 and t == sorted(t)
    assert S.clean_steps(xs, 10, 0.05) == t
    assert S.trim_slowest([3.0], 0.5) == [3.0]  # at least one value kept
    with pytest.raises(BenchError, match="warm-up"):
        S.drop_warmup([1.0, 2.0], 2)
    with pytest.raises(BenchError, match="fraction"):
        S.trim_slowest([1.0], 1.0)


def test_quantile_matches_linear_interpolation():
    xs = [4.0, 1.0, 3.0, 2.0]
    assert S.quantile(xs, 0.0) == 1.0 and S.quantile(xs, 1.0) == 4.0
    assert S.quantile(xs, 0.5) == pytest.approx(2.5)
    assert S.quantile(xs, 0.25) == pytest.approx(1.75)
    assert statistics.quantiles(xs, n=4, method="inclusive") == pytest.approx(
        [S.quantile(xs, q) for q in (0.25, 0.5, 0.75)])


def test_summarize():
    s = S.summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s.n == 5 and s.median == 3.0 and s.min == 1.0 and s.max == 100.0
    assert s.iqr == pytest.approx(s.q75 - s.q25) and s.q25 == 2.0 and s.q75 == 4.0
    with pytest.raises(BenchError):
        S.summarize([])


def test_median_ratio_ci_contains_value_and_is_deterministic():
    on = [10.5 + 0.1 * (i % 7) for i in range(60)]
    off = [10.0 + 0.1 * (i % 5) for i in range(60)]
    r = S.median_ratio(on, off, resamples=500, seed=3)
    assert r.value == pytest.approx(statistics.median(on) / statistics.median(off))
    assert r.lo <= r.value <= r.hi
    assert r.lo > 1.0  # on is clearly slower than off here
    assert S.median_ratio(on, off, resamples=500, seed=3) == r
    same = S.median_ratio(off, off, resamples=500, seed=1)
    assert same.value == 1.0 and same.lo <= 1.0 <= same.hi


def test_median_ratio_ci_widens_with_noise():
    quiet = [10.0 + 0.01 * (i % 3) for i in range(40)]
    noisy = [10.0 + 3.0 * ((i * 7) % 5) for i in range(40)]
    a = S.median_ratio(quiet, quiet, resamples=400, seed=0)
    b = S.median_ratio(noisy, quiet, resamples=400, seed=0)
    assert (b.hi - b.lo) > (a.hi - a.lo)


def test_median_ratio_rejects_bad_input():
    with pytest.raises(BenchError, match="both sides"):
        S.median_ratio([], [1.0])
    with pytest.raises(BenchError, match="denominator"):
        S.median_ratio([1.0], [0.0])
    with pytest.raises(BenchError, match="level"):
        S.median_ratio([1.0], [1.0], level=1.0)


def test_job_step_times_take_the_slowest_rank():
    assert S.job_step_times([[1.0, 5.0], [2.0, 3.0]]) == [2.0, 5.0]
    with pytest.raises(BenchError, match="different numbers"):
        S.job_step_times([[1.0], [1.0, 2.0]])


def test_expected_memory_and_replay():
    # docs/design.md section 4: 2 x snapshot + 2k x optimizer shard
    assert S.expected_host_bytes(100, 30, 1) == 260
    assert S.expected_host_bytes(100, 30, 2) == 320
    assert S.expected_replay_steps(100) == 49.5
    assert S.expected_replay_steps(1) == 0.0
    assert S.disruption_ratio(300.0, 20.0) == 15.0
    with pytest.raises(BenchError):
        S.disruption_ratio(1.0, 0.0)


def _rank_file(rank, on_ms, off_ms, wait_ms=0.5):
    """A synthetic overhead_rank output: 2 warm-up steps, then ABBA blocks of 3 steps."""
    from phoenix_hpc.bench.stats import interleaved_order

    steps = [{"mode": "warmup", "block": -1, "step_ms": 999.0, "wait_ms": 0.0} for _ in range(2)]
    blocks = []
    for b, on in enumerate(interleaved_order(2)):
        for i in range(3):
            first = 500.0 if i == 0 else 0.0  # the first step of a block is dropped
            steps.append({"mode": "on" if on else "off", "block": b, "step_ms": (on_ms if on else off_ms) + first,
                          "wait_ms": wait_ms if on else 0.0})
        blocks.append({"mode": "on" if on else "off", "block": b, "rss_before_bytes": 100, "rss_after_bytes": 400,
                       "rss_after_close_bytes": 130, "buffers_resident_bytes": 260,
                       "stats": {"d2h_mean_s": 0.01, "h2h_mean_s": 0.02}})
    return {"rank": rank, "steps": steps, "blocks": blocks, "snapshot_bytes": 100, "optimizer_shard_bytes": 30,
            "host_buffer_bytes": 264, "held_replica_bytes": [32], "exact_rss": True}


def test_analyze_case_drops_warmup_and_first_block_steps():
    from phoenix_hpc.bench.overhead import Case, analyze_case

    ranks = [_rank_file(0, 110.0, 100.0), _rank_file(1, 120.0, 100.0)]  # the slowest rank sets the job's step
    c = analyze_case(ranks, Case("S-pp1", "S", 1, warmup=2, block_steps=3, rounds=2), trim=0.0)
    assert c["steps_on"] == 4 and c["steps_off"] == 4  # 2 blocks x (3 - 1) steps per mode
    assert c["step_ms_on"]["median"] == 120.0 and c["step_ms_off"]["median"] == 100.0
    assert c["ratio"]["value"] == pytest.approx(1.2)
    assert c["exposed_wait_ms"]["median"] == 0.5


def test_analyze_memory_against_the_formula():
    from phoenix_hpc.bench.overhead import Case, analyze_memory

    m = analyze_memory([_rank_file(0, 1.0, 1.0), _rank_file(1, 1.0, 1.0)], Case("mem", "S", 1, k=1, memory=True))
    r0 = m["ranks"][0]
    assert r0["expected_bytes"] == 260  # 2 x 100 + 2 x 1 x 30
    assert r0["measured_bytes"] == 270  # RSS at the block's end minus after close
    assert m["ratio_median"] == pytest.approx(270 / 260)


def test_summarize_top_keys_and_disruption_ratio():
    from phoenix_hpc.bench.run import summarize_top

    res = {"recovery": {"hotswap": [{"total_s": 10.0, "phases": {"detect": 2.0}},
                                    {"total_s": 20.0, "phases": {"detect": 4.0}}, {"error": "x"}],
                        "baseline": {"10": {"total_s": 40.0}, "100": {"total_s": 90.0}, "50": {"error": "y"}}}}
    top = summarize_top(res)
    assert top["hotswap_s"] == 15.0 and top["detect_s"] == 3.0
    assert top["ckpt_restart_s"] == {"10": 40.0, "100": 90.0}
    assert top["disruption_ratio"] == 6.0
    assert top["overhead_ratio"] is None and top["host_mem_ratio"] is None


def test_scrub_paths_removes_local_folders():
    from phoenix_hpc.bench.report import scrub_paths

    obj = {"error": "see /x/run/work/a.out", "list": ["/x/run/work", "/x/run/other"], "n": 3}
    out = scrub_paths(obj, {"/x/run/work": "<work>", "/x/run": "<repo>"})
    assert out == {"error": "see <work>/a.out", "list": ["<work>", "<repo>/other"], "n": 3}


def test_the_bench_fault_step_comes_after_the_first_checkpoint_is_complete():
    import random

    from phoenix_hpc.bench.recovery import draw_fault_step, drawn_lost_steps

    rng = random.Random(0)
    steps = [draw_fault_step(rng, 10) for _ in range(2000)]
    assert min(steps) == 11 and max(steps) == 20  # [K+1, 2K]: never the step whose checkpoint may be in flight
    assert sorted({s - 10 for s in steps}) == list(range(1, 11))  # steps lost since checkpoint 10: uniform on 1..K
    assert drawn_lost_steps(10) == 5.5


def test_the_overhead_section_says_which_thread_nice_it_ran_with():
    from phoenix_hpc.bench.report import thread_nice_sentence

    assert thread_nice_sentence([{"name": "S", "thread_nice": 0}, {"name": "M", "thread_nice": 0}]) == (
        "The copy and H2H threads ran with `resilience.thread_nice: 0` (the default: the training thread's priority).")
    assert thread_nice_sentence([{"name": "S", "thread_nice": 19}]) == \
        "The copy and H2H threads ran with `resilience.thread_nice: 19`."
    assert "S 0, M 19" in thread_nice_sentence([{"name": "S", "thread_nice": 0}, {"name": "M", "thread_nice": 19}])
    assert "was not recorded" in thread_nice_sentence([{"name": "S"}])


def test_the_full_overhead_plan_has_a_two_rank_case_held_to_the_two_rank_target():
    from phoenix_hpc.bench.overhead import plan_cases, target_ratio
    from phoenix_hpc.bench.report import case_label

    full = {c.name: c for c in plan_cases(False)}
    two = full["M-dp2"]
    assert (two.ranks, two.pp, two.k, two.grid) == (2, 1, 1, "pp=1 x dp=2") and not two.pinned
    # the model and batch of scripts/bench-overhead's defaults (--seq 256 --batch 24, micro = batch / ranks)
    assert (two.size, two.seq_length, two.global_batch, two.micro_batch) == ("M", 256, 24, 12)
    assert target_ratio(two) == 1.02 and target_ratio({"ranks": 2}) == 1.02
    bound = full["M-dp2-bound"]
    assert bound.bound and not two.bound and (bound.ranks, bound.seq_length, bound.global_batch) == (2, 256, 24)
    assert target_ratio(bound) == 1.02 and "bound to one core" in case_label({"ranks": 2, "bound": True})
    assert target_ratio(full["M-pp1"]) == 1.15 and target_ratio(full["M-pp1-pinned"]) == 1.02
    assert target_ratio({"name": "old run without ranks"}) == 1.15  # reports of earlier runs: 4 ranks
    assert all(c.ranks == 4 for c in plan_cases(True))  # the quick run keeps one job
    assert "2 ranks on the 2-core host, not bound to cores" in case_label({"ranks": 2, "seq_length": 256, "global_batch": 24})
    assert "sequence length 256, global batch 24" in case_label({"ranks": 2, "seq_length": 256, "global_batch": 24})
    assert "4 ranks sharing" in case_label({}) and "GPU-like" in case_label({"pinned": True, "ranks": 4})


def test_overhead_run_submits_one_job_per_rank_count_and_reads_each_cases_own_rank_files(tmp_path, monkeypatch):
    """overhead_rank numbers the cases of its own job from 0, so the 2-rank job's first case and the 4-rank
    job's first case must not read the same files."""
    import json as _json
    import re

    import yaml

    from phoenix_hpc.bench import jobs, overhead

    submitted, bodies = [], []

    def fake_submit(client, script_path, body, *, nodes, name, **kw):
        args = re.search(r"overhead_rank (.+)\n", body).group(1).split()
        out, cfgs = Path(args[0]), args[1:]
        submitted.append((nodes, out.name, len(cfgs)))
        bodies.append(body)
        for j, cfg in enumerate(cfgs):
            extra = _json.loads(Path(cfg).with_suffix(".bench.json").read_text())
            for r in range(nodes):  # off 100 ms; on 100 + the job's rank count, so the cases differ
                (out / f"case{j}.rank{r}.json").write_text(_json.dumps(_rank_file(r, 100.0 + nodes, 100.0)))
            assert extra["name"]
        return f"job{len(submitted)}"

    monkeypatch.setattr(jobs, "submit_batch", fake_submit)
    monkeypatch.setattr(jobs, "wait_job_end", lambda client, job_id, timeout_s: ("COMPLETED", 0.0))
    res = overhead.run(None, tmp_path, str(tmp_path / "data"), quick=False, log=lambda m: None)
    assert submitted == [(4, "4ranks", 7), (2, "2ranks", 2)]  # 2 memory + 4 + pinned on 4 ranks, then dp2 x2
    assert res["job_ids"] == ["job1", "job2"] and res["job_id"] == "job1"
    by = {c["name"]: c for c in res["cases"]}
    assert by["M-dp2"]["ranks"] == 2 and by["M-dp2"]["step_ms_on"]["median"] == 102.0
    assert by["M-dp2"]["params"] == jobs.model_params("M") + 128 * 256  # 256 positions instead of 128
    assert by["M-dp2-bound"]["bound"] and not by["M-dp2"]["bound"]
    extra = _json.loads((tmp_path / "overhead" / "case8.bench.json").read_text())
    assert extra["bound"] is True and extra["name"] == "M-dp2-bound"
    cfg = yaml.safe_load((tmp_path / "overhead" / "case7.yaml").read_text())  # the 2-rank case's job config
    assert cfg["model"]["seq_length"] == 256 and cfg["resources"]["nodes"] == 2
    assert (cfg["training"]["global_batch_size"], cfg["training"]["micro_batch_size"]) == (24, 12)
    assert by["M-pp1"]["ranks"] == 4 and by["M-pp1"]["step_ms_on"]["median"] == 104.0
    assert set(res["memory"]) == {"k1", "k2"}
    # the ranks run in the environment a job on the local cluster gets (phoenix submit's lines)
    from phoenix_hpc.profiles import load_profile
    from phoenix_hpc.slurm.render import environment_lines

    env = "".join(f"{ln}\n" for ln in environment_lines(load_profile("local")))
    assert "OMP_NUM_THREADS=1" in env
    assert all(b.startswith(env) for b in bodies) and len(bodies) == 2


def test_a_bound_rank_takes_one_core_by_its_rank_and_every_thread_of_its_process_follows():
    import os
    import threading

    from phoenix_hpc.bench.overhead_rank import bound_cpu, set_process_affinity
    from phoenix_hpc.errors import BenchError

    assert [bound_cpu([3, 1], r) for r in range(4)] == [1, 3, 1, 3]
    with pytest.raises(BenchError, match="no allowed CPU"):
        bound_cpu([], 0)
    allowed = os.sched_getaffinity(0)
    stop = threading.Event()
    th = threading.Thread(target=stop.wait)  # a thread started before the binding (as gloo's are)
    th.start()
    try:
        core = bound_cpu(sorted(allowed), 1)
        assert set_process_affinity({core}) >= 2
        assert os.sched_getaffinity(th.native_id) == {core} and os.sched_getaffinity(0) == {core}
    finally:
        set_process_affinity(allowed)
        stop.set()
        th.join()
    assert os.sched_getaffinity(0) == allowed


def test_the_machine_record_names_the_huge_page_setting(tmp_path):
    from phoenix_hpc.bench.jobs import machine_info
    from phoenix_hpc.bench.report import thp_phrase

    mode = tmp_path / "enabled"
    mode.write_text("always [madvise] never\n")
    m = machine_info(None, thp_path=str(mode), environ={})
    assert m["thp_mode"] == "madvise" and m["thp_mem_alloc_enable"] is None
    assert machine_info(None, thp_path=str(tmp_path / "none"), environ={"THP_MEM_ALLOC_ENABLE": "0"})[
        "thp_mem_alloc_enable"] == "0"
    assert machine_info(None, thp_path=str(tmp_path / "none"), environ={})["thp_mode"] is None
    phrase = thp_phrase({**m, "torch_huge_pages": False})
    assert phrase == ("; kernel THP mode madvise, the local profile's launcher.torch_huge_pages false, "
                      "THP_MEM_ALLOC_ENABLE in the submitting environment unset")
    assert "'0'" in thp_phrase({"thp_mode": None, "thp_mem_alloc_enable": "0", "torch_huge_pages": True})
    assert thp_phrase({"cpu": "x"}) == ""  # runs that did not record it


def test_ratio_interval_is_scipys_percentile_bootstrap():
    """The interval is ``scipy.stats.bootstrap``'s percentile interval of the same statistic, samples resampled
    independently, with the seed's generator; a side of one value stays that value in every resample."""
    import numpy as np
    from scipy import stats as sps

    on = [10.5 + 0.1 * (i % 7) + 0.03 * (i % 11) for i in range(50)]
    off = [10.0 + 0.1 * (i % 5) for i in range(40)]
    r = S.median_ratio(on, off, resamples=999, level=0.9, seed=5)
    ref = sps.bootstrap((on, off), lambda x, y, axis=-1: np.median(x, axis=axis) / np.median(y, axis=axis),
                        n_resamples=999, confidence_level=0.9, method="percentile", paired=False, vectorized=True,
                        rng=np.random.default_rng(5)).confidence_interval
    assert (r.lo, r.hi) == (pytest.approx(ref.low, abs=0), pytest.approx(ref.high, abs=0))
    one = S.mean_ratio([30.0], [1.0, 1.5, 0.5], seed=2)
    assert 30.0 / 1.5 <= one.lo < one.value == 30.0 < one.hi <= 30.0 / 0.5
    assert S.mean_ratio([30.0], [2.0]) == S.Ratio(value=15.0, lo=15.0, hi=15.0, level=0.95, resamples=2000)
