"""The hot-swap projection: each part's formula (phoenix_hpc.model.hotswap), the scaled job and its sizes
(phoenix_hpc.bench.hotswap_inputs), and ``phoenix model hotswap`` (CliRunner: output, sources, exit 2)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from phoenix_hpc.cli.main import cli
from phoenix_hpc.config.load import load_job_config
from phoenix_hpc.config.memory import estimate_gpu_memory, stage_params
from phoenix_hpc.errors import ModelError
from phoenix_hpc.model import hotswap as hs
from phoenix_hpc.bench import hotswap_inputs as hj
from phoenix_hpc.profiles import load_profile

REPO = Path(__file__).resolve().parents[2]

# the control-plane benchmark's runs as its record keeps them (BENCHMARKS.json control_plane.runs): plan and
# detection grow linearly with the rank count here; the coordinator's round (detect_to_quiesce_s + quiesce_s,
# which holds plan_s, + plan_delivered_s) is 0.15 s per 1,000 ranks; the 16,000-rank run is marked unusable
CP_RUNS = [
    {"ranks": 1000, "detect_exit_s": 0.10, "plan_s": 0.05, "plan_delivered_s": 0.05, "detect_silence_s": 10.1,
     "heartbeat_timeout_s": 10.0, "detect_to_quiesce_s": 0.01, "quiesce_s": 0.09},
    {"ranks": 2000, "detect_exit_s": 0.20, "plan_s": 0.10, "plan_delivered_s": 0.10, "detect_silence_s": 10.2,
     "heartbeat_timeout_s": 10.0, "detect_to_quiesce_s": 0.02, "quiesce_s": 0.18},
    {"ranks": 4000, "detect_exit_s": 0.40, "plan_s": 0.20, "plan_delivered_s": 0.20, "detect_silence_s": 10.4,
     "heartbeat_timeout_s": 10.0, "detect_to_quiesce_s": 0.04, "quiesce_s": 0.36},
    {"ranks": 16000, "detect_exit_s": -20.0, "plan_s": None, "error": "simulator artefact"},
]


def record(tmp_path: Path, control_plane: bool = True) -> Path:
    d = {"date": "2026-01-01T00:00:00+00:00", "commit": "abc", "detect_s": 0.05}
    if control_plane:
        d["control_plane"] = {"date": "2026-01-02", "runs": CP_RUNS}
    p = tmp_path / "BENCHMARKS.json"
    p.write_text(json.dumps(d))
    return p


# ---- formulas ----------------------------------------------------------------------------------------------

def test_detect_heartbeat_is_the_timeout_less_up_to_one_interval():
    e = hs.detect_heartbeat(30.0, 2.0)
    assert (e.seconds, e.low, e.high, e.origin) == (29.0, 28.0, 30.0, hs.COMPUTED)
    with pytest.raises(ModelError, match="heartbeat_interval_s"):
        hs.detect_heartbeat(2.0, 2.0)
    with pytest.raises(ModelError, match="heartbeat_timeout_s"):
        hs.detect_heartbeat(0.0, 1.0)


def test_detect_heartbeat_adds_the_measured_backlog_beyond_the_timeout():
    backlog = hs.Estimate(0.5, 0.25, 1.0, hs.MEASURED_HERE, "cp runs")
    e = hs.detect_heartbeat(30.0, 2.0, backlog)
    assert (e.seconds, e.low, e.high) == (29.5, 28.25, 31.0)
    assert e.origin == f"{hs.COMPUTED} + {hs.MEASURED_HERE}" and "cp runs" in e.source
    alone = hs.detect_heartbeat(30.0, 2.0, hs.missing("control-plane record missing"))
    assert alone.seconds == 29.0 and "not counted (control-plane record missing)" in alone.source


def test_control_plane_at_fits_the_runs_and_says_measured_or_extrapolated():
    pts = [(1000, 0.1), (2000, 0.2), (4000, 0.4)]
    inside = hs.control_plane_at(pts, 3000, "plan", "record X")
    assert inside.seconds == pytest.approx(0.3, rel=1e-3)
    assert inside.origin == hs.MEASURED_HERE and "record X" in inside.source
    assert inside.low <= inside.seconds <= inside.high
    far = hs.control_plane_at(pts, 100_000, "plan", "record X")
    assert far.origin == hs.EXTRAPOLATED_HERE
    assert far.seconds == pytest.approx(10.0, rel=1e-2)


def test_control_plane_at_with_too_few_runs_gives_no_number():
    e = hs.control_plane_at([(1000, 0.1), (4000, 0.4)], 1024, "plan", "record X")
    assert e.origin == hs.MISSING and e.seconds is None and "2 usable run(s)" in e.source


def test_detection_exit_prefers_the_control_plane_runs_then_the_local_figure():
    pts = [(1000, 0.1), (2000, 0.2), (4000, 0.4)]
    assert hs.detection_exit(pts, 2000, "cp", 0.05, "local").seconds == pytest.approx(0.2, rel=1e-3)
    local = hs.detection_exit(None, 2000, "control-plane record missing", 0.05, "BENCH")
    assert (local.seconds, local.origin) == (0.05, hs.MEASURED_HERE)
    assert "BENCH" in local.source and "control-plane record missing" in local.source
    for bad in (None, True, float("nan"), -1.0):
        assert hs.detection_exit(None, 2000, "cp", bad, "BENCH").origin == hs.MISSING


def test_quiesce_is_up_to_one_microbatch_and_replay_one_step():
    # the survivors abandon the step in flight and leave at the next module call: at most one micro-batch
    q = hs.quiesce(12.0, 64)
    assert (q.seconds, q.low, q.high) == pytest.approx((12.0 / 128, 0.0, 12.0 / 64))
    assert "section 12" in q.source
    with pytest.raises(ModelError, match="microbatches"):
        hs.quiesce(12.0, 0)
    r = hs.replay(12.0)
    assert (r.seconds, r.low, r.high) == (12.0, 12.0, 12.0)
    for f in (hs.quiesce, hs.replay):
        with pytest.raises(ModelError, match="--step-s"):
            f(float("nan"))


def test_init_laws_pass_through_the_published_points():
    linear, power = hs.init_laws(96_000)
    assert linear == pytest.approx(265.0) and power == pytest.approx(265.0)
    _, at512 = hs.init_laws(512)
    assert at512 == pytest.approx(29.8)
    assert hs.init_laws(960)[0] == pytest.approx(2.65)
    with pytest.raises(ModelError, match="--gpus"):
        hs.init_laws(0)


def test_rebuild_today_spans_both_laws_and_lazy_scales_by_the_published_ratio():
    stock = hs.rebuild_today(4096)
    linear, power = hs.init_laws(4096)
    assert (stock.low, stock.seconds, stock.high) == pytest.approx((linear, power, power))
    lazy = hs.rebuild_today(4096, lazy=True)
    assert lazy.seconds == pytest.approx(power * 24 / 265)
    assert stock.origin == hs.SCALED_PUBLIC and "2510.20171" in stock.source and "2607.01646" in stock.source


def test_shrink_laws_pass_through_the_quoted_points_and_the_rebuild_counts_the_splits():
    assert hs.shrink_s(32) == pytest.approx((1.4, 1.4))
    assert hs.shrink_s(1024) == pytest.approx((2.0, 2.0))
    lg, pw = hs.shrink_s(100_000)
    assert 2.0 < lg < pw < 4.0  # it grows slowly past the quoted range
    e = hs.rebuild_shrink(100_000, 3)
    assert (e.low, e.seconds, e.high) == pytest.approx((4 * lg, 4 * pw, 4 * pw))
    assert "unsourced" in e.source and e.origin == hs.UNSOURCED
    assert hs.rebuild_shrink(1024, 0).seconds == pytest.approx(2.0)


def test_transfer_is_the_node_state_over_its_nics_at_line_rate():
    e = hs.transfer(25e9, 4, 4, 200.0)  # 25 GB per rank, one 200 Gb/s NIC each: 1 s
    assert (e.seconds, e.low, e.high) == pytest.approx((1.0, 1.0, 1.0))
    assert hs.transfer(25e9, 4, 2, 200.0).seconds == pytest.approx(2.0)
    with pytest.raises(ModelError, match="node.nics"):
        hs.transfer(1e9, 1, 0, 200.0)
    with pytest.raises(ModelError, match="node.nic_gbps"):
        hs.transfer(1e9, 1, 1, 0.0)


def test_total_sums_the_parts_and_names_those_without_a_number():
    parts = {"a": hs.Estimate(1.0, 0.5, 2.0, hs.COMPUTED, ""), "b": hs.missing("no record"),
             "c": hs.Estimate(3.0, 3.0, 4.0, hs.PUBLISHED, "")}
    t = hs.total(parts)
    assert (t.seconds, t.low, t.high, t.left_out) == (4.0, 3.5, 6.0, ("b",))


def test_every_anchor_names_its_source_or_says_unsourced():
    for a in hs.ANCHORS:
        assert "arXiv" in a["source"] or a["source"].startswith("unsourced")


# ---- the scaled job and its sizes ---------------------------------------------------------------------------

def test_sizes_are_whole_replicas_on_whole_nodes_from_dp_k_plus_1():
    assert hj.gpu_step(4, 2, 4) == 8 and hj.gpu_step(1, 4, 1) == 4 and hj.gpu_step(3, 1, 4) == 12
    assert hj.min_gpus(4, 2, 4, 1) == 16 and hj.min_gpus(1, 4, 1, 2) == 12
    assert hj.max_gpus(1792, 2, 4, 2, 4) == 7160 and hj.max_gpus(None, 2, 4, 2, 4) is None


def test_site_limit_is_the_smallest_that_applies():
    vista = load_profile("vista")
    n, what = hj.site_max_nodes(vista, None, "gh")
    assert n == 64 and "gh" in what
    assert hj.site_max_nodes(vista, None, None)[0] == 600
    assert hj.site_max_nodes(load_profile("perlmutter"), "debug", None)[0] == 8


def test_check_gpus_refuses_each_kind_of_bad_size():
    with pytest.raises(ModelError, match="--gpus: 8 is not allowed; the example's smallest size is 16"):
        hj.check_gpus(8, 16, 7160, 8, "QOS", False)
    with pytest.raises(ModelError, match="multiples of 8"):
        hj.check_gpus(1001, 16, 7160, 8, "QOS", False)
    with pytest.raises(ModelError, match=r"multiples of 4 GPUs \(.*\) from 8 to 60; the nearest allowed: 60; or "
                                         "give --beyond-site"):
        hj.check_gpus(61, 8, 60, 4, "QOS", False)  # 64 is above what the site allocates: not suggested
    with pytest.raises(ModelError, match=r"from 8; the nearest allowed: 60$"):
        hj.check_gpus(61, 8, 60, 4, "QOS", True)
    with pytest.raises(ModelError, match=r"from 8; the nearest allowed: 60 or 64$"):
        hj.check_gpus(62, 8, 60, 4, "QOS", True)
    with pytest.raises(ModelError, match="at most 7160 GPUs.*--beyond-site"):
        hj.check_gpus(16384, 16, 7160, 8, "QOS", False)
    hj.check_gpus(16384, 16, 7160, 8, "QOS", True)  # obeyed with the flag


def test_nearest_sizes_lie_within_the_allowed_range():
    assert hj.nearest_sizes(61, 8, 60, 4) == [60] and hj.nearest_sizes(62, 8, None, 4) == [60, 64]
    assert hj.nearest_sizes(65, 8, 60, 4) == [60] and hj.nearest_sizes(10**20 + 1, 8, 60, 4) == [60]
    assert hj.nearest_sizes(-4, 8, 60, 4) == [8] and hj.nearest_sizes(0, 8, None, 4) == [8]
    assert hj.nearest_sizes(61, 8, 4, 4) == []  # the site holds less than the smallest size


@pytest.mark.parametrize("gpus, tail", [
    (65, "from 8 to 60; the nearest allowed: 60; or give --beyond-site"),  # above the site and not a multiple
    (64, "at most 60 GPUs to this job (its spare nodes included): sizes are multiples of 4 GPUs (whole tp x pp "
         "model replicas on whole nodes) from 8 to 60; the nearest allowed: 60; or give --beyond-site"),
    (0, "smallest size is 8 GPUs (dp >= resilience.k + 1 on whole nodes): sizes are multiples of 4 GPUs"),
    (-4, "from 8 to 60; the nearest allowed: 8"),
    (10**20, "from 8 to 60; the nearest allowed: 60; or give --beyond-site"),
])
def test_a_refused_size_names_the_allowed_range_and_its_nearest_size(gpus, tail):
    with pytest.raises(ModelError, match=f"^--gpus: {gpus} is not allowed") as e:
        hj.check_gpus(gpus, 8, 60, 4, "partition 'gh'", False)
    assert tail in str(e.value)


def test_a_site_smaller_than_the_smallest_size_says_no_size_fits():
    with pytest.raises(ModelError, match=r"--gpus: 8 is not allowed; .* at most 4 GPUs .* no size fits; give "
                                         "--beyond-site"):
        hj.check_gpus(8, 8, 4, 4, "partition 'gh-dev'", False)
    hj.check_gpus(8, 8, 4, 4, "partition 'gh-dev'", True)  # obeyed with the flag


def test_scaled_state_is_the_memory_estimates_weights_and_shrinking_shard():
    cfg = load_job_config(REPO / "examples" / "perlmutter-7b.yaml")
    dp, state, est = hj.scaled_state_bytes(cfg, 8, 1024)
    assert dp == 128
    n = stage_params(cfg.model, 2, est.stage, 4)
    assert est.weights == 2 * n and est.optimizer == pytest.approx(12 * n / 128)
    assert state == est.weights + est.optimizer
    scaled = cfg.model_copy(update={"training": cfg.training.model_copy(update={"global_batch_size": 64 * 128})})
    assert estimate_gpu_memory(scaled, 128).total == pytest.approx(est.total)  # the batch per replica kept
    assert hj.scaled_state_bytes(cfg, 8, 4096)[1] < state  # the shard shrinks with dp


def test_control_plane_points_read_usable_runs_or_say_the_record_is_missing():
    pts, what = hj.control_plane_points({"control_plane": {"date": "d", "runs": CP_RUNS}}, "plan_deliver_s")
    assert pts == [(1000, 0.1), (2000, 0.2), (4000, 0.4)] and "control-plane benchmark of d" in what
    own, _ = hj.control_plane_points({"date": "d", "runs": CP_RUNS}, "detect_exit_s")  # the benchmark's JSON
    assert own == [(1000, 0.1), (2000, 0.2), (4000, 0.4)]
    backlog, _ = hj.control_plane_points({"control_plane": {"runs": CP_RUNS}}, hj.SILENCE_BACKLOG)
    assert [n for n, _ in backlog] == [1000, 2000, 4000]
    assert [v for _, v in backlog] == pytest.approx([0.1, 0.2, 0.4])
    none, why = hj.control_plane_points({"detect_s": 0.1}, "plan_deliver_s")
    assert none is None and "control-plane record missing" in why


def test_control_plane_round_counts_the_quiesce_round_and_skips_what_is_not_a_number():
    pts, _ = hj.control_plane_points({"control_plane": {"runs": CP_RUNS}}, hj.CONTROL_ROUND)
    assert [n for n, _ in pts] == [1000, 2000, 4000]
    assert [v for _, v in pts] == pytest.approx([0.15, 0.3, 0.6])
    odd = [{"ranks": 1000, "plan_s": "0.1", "plan_delivered_s": 0.05}, {"ranks": True, "plan_s": 0.1,
           "plan_delivered_s": 0.1}, {"ranks": 0, "plan_s": 0.1, "plan_delivered_s": 0.1},
           {"ranks": 2000, "plan_s": 0.1, "plan_delivered_s": 0.1}]
    assert hj.control_plane_points({"control_plane": {"runs": odd}}, "plan_deliver_s")[0] == [(2000, 0.2)]


def test_read_record_names_the_control_plane_sections_own_date(tmp_path):
    d, what = hj.read_record(record(tmp_path))
    assert what == ("BENCHMARKS.json of 2026-01-01T00:00:00+00:00, commit abc; its control_plane section of "
                    "2026-01-02, commit ?")


def test_read_record_refuses_a_file_that_is_not_a_json_object(tmp_path):
    assert hj.read_record(tmp_path / "nope.json")[0] is None
    bad = tmp_path / "b.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ModelError, match="--benchmarks"):
        hj.read_record(bad)


# ---- the command --------------------------------------------------------------------------------------------

def run(*args):
    return CliRunner().invoke(cli, ["model", "hotswap", *args])


def test_command_projects_every_part_with_its_origin(tmp_path):
    r = run("--site", "perlmutter", "--step-s", "12.3", "--gpus", "1024", "--gpus", "4096", "--benchmarks",
            str(record(tmp_path)), "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert [p["gpus"] for p in d["projections"]] == [1024, 4096]
    p = d["projections"][0]
    parts = p["parts"]
    assert parts["plan_push"]["origin"] == hs.MEASURED_HERE  # within the runs' 1,000..4,000 ranks
    assert d["projections"][1]["parts"]["plan_push"]["origin"] == hs.EXTRAPOLATED_HERE  # 4,096 beyond them
    # the coordinator's whole round, its quiesce round included, not the plan and push alone (0.1024 s)
    assert parts["plan_push"]["seconds"] == pytest.approx(0.1536, rel=1e-2)
    assert "quiesce_s" in parts["plan_push"]["source"]
    assert parts["detection_exit"]["seconds"] == pytest.approx(0.1024, rel=1e-2)
    assert parts["detection_heartbeat"]["seconds"] == pytest.approx(29.0 + 0.1024, rel=1e-3)  # + the backlog
    # perlmutter-7b: 512 sequences per step, dp 8 on its site, micro-batch 1: 64 micro-batches per replica
    assert hj.microbatches(load_job_config(REPO / "examples" / "perlmutter-7b.yaml"), 8) == 64
    assert parts["quiesce"]["high"] == pytest.approx(12.3 / 64) and parts["replay"]["seconds"] == 12.3
    assert parts["rebuild_today"]["seconds"] == pytest.approx(hs.init_laws(1024)[1])
    assert parts["rebuild_shrink"]["source"].startswith("shrink + 3 splits over 1,032 ranks")
    assert p["world_with_spares"] == 1032 and p["dp"] == 128
    # 4 ranks of the node, each 1.68 GB of weights + a 12 n / 128 shard, over 4 x 200 Gb/s
    assert parts["transfer"]["seconds"] == pytest.approx(p["state_bytes_per_rank"] * 8 / 200e9)
    tot = p["totals"]["shrink"]["exit"]
    want = sum(parts[k]["seconds"] for k in ("detection_exit", "plan_push", "quiesce", "rebuild_shrink",
                                             "transfer", "replay"))
    assert tot["seconds"] == pytest.approx(want) and tot["left_out"] == []
    assert all(math.isfinite(x) for x in (tot["low"], tot["high"]))


def test_command_says_so_when_the_control_plane_record_is_missing(tmp_path):
    r = run("--site", "perlmutter", "--step-s", "12.3", "--gpus", "1024", "--benchmarks",
            str(record(tmp_path, control_plane=False)), "--json")
    assert r.exit_code == 0, r.output
    p = json.loads(r.output)["projections"][0]
    assert p["parts"]["plan_push"]["origin"] == hs.MISSING and p["parts"]["plan_push"]["seconds"] is None
    assert "control-plane record missing" in p["parts"]["plan_push"]["source"]
    assert p["parts"]["detection_exit"]["seconds"] == 0.05  # the local detect_s, said as such
    assert "control-plane record missing" in p["parts"]["detection_exit"]["source"]
    assert p["totals"]["today"]["exit"]["left_out"] == ["plan_push"]
    table = run("--site", "perlmutter", "--step-s", "12.3", "--gpus", "1024", "--benchmarks",
                str(record(tmp_path, control_plane=False)))
    assert "missing" in table.output and "leave out: plan_push" in table.output
    assert "value [low, high]" in table.output  # printed as text, not taken as a style tag


def test_default_sizes_within_the_site_and_beyond_it_only_when_asked(tmp_path):
    rec = str(record(tmp_path))
    d = json.loads(run("--site", "perlmutter", "--step-s", "12.3", "--benchmarks", rec, "--json").output)
    assert [p["gpus"] for p in d["projections"]] == [1024, 4096]
    assert d["skipped_default_sizes"] == [16384, 100000]
    d = json.loads(run("--site", "vista", "--step-s", "8.9", "--benchmarks", rec, "--beyond-site", "--json").output)
    assert [p["gpus"] for p in d["projections"]] == [1024, 4096, 16384, 100000]
    assert all(p["beyond_site"] for p in d["projections"])


@pytest.mark.parametrize("args, needle", [
    (["--site", "perlmutter", "--step-s", "1", "--gpus", "8"], "--gpus: 8 is not allowed; the example's smallest"),
    (["--site", "perlmutter", "--step-s", "1", "--gpus", "1001"], "--gpus: 1001 is not allowed; sizes are multiples"),
    (["--site", "perlmutter", "--step-s", "1", "--gpus", "16384"], "allocates at most 7160 GPUs"),
    (["--site", "vista", "--step-s", "1"], "none of the default sizes"),
    (["--site", "perlmutter", "--step-s", "1", "--gpus", "1024", "--gpus", "1024"], "--gpus: 1024 is given twice"),
    (["--site", "perlmutter", "--step-s", "1", "--gpus", "1024", "--benchmarks", "/"],
     "--benchmarks: '/' is not allowed; a directory, not a file"),
    (["--site", "local", "--step-s", "1", "--config", str(REPO / "examples" / "gpt-small.yaml")],
     "no node.nic_gbps"),
    (["--site", "perlmutter", "--step-s", "1", "--gpus", "1024", "--benchmarks", "no/such.json"],
     "--benchmarks: 'no/such.json' is not allowed; no such file"),
    (["--site", "perlmutter", "--gpus", "1024"], "--step-s: missing"),
    (["--site", "perlmutter", "--step-s", "0"], "--step-s: 0.0 is not allowed"),
    (["--site", "perlmutter", "--step-s", "1", "--config", "/nonexistent/job.yaml"], "does not exist"),
    (["--site", "nowhere", "--step-s", "1", "--config", str(REPO / "examples" / "perlmutter-7b.yaml")],
     "unknown site"),
    (["--site", "nowhere", "--step-s", "1"], "unknown site 'nowhere'"),
])
def test_bad_input_exits_2_naming_it(args, needle):
    r = run(*args)
    assert r.exit_code == 2, r.output
    assert needle in r.output
    assert "Traceback" not in r.output


def test_vista_refuses_a_size_above_its_partition_and_suggests_one_it_holds():
    r = run("--site", "vista", "--step-s", "9", "--gpus", "61")
    assert r.exit_code == 2 and "Traceback" not in r.output
    msg = " ".join(r.output.split())
    assert "--gpus: 61 is not allowed" in msg and "from 8 to 60; the nearest allowed: 60" in msg and "64" not in msg
    r = run("--site", "vista", "--step-s", "9", "--gpus", "64")
    assert r.exit_code == 2 and "--gpus: 64 is not allowed" in r.output
    assert run("--site", "vista", "--step-s", "9", "--gpus", "64", "--beyond-site", "--json").exit_code == 0


def test_a_site_profile_named_like_a_path_has_no_example(tmp_path):
    other = tmp_path / "odd.yaml"
    other.write_text((REPO / "sites" / "vista.yaml").read_text().replace("name: vista", "name: ../examples/vista"))
    r = run("--site", str(other), "--step-s", "9", "--gpus", "8")
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "not a plain file name" in " ".join(r.output.split()), r.output


def test_the_sources_table_names_each_columns_own_dp():
    r = run("--site", "perlmutter", "--step-s", "1", "--gpus", "1024", "--gpus", "4096")
    assert r.exit_code == 0, r.output
    flat = " ".join(r.output.split())
    assert "at dp 128" in flat and "at dp 512" in flat


def test_a_site_given_as_a_path_finds_its_profiles_example(tmp_path):
    r = run("--site", str(REPO / "sites" / "perlmutter.yaml"), "--step-s", "1", "--gpus", "1024", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["config"] == "examples/perlmutter-7b.yaml"
    other = tmp_path / "mysite.yaml"
    other.write_text((REPO / "sites" / "perlmutter.yaml").read_text().replace("name: perlmutter", "name: mysite"))
    r = run("--site", str(other), "--step-s", "1")
    assert r.exit_code == 2 and "site 'mysite' has no example examples/mysite-7b.yaml" in r.output, r.output


def test_a_config_that_cannot_be_read_exits_2(tmp_path):
    bad = tmp_path / "job.yaml"
    bad.write_text("name: x\nmodel: [1, 2\n")
    r = run("--site", "perlmutter", "--step-s", "1", "--config", str(bad))
    assert r.exit_code == 2 and "Traceback" not in r.output


def test_a_record_with_odd_runs_is_read_without_a_traceback(tmp_path):
    rec = tmp_path / "b.json"
    rec.write_text(json.dumps({"control_plane": {"runs": [{"ranks": 10, "plan_s": "a", "plan_delivered_s": 1},
                                                          {"ranks": 0, "detect_exit_s": 1.0}]}}))
    r = run("--site", "perlmutter", "--step-s", "1", "--gpus", "1024", "--benchmarks", str(rec), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["projections"][0]["parts"]["plan_push"]["origin"] == hs.MISSING
