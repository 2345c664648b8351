"""`phoenix submit` bad input: exit code 2 and a message naming the field, never a traceback, nothing written.
Also --dry-run (prints the script, writes nothing) and --output."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from phoenix_hpc.cli.main import cli
from phoenix_hpc.data.format import INDEX_HEADER

ROOT = Path(__file__).resolve().parents[2]
GPT_SMALL = ROOT / "examples" / "gpt-small.yaml"


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def invoke(*args, env=None):
    return CliRunner().invoke(cli, ["submit", *map(str, args)], env=env)


def fake_dataset(tmp: Path) -> Path:
    """A dataset prefix whose .idx has the MMIDIDX header, version 1 (all that submit checks)."""
    (tmp / "ds.bin").write_bytes(b"")
    (tmp / "ds.idx").write_bytes(INDEX_HEADER + struct.pack("<Q", 1) + bytes(9))
    return tmp / "ds"


def write_cfg(tmp: Path, src: Path = GPT_SMALL, **changes) -> Path:
    data = yaml.safe_load(src.read_text())
    if "data" not in changes:  # a dry run refuses a dataset that is not here, as submit does: one beside tmp
        ds_dir = tmp.parent / f"{tmp.name}-data"
        ds_dir.mkdir(exist_ok=True)
        data["data"]["path"] = str(fake_dataset(ds_dir))
    for section, value in changes.items():
        if isinstance(value, dict):
            data.setdefault(section, {}).update(value)
        else:
            data[section] = value
    p = tmp / "cfg.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def assert_bad(result, *needles):
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    for n in needles:
        assert n in result.output, result.output


def test_dry_run_prints_script_and_writes_nothing(in_tmp):
    cfg = write_cfg(in_tmp)
    before = sorted(in_tmp.iterdir())
    r = invoke("--site", "local", cfg, "--dry-run")
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("#!/bin/bash") and "#SBATCH --no-kill" in r.stdout
    assert sorted(in_tmp.iterdir()) == before


def test_dry_run_output_file(in_tmp):
    r = invoke("--site", "perlmutter", ROOT / "examples" / "perlmutter-7b.yaml", "--dry-run", "--data-on-cluster", "--output", "job.sh")
    assert r.exit_code == 0, r.output
    assert (in_tmp / "job.sh").read_text() == r.stdout
    assert sorted(p.name for p in in_tmp.iterdir()) == ["job.sh"]


def test_dry_run_json(in_tmp):
    import json

    r = invoke("--site", "vista", ROOT / "examples" / "vista-7b.yaml", "--dry-run", "--data-on-cluster", "--json")
    d = json.loads(r.stdout)
    assert d["grid"] == {"tp": 1, "pp": 4, "dp": 8} and d["nodes"] == 32 and d["script"].startswith("#!/bin/bash")


def test_unknown_site(in_tmp):
    assert_bad(invoke("--site", "nosuch", GPT_SMALL, "--dry-run"), "site", "nosuch", "perlmutter")


def test_an_unknown_site_and_a_bad_config_are_listed_together(in_tmp):
    missing = in_tmp / "nope.yaml"
    r = invoke("--site", "nosuch", missing, "--dry-run")
    assert_bad(r, "unknown site 'nosuch'", "perlmutter", f"'{missing}' does not exist")
    bad = write_cfg(in_tmp, model={"layers": "four"})
    r = invoke("--site", "nosuch", bad, "--dry-run")
    assert_bad(r, "unknown site 'nosuch'", "model.layers", "once the site profile can be used")
    prof = in_tmp / "site.yaml"
    prof.write_text("name: x\nscheduler: {bogus: 1}\n")
    r = invoke("--site", prof, bad, "--dry-run")
    assert_bad(r, f"site profile {prof}: ", "scheduler.bogus", f"{bad}: model.layers")
    assert not list(in_tmp.glob("runs"))


def test_malformed_yaml(in_tmp):
    p = in_tmp / "bad.yaml"
    p.write_text("name: x\nmodel: {layers: [\n")
    assert_bad(invoke("--site", "local", p, "--dry-run"), "not valid YAML", "line")


def test_wrong_types(in_tmp):
    p = write_cfg(in_tmp, model={"layers": "four"}, resources={"nodes": -1})
    assert_bad(invoke("--site", "local", p, "--dry-run"), "model.layers", "resources.nodes")


def test_impossible_grid(in_tmp):
    p = write_cfg(in_tmp, parallelism={"tp": 1, "pp": 2, "dp": 3})
    assert_bad(invoke("--site", "local", p, "--dry-run"), "tp(1) x pp(2) x dp(3) = 6 does not match 4 nodes x 1 GPUs = 4")


@pytest.mark.parametrize("engine,path,allowed", [
    ("megatron", "rebind", "(allowed: auto, rebuild)"),
    ("torch", "restart", "Input should be 'auto', 'rebind' or 'rebuild'"),
])
def test_recovery_path_the_engine_cannot_run(in_tmp, engine, path, allowed):
    p = write_cfg(in_tmp, engine=engine, resilience={"recovery_path": path})
    assert_bad(invoke("--site", "local", p, "--dry-run"), "resilience.recovery_path", repr(path), allowed)
    assert not (in_tmp / "runs").exists()


def test_k_not_below_dp(in_tmp):
    p = write_cfg(in_tmp, resilience={"k": 2})
    assert_bad(invoke("--site", "local", p, "--dry-run"), "resilience.k: 2 must be < dp (2)")


def test_too_many_spares(in_tmp):
    p = write_cfg(in_tmp, resources={"spares": 3})
    assert_bad(invoke("--site", "local", p, "--dry-run"), "resources.spares", "limit of 6 nodes")


def test_time_over_qos_limit(in_tmp):
    p = in_tmp / "pm.yaml"
    data = yaml.safe_load((ROOT / "examples" / "perlmutter-7b.yaml").read_text())
    data["resources"].update(qos="debug", time_limit="02:00:00")
    p.write_text(yaml.safe_dump(data))
    assert_bad(invoke("--site", "perlmutter", p, "--dry-run", "--data-on-cluster"), "resources.time_limit", "QOS 'debug'", "00:30:00")


def test_unquoted_time_limit_is_explained(in_tmp):
    # YAML 1.1 reads an unquoted 12:00:00 as the base-60 integer 43200
    p = in_tmp / "pm.yaml"
    text = (ROOT / "examples" / "perlmutter-7b.yaml").read_text()
    data = yaml.safe_load(text)
    data["resources"]["time_limit"] = "TL"
    p.write_text(yaml.safe_dump(data).replace("time_limit: TL", "time_limit: 12:00:00"))
    assert yaml.safe_load(p.read_text())["resources"]["time_limit"] == 43200
    assert_bad(invoke("--site", "perlmutter", p, "--dry-run", "--data-on-cluster"), "resources.time_limit", "43200", '"12:00:00"',
               "also checked against site 'perlmutter', with resources.time_limit left out")


def test_a_key_given_twice_is_refused(in_tmp):
    p = in_tmp / "dup.yaml"
    p.write_text(GPT_SMALL.read_text().replace("parallelism:", "parallelism:\n  pp: 4", 1))
    assert_bad(invoke("--site", "local", p, "--dry-run"), "key 'pp' is given twice", "not valid YAML")


def test_pinning_forbidden_on_vista(in_tmp):
    r = invoke("--site", "vista", ROOT / "examples" / "vista-7b.yaml", "--dry-run", "--data-on-cluster", "--nodelist", "c[1-34]")
    assert_bad(r, "nodelist", "does not allow")


def test_failed_sbatch_leaves_nothing_behind(in_tmp):
    # a real sbatch pointed at an empty Slurm config fails at once; the run dir must not survive half-written
    conf = in_tmp / "empty-slurm.conf"
    conf.write_text("")
    env = {"SLURM_CONF": str(conf)}
    r = invoke("--site", "local", write_cfg(in_tmp, data={"path": str(fake_dataset(in_tmp))}), "--run-dir",
               in_tmp / "runs" / "x", env=env)
    assert_bad(r, "sbatch")
    assert not (in_tmp / "runs").exists()


def test_local_site_without_a_cluster_says_how_to_point_at_one(in_tmp):
    cfg = write_cfg(in_tmp, data={"path": str(fake_dataset(in_tmp))})
    r = invoke("--site", "local", cfg, "--run-dir", in_tmp / "runs" / "x", env={"SLURM_CONF": None})
    assert_bad(r, "sbatch", "SLURM_CONF is not set", 'eval "$(phoenix cluster env)"')
    assert not (in_tmp / "runs").exists()


def test_missing_dataset_is_refused_at_submit_and_at_dry_run_unless_it_is_on_the_cluster(in_tmp):
    p = write_cfg(in_tmp, data={"path": str(in_tmp / "nowhere" / "stdlib")})
    r = invoke("--site", "local", p, "--run-dir", in_tmp / "runs" / "x")
    assert_bad(r, "data.path", "nowhere/stdlib.idx", "not a Megatron indexed dataset", "nothing was submitted",
               "pass --data-on-cluster")
    assert not (in_tmp / "runs").exists()
    # a dry run refuses what the submit refuses
    assert_bad(invoke("--site", "local", p, "--dry-run"), "data.path", "nowhere/stdlib.idx", "nothing was written")
    # site local: the compute nodes are this machine, so the dataset cannot live only on them
    assert_bad(invoke("--site", "local", p, "--dry-run", "--data-on-cluster"),
               "--data-on-cluster: not on site local")
    # another site: a dataset on the cluster's file systems only, said explicitly: warned, dry run and submit alike
    rp = write_cfg(in_tmp, ROOT / "examples" / "perlmutter-7b.yaml", data={"path": str(in_tmp / "nowhere" / "ds")})
    assert_bad(invoke("--site", "perlmutter", rp, "--dry-run"), "data.path", "pass --data-on-cluster")
    r = invoke("--site", "perlmutter", rp, "--dry-run", "--data-on-cluster")
    assert r.exit_code == 0 and r.stdout.startswith("#!/bin/bash"), r.output
    assert "warning: data.path" in r.stderr and "--data-on-cluster: the compute nodes must read it" in r.stderr
    (in_tmp / "bad.idx").write_bytes(b"not an index")
    (in_tmp / "bad.bin").write_bytes(b"")
    r = invoke("--site", "local", write_cfg(in_tmp, data={"path": str(in_tmp / "bad")}), "--run-dir", in_tmp / "runs" / "y")
    assert_bad(r, "data.path", "no MMIDIDX header", "nothing was submitted")


def test_run_dir_in_use_is_refused(in_tmp):
    rd = in_tmp / "used"
    rd.mkdir()
    (rd / "config.yaml").write_text("name: old\n")
    cfg = write_cfg(in_tmp, data={"path": str(fake_dataset(in_tmp))})
    assert_bad(invoke("--site", "local", cfg, "--run-dir", rd), "already holds a job")
    assert (rd / "config.yaml").read_text() == "name: old\n"


PERLMUTTER_7B = ROOT / "examples" / "perlmutter-7b.yaml"
VISTA_7B = ROOT / "examples" / "vista-7b.yaml"


# --- engine megatron --------------------------------------------------------------------------------------
def test_submit_dry_run_prints_the_memory_estimate(in_tmp):
    r = invoke("--site", "vista", VISTA_7B, "--dry-run", "--data-on-cluster")
    assert r.exit_code == 0, r.output
    assert "# GPU memory per rank, estimated by phoenix_hpc.config.memory (one GPU of this site: 96 GB):" in r.output
    assert "optimizer shard" in r.output and "activations" in r.output
    assert list(in_tmp.iterdir()) == []


def test_submit_refuses_megatron_on_the_local_site(in_tmp):
    p = write_cfg(in_tmp, engine="megatron", data={"path": str(in_tmp / "d")})
    assert_bad(invoke("--site", "local", p, "--dry-run"), "engine: 'megatron' needs real CUDA GPUs",
               "node.gpu_model is null", "allowed here: torch")


def test_submit_refuses_an_unsupported_megatron_core(in_tmp, monkeypatch):
    import phoenix_hpc.engines.megatron_version as mv

    monkeypatch.setattr(mv, "installed_version", lambda: "0.12.3")
    assert_bad(invoke("--site", "vista", VISTA_7B, "--dry-run", "--data-on-cluster"),
               "engine: 'megatron' does not support the installed megatron-core 0.12.3", ">=0.16,<0.20")
    monkeypatch.setattr(mv, "installed_version", lambda: None)
    assert_bad(invoke("--site", "vista", VISTA_7B, "--dry-run", "--data-on-cluster"), "megatron-core, which is not installed here")


@pytest.mark.parametrize("model,parallelism,needle", [
    ({"num_query_groups": 5}, {}, "model.num_query_groups: 5 must divide model.heads (32)"),
    ({"num_query_groups": 2}, {"tp": 4}, "model.num_query_groups: 2 must be divisible by parallelism.tp (4)"),
    ({"normalization": "BatchNorm"}, {}, "normalization"),
    ({"position_embedding_type": "alibi"}, {}, "position_embedding_type"),
])
def test_submit_refuses_llama_options_megatron_cannot_build(in_tmp, model, parallelism, needle):
    p = write_cfg(in_tmp, PERLMUTTER_7B, model=model, parallelism=parallelism)
    assert_bad(invoke("--site", "perlmutter", p, "--dry-run", "--data-on-cluster"), needle)


def test_submit_refuses_a_config_that_cannot_fit(in_tmp):
    p = write_cfg(in_tmp, PERLMUTTER_7B, training={"micro_batch_size": 8, "global_batch_size": 512},
              megatron={"transformer_impl": "local", "attention_backend": None, "sequence_parallel": False,
                        "recompute_granularity": "none"})
    r = invoke("--site", "perlmutter", p, "--dry-run", "--data-on-cluster")
    assert_bad(r, "GPU memory: a rank needs about", "more than the 40 GB of one A100-40GB",
               "megatron.recompute_granularity: full", "megatron.sequence_parallel: true")
    assert list(in_tmp.iterdir()) == [p]


def test_dry_run_json_holds_every_warning_stderr_shows(in_tmp):
    import json

    r = invoke("--site", "perlmutter", ROOT / "examples" / "perlmutter-7b.yaml", "--dry-run", "--data-on-cluster", "--json")
    assert r.exit_code == 0, r.output
    printed = [line[len("warning: "):] for line in r.stderr.splitlines() if line.startswith("warning: ")]
    d = json.loads(r.stdout)
    assert printed and d["warnings"] == printed
    # the placeholder account of the example, and a dataset hint that fits a 32,000-token vocabulary
    assert any("'m0000_g' is the example's placeholder" in w for w in d["warnings"])
    (data_w,) = [w for w in d["warnings"] if "data.path" in w]
    assert "preprocess_data.py" in data_w and "model.vocab_size=32000" in data_w
    assert "phoenix data prepare SRC_DIR" not in data_w


def test_node_shortfall_warning():
    from phoenix_hpc.cli.submit import node_shortfall
    from phoenix_hpc.config.load import load_job_config
    from phoenix_hpc.config.resolve import resolve
    from phoenix_hpc.profiles import load_profile

    job = resolve(load_job_config(GPT_SMALL), load_profile("local"), run_dir="/tmp/x", default_python="python3")
    assert node_shortfall(job, 6, 6, None) is None
    w = node_shortfall(job, 5, 6, None)
    assert "5 usable node(s) of 6" in w and "needs 6 (4 active + 2 spare)" in w and "PENDING" in w


def test_one_invalid_field_does_not_hide_the_other_checks(in_tmp):
    # a wrong type and an unknown field (schema), k >= dp and too many spares (site checks): all listed at once
    p = write_cfg(in_tmp, training={"steps": "abc"}, model={"bogus": 1}, resilience={"k": 5},
                  resources={"spares": 50})
    r = invoke("--site", "local", p, "--dry-run")
    assert_bad(r, "training.steps: value 'abc'", "model.bogus: unknown field", "resilience.k: 5 must be < dp",
               "resources.spares: nodes(4) + spares(50) = 54 exceeds", "with model.bogus, training.steps left out")
    assert "not checked yet" not in r.output


def test_relation_problems_show_with_type_problems(in_tmp):
    p = write_cfg(in_tmp, training={"steps": "abc"}, parallelism={"pp": 3})
    r = invoke("--site", "local", p, "--dry-run")
    assert_bad(r, "training.steps: value 'abc'", "model.layers (4) must be divisible by parallelism.pp (3)",
               "not checked yet: the config against site 'local'")


def test_steps_option_overrides_training_steps(in_tmp):
    import json

    r = invoke("--site", "local", write_cfg(in_tmp), "--dry-run", "--json", "--steps", "1500")
    assert r.exit_code == 0, r.output
    assert "--steps 1500" not in json.loads(r.stdout)["script"]  # the config carries it, not the command line
    bad = invoke("--site", "local", write_cfg(in_tmp), "--dry-run", "--steps", "0")
    assert_bad(bad, "--steps: 0 is not allowed", "training.steps")


def test_steps_option_is_written_to_the_run_config(in_tmp, monkeypatch):
    from phoenix_hpc.cli import submit as submit_mod
    from phoenix_hpc.config.load import load_job_config

    cfg = submit_mod.with_steps(load_job_config(GPT_SMALL), 1500)
    assert cfg.training.steps == 1500 and cfg.name == "gpt-small"


# --- host memory and node failures planned at submit --------------------------------------------------------

VISTA_7B = ROOT / "examples" / "vista-7b.yaml"
PERLMUTTER_7B = ROOT / "examples" / "perlmutter-7b.yaml"
LLAMA_13B = {"layers": 40, "hidden_size": 5120, "heads": 40, "num_query_groups": 40, "ffn_hidden_size": 13824}


@pytest.mark.parametrize("site, src, per_node", [("vista", VISTA_7B, "17.50 GB per node = 1 rank(s)"),
                                                 ("perlmutter", PERLMUTTER_7B, "33.70 GB per node = 4 rank(s)")])
def test_dry_run_prints_planned_host_memory_and_node_failures(in_tmp, site, src, per_node):
    r = invoke("--site", site, src, "--dry-run", "--data-on-cluster")
    assert r.exit_code == 0, r.output
    assert "# Host memory PHOENIX holds per node" in r.stdout and per_node in r.stdout
    assert "# Node failures expected over the time limit: " in r.stdout
    assert "an assumption of the site profile" in r.stdout


def test_json_gives_host_memory_and_node_failures(in_tmp):
    import json

    r = invoke("--site", "vista", VISTA_7B, "--dry-run", "--data-on-cluster", "--json")
    d = json.loads(r.stdout)
    # stage 3 of pp=4: 1.75e9 parameters N; bf16 snapshot 2N + 12N/8, M = 2 x snapshot + 2 x 12N/8 = 10N
    assert d["host_memory"]["per_node_gb"] == pytest.approx(17.5, abs=0.05)
    assert d["host_memory"]["budget_gb"] == pytest.approx(0.9 * (120 - 8 - 6))
    nf = d["node_failures"]
    assert nf["expected"] == pytest.approx(32 * 24 / 50700) and nf["mttf_source"] == "assumption"
    assert nf["spares_needed"] == 1


def test_host_memory_that_cannot_fit_exits_2(in_tmp):
    p = write_cfg(in_tmp, VISTA_7B, model=LLAMA_13B, parallelism={"pp": 2}, resources={"nodes": 8},
                  resilience={"k": 3}, megatron={"recompute_granularity": "full"})
    assert_bad(invoke("--site", "vista", p, "--dry-run", "--data-on-cluster"), "host memory", "182.2", "per node", "budget 95.4 GB",
               "120 GB node.mem_gb", "resilience.k", "parallelism.tp or parallelism.pp", "resources.nodes")
    assert list(in_tmp.iterdir()) == [p]


def test_host_memory_close_to_the_budget_warns_also_in_json(in_tmp):
    import json

    p = write_cfg(in_tmp, VISTA_7B, model=LLAMA_13B, parallelism={"pp": 4}, resources={"nodes": 16},
                  resilience={"k": 3}, megatron={"recompute_granularity": "full"})
    r = invoke("--site", "vista", p, "--dry-run", "--data-on-cluster", "--json")
    assert r.exit_code == 0, r.output
    warn = [w for w in json.loads(r.stdout)["warnings"] if w.startswith("host memory")]
    assert len(warn) == 1 and "of the 95.4 GB budget" in warn[0]
    assert "warning: host memory" in r.stderr


def test_fewer_spares_than_needed_warns_also_in_json(in_tmp):
    import json

    p = write_cfg(in_tmp, VISTA_7B, resources={"spares": 0})
    r = invoke("--site", "vista", p, "--dry-run", "--data-on-cluster", "--json")
    assert r.exit_code == 0, r.output
    warn = [w for w in json.loads(r.stdout)["warnings"] if "needed for P(no shrink)" in w]
    assert len(warn) == 1 and "resources.spares: 0 is fewer than the 1 needed" in warn[0]
    assert "[assumption of the site profile]" in warn[0]
    assert "needed for P(no shrink)" in r.stderr


def test_the_table_after_a_submit_shows_host_memory_and_node_failures(capsys):
    import sys

    from phoenix_hpc.cli.submit import _print_submitted
    from phoenix_hpc.config import load_job_config
    from phoenix_hpc.config.resolve import resolve
    from phoenix_hpc.profiles import load_profile

    job = resolve(load_job_config(PERLMUTTER_7B), load_profile("perlmutter"), run_dir="/r", default_python=sys.executable)
    _print_submitted(job, "4242")
    out = " ".join(capsys.readouterr().out.split())
    assert "host memory" in out and "33.70 GB per node" in out
    assert "node failures" in out and "0.0151" in out and "an assumption of the site profile" in out


def test_heartbeat_rate_the_coordinator_cannot_serve_is_refused_naming_the_numbers(in_tmp):
    # 1700 + 8 nodes x 4 slots heartbeating every 0.1 s: 68,320 heartbeats/s, far beyond the measured capacity
    # (phoenix_hpc/control/capacity_table.py); the message names the field, the value and what is allowed
    from phoenix_hpc.control.capacity import load_capacity

    cap = load_capacity()
    assert 68320 > cap.max_messages_per_s  # the premise of this test
    p = write_cfg(in_tmp, resources={"nodes": 1700, "spares": 8, "account": "m0000_g", "qos": "regular",
                                     "time_limit": "01:00:00"},
                  training={"global_batch_size": 6800, "micro_batch_size": 1},
                  resilience={"heartbeat_interval_s": 0.1, "heartbeat_timeout_s": 4.0, "collective_timeout_s": 30.0})
    r = invoke("--site", "perlmutter", p, "--dry-run", "--data-on-cluster")
    assert_bad(r, "resilience.heartbeat_interval_s: 0.1 s with 6832 slots", "68,320 heartbeats/s",
               f"{cap.max_messages_per_s:,.0f}/s", "allowed: heartbeat_interval_s >=")
    assert not (in_tmp / "runs").exists()


def test_a_small_job_gets_no_control_plane_warning(in_tmp):
    r = invoke("--site", "local", write_cfg(in_tmp), "--dry-run")
    assert r.exit_code == 0, r.output
    assert "coordinator" not in r.output.split("#!/")[0]


def test_unsupported_checksum(in_tmp):
    p = write_cfg(in_tmp, resilience={"checksum": "md5"})
    assert_bad(invoke("--site", "local", p, "--dry-run"), "resilience.checksum", "'md5'",
               "Input should be 'xxh3_64', 'crc32c', 'crc32' or 'wsum64'")
    assert not (in_tmp / "runs").exists()


@pytest.mark.parametrize("nice, allowed", [(-1, "greater than or equal to 0"), (20, "less than or equal to 19"),
                                           ("low", "integer"), (True, "integer")])
def test_a_thread_nice_outside_0_to_19_exits_2(in_tmp, nice, allowed):
    p = write_cfg(in_tmp, resilience={"thread_nice": nice})
    assert_bad(invoke("--site", "local", p, "--dry-run"), "resilience.thread_nice",
               repr(nice) if isinstance(nice, str) else str(nice), allowed)
    assert not (in_tmp / "runs").exists()


@pytest.mark.parametrize("cap", [0, 6])
def test_a_protection_interval_cap_below_one_or_above_the_checkpoint_interval_exits_2(in_tmp, cap):
    p = write_cfg(in_tmp, resilience={"protect_every_max": cap, "checkpoint": {"interval_steps": 5}})
    assert_bad(invoke("--site", "local", p, "--dry-run"), "resilience.protect_every_max", str(cap),
               "allowed: 1 .. resilience.checkpoint.interval_steps = 5")
    assert not (in_tmp / "runs").exists()


def test_a_bad_interval_cap_does_not_hide_the_sections_other_problems(in_tmp):
    """The cap is checked on its own field, so the rest of the section is still checked: against the site
    (a failure-domain level the site lacks, k >= dp) and its relations (heartbeat order), all in one answer."""
    p = write_cfg(in_tmp, resilience={"protect_every_max": 0, "placement_levels": ["node", "cabinet"], "k": 5,
                                      "heartbeat_timeout_s": 50.0})
    r = invoke("--site", "local", p, "--dry-run")
    assert_bad(r, "resilience.protect_every_max: value 0",
               "need resilience.heartbeat_interval_s < resilience.heartbeat_timeout_s")
    p = write_cfg(in_tmp, resilience={"protect_every_max": 0, "placement_levels": ["node", "cabinet"], "k": 5})
    r = invoke("--site", "local", p, "--dry-run")
    assert_bad(r, "resilience.protect_every_max: value 0", "resilience.placement_levels: ['cabinet']",
               "resilience.k: 5 must be < dp")
    assert "no further problems" not in r.output


def test_every_relation_problem_of_the_section_is_listed_at_its_field(in_tmp):
    """The section's relation checks report every problem at once, each at the field it is about with its
    value, and the site re-check then leaves out only those fields, not the whole section."""
    p = write_cfg(in_tmp, resilience={"mode": "checkpoint-restart", "recovery_source": "checkpoint",
                                      "spares_exhausted": "shrink", "protect_every_max": 4,
                                      "placement_levels": ["switch"], "coordinator_timeout_s": 3.0})
    r = invoke("--site", "local", p, "--dry-run")
    assert_bad(r, "resilience.recovery_source: value 'checkpoint' -- needs resilience.mode 'phoenix'",
               "resilience.spares_exhausted: value 'shrink' -- needs resilience.mode 'phoenix'",
               "resilience.protect_every_max: value 4 -- needs resilience.enabled true and resilience.mode 'phoenix'",
               "resilience.placement_levels: ['switch'] must contain 'node'",
               "resilience.coordinator_timeout_s: value 3.0 -- must be more than resilience.heartbeat_timeout_s (4.0)")
    assert "with resilience left out" not in r.output and "resilience.placement_levels left out" in r.output


def test_a_relation_failing_on_a_default_still_lets_the_site_checks_run(in_tmp):
    """heartbeat_timeout_s 70 leaves the default coordinator_timeout_s (60) too short: that field is not in the
    file, so the re-check leaves out the section instead and still runs the site checks (here: more spares
    than the local site allows)."""
    p = write_cfg(in_tmp, resilience={"heartbeat_timeout_s": 70.0, "collective_timeout_s": 100.0},
                  resources={"spares": 40})
    r = invoke("--site", "local", p, "--dry-run")
    assert_bad(r, "resilience.coordinator_timeout_s: value 60.0 -- must be more than "
                  "resilience.heartbeat_timeout_s (70.0)", "resources.spares")
    assert "not checked yet" not in r.output


def test_a_relation_judged_on_a_refused_fields_default_is_left_out(in_tmp):
    """heartbeat_timeout_s of the wrong type is refused; the re-check with its default (10 s) would find the
    user's coordinator_timeout_s 8 too short, a problem of the default, not of the user's config."""
    p = write_cfg(in_tmp, resilience={"heartbeat_timeout_s": "x", "coordinator_timeout_s": 8.0})
    r = invoke("--site", "local", p, "--dry-run")
    assert_bad(r, "resilience.heartbeat_timeout_s: value 'x'")
    assert "coordinator_timeout_s: value 8.0" not in r.output


@pytest.mark.parametrize("section", [{"mode": "checkpoint-restart"}, {"enabled": False}])
def test_an_interval_cap_without_phoenix_protection_exits_2(in_tmp, section):
    """With nothing protected the cap would do nothing: refused, as the other phoenix-only fields are."""
    p = write_cfg(in_tmp, resilience={"protect_every_max": 4, **section})
    r = invoke("--site", "local", p, "--dry-run")
    assert_bad(r, "resilience.protect_every_max: value 4 -- needs resilience.enabled true and resilience.mode "
               "'phoenix'", "allowed with them: 1")
    assert "resilience: resilience." not in r.output  # the field is named once
    p = write_cfg(in_tmp, resilience={"protect_every_max": 1, **section})
    assert invoke("--site", "local", p, "--dry-run").exit_code == 0


@pytest.mark.parametrize("threads", [0, 65, "many", True])
def test_a_checksum_thread_count_outside_1_to_64_or_auto_exits_2(in_tmp, threads):
    p = write_cfg(in_tmp, resilience={"checksum_threads": threads})
    assert_bad(invoke("--site", "local", p, "--dry-run"), "resilience.checksum_threads",
               repr(threads) if isinstance(threads, str) else str(threads),
               "allowed: 'auto' or an integer from 1 to 64")
    assert not (in_tmp / "runs").exists()


@pytest.mark.parametrize("code,vocab,refused", [(1, 100, "ids up to 255); use vocab_size >= 256"),
                                                (2, 100, "int8 (ids up to 127); use vocab_size >= 128"),
                                                (1, 256, None), (4, 100, None)])
def test_a_vocabulary_the_dataset_outgrows_is_refused_at_submit_also_in_a_dry_run(in_tmp, code, vocab, refused):
    """A dataset that is readable here decides what the ranks would refuse before they train: a model whose
    vocabulary cannot hold every id of the dataset's one-byte tokens (exit 2, nothing written); wider tokens
    are the tokenizer's (not checked here)."""
    (in_tmp / "ds.bin").write_bytes(b"")
    (in_tmp / "ds.idx").write_bytes(INDEX_HEADER + struct.pack("<Q", 1) + bytes([code]) + bytes(8))
    cfg = write_cfg(in_tmp, model={"vocab_size": vocab}, data={"path": str(in_tmp / "ds")})
    r = invoke("--site", "local", cfg, "--dry-run")
    if refused is None:
        assert r.exit_code == 0, r.output
        return
    assert_bad(r, f"model.vocab_size ({vocab}) is too small for dataset", refused, "nothing was written or submitted")
    assert sorted(p.name for p in in_tmp.iterdir()) == ["cfg.yaml", "ds.bin", "ds.idx"]


