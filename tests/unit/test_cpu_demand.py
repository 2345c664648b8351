"""Where the added step time goes on shared cores (bench/cpu_demand.py) and its lines in the report."""

from __future__ import annotations

import pytest

from phoenix_hpc.bench.cpu_demand import FIELDS, analyze_demand, demand_sentence
from phoenix_hpc.bench.overhead_rank import StepClocks, machine_cpu_ms


def _step(mode, block, wall, train, proc, idle=0.0, irq=0.0, steal=0.0):
    return {"mode": mode, "block": block, "step_ms": wall, "wait_ms": 0.0, "train_cpu_ms": train,
            "proc_cpu_ms": proc, "idle_ms": idle, "irq_ms": irq, "steal_ms": steal}


def _ranks(on_other: float, on_train: float = 40.0, on_wall: float = 60.0):
    """Two ranks on 2 cores: off steps 50 ms wall, each rank 40 ms training + 5 ms other, 10 ms idle;
    on steps with the given other-thread time per rank. The first step of each block is junk (dropped)."""
    def rank(r):
        steps = [_step("warmup", -1, 999, 999, 999)]
        for b, mode in enumerate(("off", "on", "on", "off")):
            steps.append(_step(mode, b, 999, 999, 999, 999))  # first of block
            for _ in range(3):
                if mode == "off":
                    steps.append(_step("off", b, 50.0, 40.0, 45.0, idle=10.0))
                else:
                    steps.append(_step("on", b, on_wall, on_train, on_train + on_other, idle=10.0, irq=2.0))
        return {"rank": r, "cores": 2, "steps": steps}
    return [rank(0), rank(1)]


def test_the_terms_add_up_to_cores_times_wall_and_the_change_is_located():
    d = analyze_demand(_ranks(on_other=14.0), protector_ms=17.0)
    assert d["steps"] == {"off": 6, "on": 6}
    for mode in ("off", "on"):
        assert d[mode]["capacity"] == pytest.approx(2 * d[mode]["wall_ms"])
    assert d["off"]["train"] == 80 and d["off"]["other"] == 10 and d["off"]["outside"] == 0
    assert d["on"]["other"] == 28 and d["on"]["irq"] == 2 and d["on"]["outside"] == 0
    # on: 120 core-ms = 80 train + 28 other + 2 irq + 10 idle + 0 outside
    assert d["delta"] == {"wall_ms": 10.0, "capacity": 20.0, "train": 0.0, "other": 18.0, "irq": 2.0,
                          "steal": 0.0, "idle": 0.0, "outside": 0.0}
    s = demand_sentence(d)
    assert s.startswith("CPU time (the cores were busy with more work); 10.0 ms more per step (mean of rank 0's "
                        "kept steps) on 2 cores 90% busy without protection: 20 core-ms")
    assert "the ranks' other threads +18 (the runtime's own accounting 17), interrupts +2 core-ms" in s
    assert "training threads" not in s  # a zero change is not listed


def test_a_slower_training_thread_is_what_it_names_first():
    d = analyze_demand(_ranks(on_other=5.0, on_train=50.0))
    s = demand_sentence(d)
    assert s.index("training threads +20") < s.index("interrupts +2")
    assert "own accounting" not in s


def test_runs_without_the_clocks_or_without_a_slower_step_give_nothing():
    ranks = _ranks(on_other=14.0)
    old = [dict(r, steps=[{k: v for k, v in s.items() if k not in FIELDS} for s in r["steps"]]) for r in ranks]
    assert analyze_demand(old) is None
    assert analyze_demand([{k: v for k, v in r.items() if k != "cores"} for r in ranks]) is None
    assert demand_sentence(None) is None
    assert demand_sentence(analyze_demand(_ranks(on_other=5.0, on_wall=50.0))) is None


def test_the_report_shows_the_table_and_names_the_cpu_time(tmp_path):
    from phoenix_hpc.bench.report import demand_lines, dominant_cost

    d = analyze_demand(_ranks(on_other=14.0), protector_ms=17.0)
    case = {"name": "S-pp1", "demand": d, "step_ms_on": {"median": 60.0}, "step_ms_off": {"median": 50.0},
            "exposed_wait_ms": {"median": 0.2}, "d2h_ms_mean": 1.0, "h2h_ms_mean": 1.0}
    got = dominant_cost(case)
    assert got.startswith("CPU time (the cores were busy with more work); 10.0 ms more")
    assert got.endswith("(exposed wait 0.20 ms per step; table below)")
    lines: list[str] = []
    demand_lines([case, {"name": "old", "demand": None}], lines.append)
    row = next(x for x in lines if x.startswith("| S-pp1 "))
    assert row == "| S-pp1 | 2 | 50 -> 60 (+10) | 80 -> 80 (+0) | 10 -> 28 (+18) | n/a | 17 | 0 -> 2 (+2) | 0 -> 0 (+0) | 10 -> 10 (+0) |"
    assert not any(x.startswith("| old ") for x in lines)
    empty: list[str] = []
    demand_lines([{"name": "old"}], empty.append)
    assert empty == []


