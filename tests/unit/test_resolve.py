"""resolve(JobConfig, SiteProfile): derived dp, filled defaults, and every cross-check in one ConfigError."""

from __future__ import annotations

from pathlib import Path

import pytest

from phoenix_hpc.config import load_job_config
from phoenix_hpc.config.resolve import resolve
from phoenix_hpc.config.schema import JobConfig
from phoenix_hpc.errors import ConfigError
from phoenix_hpc.profiles import load_profile

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def job(**sections) -> JobConfig:
    d = {
        "name": "t",
        "data": {"path": "/data/x"},
        "training": {"micro_batch_size": 1, "global_batch_size": 64},
        "resources": {"nodes": 4, "spares": 1, "time_limit": "01:00:00", "account": "m1234_g"},
    }
    for k, v in sections.items():
        d[k] = {**d.get(k, {}), **v} if isinstance(v, dict) else v
    if d.get("parallelism", {}).get("tp", 1) > 1:  # engine torch has no tensor parallelism
        d.setdefault("engine", "megatron")
    return JobConfig.model_validate(d)


def run(cfg, site="perlmutter", **kw):
    return resolve(cfg, load_profile(site), run_dir="/runs/t", default_python="/venv/bin/python", **kw)


def problems(cfg, site="perlmutter", **kw) -> list[str]:
    with pytest.raises(ConfigError) as ei:
        run(cfg, site, **kw)
    return ei.value.problems


def test_dp_derived_and_defaults_filled():
    r = run(job(parallelism={"tp": 2, "pp": 2}))
    assert (r.tp, r.pp, r.dp, r.world_size) == (2, 2, 4, 16)
    assert r.total_nodes == 5 and r.gpus_per_node == 4 and r.time_limit_s == 3600
    c = r.config
    assert c.parallelism.dp == 4 and c.resources.gpus_per_node == 4
    assert (c.resources.qos, c.resources.constraint) == ("regular", "gpu")
    assert c.run_dir == "/runs/t" and r.python == "/venv/bin/python" and r.warnings == ()


def test_python_override_order():
    assert run(job(), python="/other/python").python == "/other/python"


def test_grid_mismatch_message_is_exact():
    (p,) = problems(job(parallelism={"tp": 2, "pp": 2, "dp": 3}))
    assert p == "parallelism: tp(2) x pp(2) x dp(3) = 12 does not match 4 nodes x 4 GPUs = 16"


def test_grid_not_divisible():
    (p,) = problems(job(parallelism={"tp": 3}, model={"heads": 3, "hidden_size": 96}))
    assert "tp(3) x pp(1) = 3 does not divide 4 nodes x 4 GPUs = 16" in p


def test_k_must_be_below_dp():
    ps = problems(job(parallelism={"tp": 4, "pp": 2}, resources={"nodes": 4}, resilience={"k": 2}))
    assert any(p.startswith("resilience.k: 2 must be < dp (2)") for p in ps), ps


def test_k_with_dp_one():
    ps = problems(job(parallelism={"tp": 4, "pp": 4}, model={"layers": 4}))
    assert any("resilience.k: 1 needs dp >= 2" in p for p in ps), ps


def test_dp_peers_all_on_one_node_is_reported():
    # 1 node x 4 GPUs, tp=1: every DP peer is on the owner's node -> no replica can leave the node.
    ps = problems(job(resources={"nodes": 1}))
    assert any(p.startswith("resilience.k:") and "distinct nodes" in p for p in ps), ps


def test_missing_account_warns_where_the_site_expects_one():
    r = run(job(resources={"account": None}))
    assert [w for w in r.warnings if "resources.account is not set" in w and "perlmutter" in w]
    assert not [w for w in run(job(resources={"account": None}, resilience={"placement_levels": ["node"]}),
                               site="vista").warnings if "account" in w]


def test_spares_zero_warns_with_resilience_on():
    r = run(job(resources={"spares": 0}))
    assert any("spares is 0" in w for w in r.warnings)
    assert run(job(resources={"spares": 0}, resilience={"enabled": False})).warnings == ()


def test_all_problems_in_one_error():
    ps = problems(
        job(
            parallelism={"tp": 2, "pp": 2, "dp": 3},
            resources={"nodes": 4, "spares": 6, "qos": "debug", "time_limit": "02:00:00"},
            resilience={"placement_levels": ["node", "rack"]},
        )
    )
    text = "\n".join(ps)
    assert "tp(2) x pp(2) x dp(3) = 12 does not match 4 nodes x 4 GPUs = 16" in text
    assert "resources.spares: nodes(4) + spares(6) = 10 exceeds the QOS 'debug' limit of 8 nodes" in text
    assert "resources.time_limit: '02:00:00' exceeds the QOS 'debug' limit of 00:30:00" in text
    assert "resilience.placement_levels: ['rack']" in text
    assert len(ps) == 4