def test_a_python_that_is_not_here_is_refused_on_the_local_site_and_warned_elsewhere(in_tmp):
    """``--python`` is what the batch script starts the coordinator and the ranks with: on site local the compute
    nodes are this machine, so one that is not here is refused before anything is submitted (the job used to
    start and fail at once: "the coordinator exited before it was ready"), at a dry run too; another site
    warns."""
    cfg = write_cfg(in_tmp, data={"path": str(fake_dataset(in_tmp))})
    r = invoke("--site", "local", cfg, "--run-dir", in_tmp / "runs" / "x", "--python", "/nonexistent/python")
    assert_bad(r, "--python", "'/nonexistent/python'", "not an executable file", "nothing was submitted")
    assert not (in_tmp / "runs").exists()
    assert_bad(invoke("--site", "local", cfg, "--dry-run", "--python", "/nonexistent/python"),
               "--python", "'/nonexistent/python'", "nothing was written")
    r = invoke("--site", "local", cfg, "--dry-run", "--python", "python3")  # a command on PATH is fine
    assert r.exit_code == 0 and "--python" not in r.stderr


def test_a_warmup_that_does_not_end_before_the_last_step_is_warned_by_name(in_tmp):
    import json

    from phoenix_hpc.config.resolve import warmup_warning

    assert warmup_warning(5, 50, "cosine") is None and warmup_warning(0, 1, "cosine") is None
    assert "to 0.5 x training.lr" in warmup_warning(100, 50, "cosine")
    r = invoke("--site", "local", write_cfg(in_tmp, training={"warmup_steps": 100}), "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    (w,) = [w for w in json.loads(r.stdout)["warnings"] if "warmup_steps" in w]
    assert "training.warmup_steps (100) is not less than training.steps (50)" in w and "cosine decay" in w
    assert "warning: training.warmup_steps (100)" in r.stderr
    r = invoke("--site", "local", write_cfg(in_tmp), "--dry-run", "--json")
    assert not [w for w in json.loads(r.stdout)["warnings"] if "warmup_steps" in w]


def test_a_config_without_placement_levels_takes_the_site_s_and_one_that_gives_them_is_checked(in_tmp):
    data = yaml.safe_load((ROOT / "examples" / "vista-7b.yaml").read_text())
    assert data["resilience"].pop("placement_levels") == ["node", "leaf"]
    p = in_tmp / "nolevels.yaml"
    p.write_text(yaml.safe_dump(data))
    r = invoke("--site", "vista", p, "--dry-run", "--data-on-cluster")
    assert r.exit_code == 0, r.output  # the schema's default [node, switch] was refused on vista
    data["resilience"]["placement_levels"] = ["node", "switch"]
    p.write_text(yaml.safe_dump(data))
    assert_bad(invoke("--site", "vista", p, "--dry-run", "--data-on-cluster"),
               "resilience.placement_levels: ['switch'] are not failure-domain levels of site vista")
