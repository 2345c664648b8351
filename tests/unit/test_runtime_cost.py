"""Checksum choice, CPU accounting of the protection path, buffer reuse across generations and the CPU
cost analysis of the benchmark (pure parts; the runtime's threads run end to end in tests/e2e)."""

from __future__ import annotations

import time

import pytest
import torch

from phoenix_hpc.bench.overhead import analyze_cpu
from phoenix_hpc.errors import ReplicationError
from phoenix_hpc.runtime import snapshot as S
from phoenix_hpc.runtime.checksum import CHECKSUMS, DEFAULT_CHECKSUM, checksum_function, combine
from phoenix_hpc.runtime.cpu_account import CATEGORIES, CpuAccount, Span, delta

from test_runtime_buffers import state


def _sealed(algo):
    opt, params = state(1)
    env = {"step": 4}
    lay = S.plan_layout(opt, params, {"shard_id": "opt/pp0/tp0/dp1", "envelope": env})
    buf = torch.zeros(lay.total_bytes, dtype=torch.uint8)
    S.copy_in(buf, lay, opt, params)
    sums = S.checksums(buf, lay, (S.OPT, S.PARAM), algo)
    c = S.seal(buf, lay, shard_id="opt/pp0/tp0/dp1", step=4, generation=1, grid={"tp": 1, "pp": 1, "dp": 2},
               coord={"pp": 0, "dp": 1, "tp": 0}, envelope=env, checksum=algo, sums=sums)
    return lay, buf, c, sums


@pytest.mark.parametrize("algo", CHECKSUMS)
def test_every_checksum_verifies_and_detects_a_flipped_bit(algo):
    lay, buf, c, sums = _sealed(algo)
    h, again = S.verify(buf, (S.OPT, S.PARAM))
    assert h.index["checksum"] == algo and again == c == combine([s for s, sl in zip(sums, lay.slots) if sl.part == S.OPT])
    slot = lay.slots[1]
    buf[slot.offset + 3] ^= 1
    with pytest.raises(ReplicationError, match=f"fails its checksum \\({algo}"):
        S.verify(buf, (S.OPT,))


def test_algorithms_differ_and_the_default_is_one_of_them():
    data = memoryview(bytes(range(256)) * 64)
    values = {a: checksum_function(a)(data) for a in CHECKSUMS}
    assert len(set(values.values())) == len(CHECKSUMS)
    assert DEFAULT_CHECKSUM in CHECKSUMS
    with pytest.raises(ReplicationError, match="unknown checksum .md5.; allowed: xxh3_64, crc32c, crc32, wsum64"):
        checksum_function("md5")


def test_an_index_naming_an_unknown_algorithm_is_refused():
    import struct
    import zlib

    lay, buf, c, _ = _sealed("crc32")
    a = buf.numpy()
    fields = list(struct.unpack("<8sIIIIQQQqq", a[:S.HEADER_BYTES].tobytes()))
    raw = a[S.HEADER_BYTES:S.HEADER_BYTES + fields[3]].tobytes()
    bad = raw.replace(b'"checksum":"crc32"', b'"checksum":"crc99"')
    assert bad != raw and len(bad) == len(raw)
    a[S.HEADER_BYTES:S.HEADER_BYTES + len(bad)] = list(bad)
    fields[4] = zlib.crc32(bad)
    a[:S.HEADER_BYTES] = list(struct.pack("<8sIIIIQQQqq", *fields))
    assert S.read_header(buf).index["checksum"] == "crc99"
    with pytest.raises(ReplicationError, match="unknown checksum 'crc99'"):
        S.verify(buf, (S.OPT,))


def test_cpu_account_counts_thread_cpu_time_not_sleep():
    acc = CpuAccount()
    with Span(acc, "checksum"):
        time.sleep(0.05)
    with Span(acc, "copy"):
        t0 = time.thread_time_ns()
        while time.thread_time_ns() - t0 < 30_000_000:  # 30 ms of this thread's CPU, however loaded the host
            pass
    t = acc.totals()
    assert set(t) == set(CATEGORIES)
    assert t["checksum"] < 10e6 and t["copy"] >= 30e6
    assert delta(acc.totals(), t) == dict.fromkeys(CATEGORIES, 0)


def _rank(rank, steps, tp=None):
    return {"rank": rank, "checksum": "crc32", "throughput_ns_per_byte": tp or {"memcpy": 0.1, "crc32": 0.3},
            "blocks": [{"mode": "off"}, {"mode": "on", "stats": {
                "snapshot_bytes": 1000, "sent_bytes": 400, "received_bytes": 400, "cpu_ns_per_step": steps}}]}