def test_partition_limits_and_unknown_names():
    ps = problems(job(parallelism={"pp": 4}, resources={"nodes": 8, "spares": 2, "partition": "gh-dev"}), "vista")
    assert any("partition 'gh-dev' limit of 8 nodes" in p for p in ps)
    ps = problems(job(resources={"qos": "nosuch"}))
    assert any(p.startswith("resources.qos: 'nosuch' is not a QOS of site perlmutter") for p in ps)
    ps = problems(job(resources={"time_limit": "49:00:00"}))
    assert any("exceeds the QOS 'regular' limit of 48:00:00" in p for p in ps)
    ps = problems(job(resources={"nodes": 6, "spares": 1}), "local")
    assert any("exceeds the site local limit of 6 nodes" in p for p in ps)


def test_bad_time_and_batch_and_sbatch_values():
    ps = problems(job(resources={"time_limit": "soon", "account": "a b; rm"},
                      training={"micro_batch_size": 2, "global_batch_size": 6}))
    text = "\n".join(ps)
    assert "resources.time_limit: 'soon' is not a Slurm time limit" in text
    assert "resources.account: 'a b; rm' contains characters" in text
    assert "training.global_batch_size: 6 must be a multiple of micro_batch_size(2) x dp(16) = 32" in text


def test_node_pinning_forbidden_on_vista():
    ps = problems(job(parallelism={"pp": 4}, resources={"partition": "gh"}), "vista", nodelist="c001-[001-005]")
    assert any(p.startswith("nodelist: site vista does not allow") for p in ps)
    assert run(job(), nodelist="nid[001-005]").nodelist == "nid[001-005]"


def test_megatron_on_a_site_without_real_gpus_is_refused():
    cfg = job(engine="megatron", resources={"nodes": 4, "spares": 2},
              training={"global_batch_size": 8}, parallelism={"pp": 2})
    ps = problems(cfg, "local")
    assert any(p.startswith("engine: 'megatron' needs real CUDA GPUs") and "node.gpu_model is null" in p
               and "fake gres" in p and "allowed here: torch" in p for p in ps), ps


def test_extra_problems_are_listed_with_the_others():
    ps = problems(job(training={"global_batch_size": 63}), extra_problems=["engine: from the caller"])
    assert ps[0] == "engine: from the caller" and any(p.startswith("training.global_batch_size") for p in ps)


def test_megatron_memory_estimate_is_attached_and_a_config_that_cannot_fit_is_refused():
    cfg = load_job_config(EXAMPLES / "vista-7b.yaml")
    r = run(cfg, "vista")
    assert r.memory is not None and 20e9 < r.memory.total < 96e9 and r.memory.stage == 0
    too_big = cfg.model_copy(update={"training": cfg.training.model_copy(update={"micro_batch_size": 8}),
                                     "megatron": cfg.megatron.model_copy(update={"transformer_impl": "local",
                                                                                 "attention_backend": None})})
    ps = problems(too_big, "vista")
    mem = [p for p in ps if p.startswith("GPU memory:")]
    assert len(mem) == 1 and "more than the 96 GB of one GH200-96GB" in mem[0] and "node.gpu_mem_gb" in mem[0]
    assert "megatron.recompute_granularity: full" in mem[0] and "training.micro_batch_size" in mem[0]
    assert "activations" in mem[0]
    assert run(cfg.model_copy(update={"engine": "torch", "megatron": type(cfg.megatron)(),
                                      "model": cfg.model.model_copy(update=dict(
                                          position_embedding_type="learned_absolute", activation="gelu",
                                          normalization="LayerNorm", add_bias_linear=True, ffn_hidden_size=None,
                                          num_query_groups=None))}), "vista").memory is None


@pytest.mark.parametrize("site, example, dp", [("local", "gpt-small", 2), ("perlmutter", "perlmutter-7b", 8),
                                               ("vista", "vista-7b", 8)])
def test_examples_resolve(site, example, dp):
    r = run(load_job_config(EXAMPLES / f"{example}.yaml"), site)
    placeholder = [w for w in r.warnings if "is the example's placeholder" in w]
    assert r.dp == dp and len(placeholder) == (example == "perlmutter-7b")  # its account is m0000_g
    assert not set(r.warnings) - set(placeholder)
