"""Host memory planned at submit (phoenix_hpc.config.host_memory): the formula of docs/design.md section 4,
the budget below the site's node memory, and where resolve applies it."""

from __future__ import annotations

from pathlib import Path

import pytest

from phoenix_hpc.config import load_job_config
from phoenix_hpc.config.host_memory import host_memory_check, plan_host_memory
from phoenix_hpc.config.memory import stage_params
from phoenix_hpc.config.resolve import resolve
from phoenix_hpc.errors import ConfigError
from phoenix_hpc.profiles import load_profile

ROOT = Path(__file__).resolve().parents[2]


def example(name: str):
    return load_job_config(ROOT / "examples" / f"{name}.yaml")


def test_perlmutter_7b_is_ten_bytes_per_parameter_per_rank():
    """bf16, dp=8, k=1: snapshot = 2N + 12N/8 = 3.5N, M = 2 x 3.5N + 2 x 1.5N = 10N bytes per rank."""
    cfg, prof = example("perlmutter-7b"), load_profile("perlmutter")
    plan = plan_host_memory(cfg, 8, 4, prof.node)
    n = max(stage_params(cfg.model, 2, s, 4) for s in range(2))
    assert plan.params == n and plan.per_rank == pytest.approx(10 * n)
    assert plan.per_node == pytest.approx(40 * n)
    assert plan.budget == pytest.approx(0.9 * (256 - 8 - 4 * 6) * 1e9)


def test_float32_and_k2():
    """fp32, dp=2, k=2: snapshot = 4N + 6N = 10N, M = 20N + 4 x 6N = 44N."""
    cfg = example("gpt-small")
    cfg = cfg.model_copy(update={"resilience": cfg.resilience.model_copy(update={"k": 2})})
    plan = plan_host_memory(cfg, 2, 1, load_profile("local").node)
    assert plan.per_rank == pytest.approx(44 * plan.params)
    assert plan.budget is None and host_memory_check(plan, cfg, 2, "local") == (None, None)


def test_resolve_plans_only_protected_jobs():
    prof = load_profile("perlmutter")
    cfg = example("perlmutter-7b")
    job = resolve(cfg, prof, run_dir="/r", default_python="py")
    assert job.host_memory is not None and job.spares_plan is not None and job.mttf_source == "assumption"
    off = cfg.model_copy(update={"resilience": cfg.resilience.model_copy(update={"enabled": False})})
    assert resolve(off, prof, run_dir="/r", default_python="py").host_memory is None


def test_resolve_refuses_a_node_whose_memory_cannot_hold_the_buffers():
    prof = load_profile("perlmutter")
    small = prof.model_copy(update={"node": prof.node.model_copy(update={"mem_gb": 64})})
    with pytest.raises(ConfigError) as ei:
        resolve(example("perlmutter-7b"), small, run_dir="/r", default_python="py")
    msg = str(ei.value)
    assert "host memory" in msg and "33.70 GB per node" in msg and "budget 28.8 GB" in msg