def test_the_step_clocks_read_this_process_and_machine():
    from types import SimpleNamespace

    import psutil

    times = SimpleNamespace(user=1.0, nice=0.0, system=0.5, idle=10.0, iowait=0.2, irq=0.03, softirq=0.07,
                            steal=0.11)
    m = machine_cpu_ms(times)
    assert m == pytest.approx({"idle": 10200.0, "irq": 100.0, "steal": 110.0})
    with pytest.raises(RuntimeError, match="lack a field"):
        machine_cpu_ms(SimpleNamespace(user=1.0, idle=2.0))
    now = machine_cpu_ms()  # this machine's, through psutil
    assert now["idle"] >= psutil.cpu_times().idle * 1e3 * 0.99 and now["steal"] >= 0
    clocks = StepClocks()
    x = 0
    for i in range(200000):
        x += i
    lap = clocks.lap()
    assert set(lap) == {"train_cpu_ms", "proc_cpu_ms", "idle_ms", "irq_ms", "steal_ms"}
    assert 0 < lap["train_cpu_ms"] <= lap["proc_cpu_ms"] + 1.0


def test_threads_are_grouped_by_name_and_summed_over_ranks_per_step():
    from phoenix_hpc.bench.cpu_demand import thread_group, thread_groups

    assert [thread_group(n) for n in ("phoenix-copy#12", "phoenix-h2h#13", "gloo_tcp_loop#5",
                                      "pt_gloo_runloop#6", "MainThread#1", "python3#9")] == [
        "runtime", "runtime", "gloo", "gloo", "training", "other"]
    ranks = _ranks(on_other=14.0)
    for r in ranks:
        r["blocks"] = [
            {"mode": "off", "thread_cpu_ms_per_step": {"MainThread#1": 40.0, "gloo_tcp_loop#5": 4.0}},
            {"mode": "on", "thread_cpu_ms_per_step": {"MainThread#1": 41.0, "gloo_tcp_loop#5": 5.0,
                                                      "phoenix-copy#7": 3.0, "phoenix-h2h#8": 5.0}},
            {"mode": "on", "thread_cpu_ms_per_step": {"MainThread#1": 39.0, "gloo_tcp_loop#5": 5.0,
                                                      "phoenix-copy#9": 4.0, "phoenix-h2h#10": 6.0}},
        ]
    g = thread_groups(ranks)
    assert g["off"] == {"training": 80.0, "runtime": 0.0, "gloo": 8.0, "other": 0.0}
    assert g["on"] == {"training": 80.0, "runtime": 18.0, "gloo": 10.0, "other": 0.0}
    assert g["delta"] == {"training": 0.0, "runtime": 18.0, "gloo": 2.0, "other": 0.0}
    d = analyze_demand(ranks, protector_ms=17.0)
    assert d["threads"] == g
    assert "the ranks' other threads +18 (the runtime's threads +18, gloo's +2)" in demand_sentence(d)
    del ranks[1]["blocks"][0]["thread_cpu_ms_per_step"]
    assert thread_groups(ranks) is None


def test_thread_cpu_ms_reads_each_live_threads_own_clock():
    import threading

    from phoenix_hpc.bench.overhead_rank import thread_cpu_ms

    done, go = threading.Event(), threading.Event()

    def burn():
        x = 0
        for i in range(400000):
            x += i
        done.set()
        go.wait(5)

    t = threading.Thread(target=burn, name="phoenix-test-burner")
    t.start()
    done.wait(5)
    got = thread_cpu_ms()
    go.set()
    t.join()
    mine = {k.split("#")[0]: v for k, v in got.items()}
    assert mine["phoenix-test-burner"] > 1.0  # it ran a loop of 400 000 additions
    assert mine["MainThread"] > 0
    assert f"phoenix-test-burner#{t.native_id}" in got


def test_idle_time_that_grew_most_is_named_waiting_and_the_remainder_is_outside():
    ranks = _ranks(on_other=2.0, on_wall=70.0)  # on: 140 core-ms = 80 train + 4 other + 2 irq + idle + outside
    for r in ranks:
        for st in r["steps"]:
            if st["mode"] == "on" and st["step_ms"] == 70.0:
                st["idle_ms"] = 40.0  # the cores idled 30 ms more: the ranks waited for each other
    d = analyze_demand(ranks)
    assert d["delta"]["idle"] == 30.0 and d["on"]["outside"] == 14.0  # 140 - 80 - 4 - 2 - 40
    assert demand_sentence(d).startswith("waiting (the cores idled more); 20.0 ms more per step")
    skew = _ranks(on_other=14.0)
    skew[1]["steps"] = [dict(st, train_cpu_ms=st["train_cpu_ms"] + 5.0, proc_cpu_ms=st["proc_cpu_ms"] + 5.0)
                        if st["mode"] == "on" else st
                        for st in skew[1]["steps"]]  # rank 1's windows hold more than rank 0's wall
    assert analyze_demand(skew)["on"]["outside"] == -5.0