def test_analyze_cpu_per_protected_byte_against_the_measured_limit():
    step = {"copy": 100, "checksum": 300, "mpi": 50, "bookkeeping": 50}
    first = {"copy": 10**9, "checksum": 0, "mpi": 0, "bookkeeping": 0}  # dropped: the block's first step
    out = analyze_cpu([_rank(0, [first, step, step])])
    (p,) = out["ranks"]
    assert p["steps"] == 2 and p["ns_per_byte"] == {"copy": 0.1, "checksum": 0.3, "mpi": 0.05, "bookkeeping": 0.05}
    assert p["ns_per_byte_total"] == 0.5
    # limit: memcpy x (1000 + 400 + 400) + crc32 x (1000 + 400) = 180 + 420 = 600 ns
    assert p["limit_ns_per_byte"] == 0.6 and p["ratio"] == round(500 / 600, 2)
    assert out["ratio_median"] == p["ratio"]
    assert "mpi_floor_ns_per_byte" not in p  # this run did not measure the transport
    assert analyze_cpu([{"rank": 0, "blocks": [{"mode": "off"}]}]) == {"ranks": [], "ratio_median": None}


def test_the_h2h_wakeups_per_step_are_the_median_without_each_blocks_first_step():
    step = {"copy": 100, "checksum": 300, "mpi": 50, "bookkeeping": 50}
    r = _rank(0, [step, step, step, step])
    r["blocks"][1]["stats"]["wakeups_per_step"] = [500, 10, 30, 12]
    (p,) = analyze_cpu([r])["ranks"]
    assert p["h2h_wakeups_per_step"] == 12
    (old,) = analyze_cpu([_rank(0, [step, step])])["ranks"]  # a run before wake-ups were recorded
    assert old["h2h_wakeups_per_step"] is None


def test_the_mpi_category_is_set_against_the_bare_transports_floor():
    step = {"copy": 100, "checksum": 300, "mpi": 50, "bookkeeping": 50}
    (p,) = analyze_cpu([_rank(0, [step, step], tp={"memcpy": 0.1, "crc32": 0.3, "mpi": 0.025})])["ranks"]
    # floor: 0.025 ns per byte moved x (400 sent + 400 received) = 20 ns per step, over 1000 protected bytes
    assert p["mpi_floor_ns_per_byte"] == 0.02 and p["mpi_over_floor"] == 2.5


def test_a_rank_that_moved_no_replica_bytes_has_no_transport_floor():
    from phoenix_hpc.bench.overhead import mpi_floor

    assert mpi_floor(0.025, 0, 1000, 50.0) == {}  # no bytes moved: a ratio against 0 ns would be meaningless
    assert mpi_floor(0.0, 800, 1000, 50.0) == {}
    assert mpi_floor(None, 800, 1000, 50.0) == {}
    assert mpi_floor(0.025, 800, 1000, 50.0) == {"mpi_floor_ns_per_byte": 0.02, "mpi_over_floor": 2.5}


def test_the_transport_floor_needs_a_peer():
    from types import SimpleNamespace

    from phoenix_hpc.bench.throughput import measure_mpi

    assert measure_mpi(SimpleNamespace(Get_rank=lambda: 0, Get_size=lambda: 1)) is None


def test_the_cost_table_shows_the_h2h_wakeups_per_step_or_na():
    import json
    from pathlib import Path

    from phoenix_hpc.bench.report import render_markdown

    r = json.loads((Path(__file__).resolve().parents[2] / "BENCHMARKS.json").read_text())
    case = r["overhead"]["cases"][0]
    first, second = case["cpu"]["ranks"][:2]
    first["h2h_wakeups_per_step"] = 17.5
    second.pop("h2h_wakeups_per_step", None)  # a run before they were recorded
    rows = {line.split(" | ")[1]: line for line in render_markdown(r).splitlines()
            if line.startswith(f"| {case['name']} | ")}
    assert rows[str(first["rank"])].endswith("| 17.5 |")
    assert rows[str(second["rank"])].endswith("| n/a |")


def test_the_engine_bench_refuses_bad_arguments_before_mpi():
    import pytest

    from phoenix_hpc.bench.h2h_engine import main

    assert main(["--check-args"]) == 0
    assert main(["--check-args", "--busy-sleep-us", "1000", "--idle-sleep-ms", "4"]) == 0
    for bad in (["--mib", "inf"], ["--mib", "1e-9"], ["--step-s", "nan"], ["--steps", "0"], ["--chunk-bytes", "0"],
                ["--idle-sleep-ms", "0"], ["--idle-sleep-ms", "nan"], ["--idle-sleep-ms", "1001"],
                ["--idle-sleep-ms", "inf"], ["--busy-sleep-us", "0.5"],
                ["--busy-sleep-us", "3000"],  # above the engine's default cap of 2 ms
                ["--busy-sleep-us", "500", "--idle-sleep-ms", "0.4"]):
        with pytest.raises(SystemExit) as e:
            main(bad + ["--check-args"])
        assert e.value.code == 2
