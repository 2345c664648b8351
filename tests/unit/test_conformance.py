"""The engine conformance kit (phoenix_hpc.testing) against the built-in torch engine, the example model
through model.factory, and engines that each break one rule (the kit must fail them naming the rule).

The kit's runs read a small synthetic ``data.factory`` dataset (tests/unit/kit_engines/user_factories.py):
opening a Megatron indexed dataset imports megatron-core, which costs each rank process seconds; the
indexed dataset itself is covered by tests/unit/test_engine_torch.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from phoenix_hpc.testing import EngineConformance, run_conformance
from phoenix_hpc.testing.harness import check_coverage

ROOT = Path(__file__).resolve().parents[2]
KIT_ENGINES = Path(__file__).resolve().parent / "kit_engines"
EXAMPLE = ROOT / "examples" / "custom-model"


@pytest.fixture(scope="module")
def dataset():
    return {"factory": "user_factories:good_data", "options": {"n": 40}}


def _config(dataset, **over) -> dict:
    cfg = {
        "name": "kit",
        "engine": "torch",
        "python_path": [str(KIT_ENGINES)],
        "model": {"layers": 2, "hidden_size": 16, "heads": 2, "vocab_size": 256, "seq_length": 16},
        "parallelism": {"tp": 1, "pp": 1, "dp": 2},
        "training": {"steps": 4, "micro_batch_size": 2, "global_batch_size": 4, "lr": 3e-3, "seed": 5},
        "data": dataset,
    }
    for k, v in over.items():
        cfg[k] = v
    return cfg


class TestTorchEngine(EngineConformance):
    """The built-in torch engine (GPT, dp=2)."""

    @pytest.fixture(scope="class")
    @classmethod
    def conformance_config(cls, dataset):
        return _config(dataset)


class TestExampleModel(EngineConformance):
    """The torch engine training examples/custom-model's Llama-style decoder through model.factory, pp=2."""

    @pytest.fixture(scope="class")
    @classmethod
    def conformance_config(cls, dataset):
        opts = {"layers": 2, "hidden_size": 16, "heads": 2, "ffn_hidden_size": 24, "vocab_size": 256, "seq_length": 16}
        return _config(
            dataset, python_path=[str(EXAMPLE), str(KIT_ENGINES)], parallelism={"tp": 1, "pp": 2, "dp": 1},
            model={"factory": "tinyllama.model:build_stage", "options": opts, "hidden_size": 16, "vocab_size": 256,
                   "seq_length": 16},
        )


def _broken(dataset, cls: str, dp: int = 1):
    return run_conformance(_config(dataset, engine=f"broken_engines:{cls}", parallelism={"tp": 1, "pp": 1, "dp": dp}),
                           timeout_s=180)


def _kit_failure(report, rule: str) -> str:
    """The message the pytest kit's test of ``rule`` fails with on ``report``."""
    with pytest.raises(pytest.fail.Exception) as exc:
        EngineConformance()._check(report, rule)
    return str(exc.value)


def test_wall_clock_data_order_fails_determinism(dataset):
    rep = _broken(dataset, "ClockEngine")
    assert not rep.ok
    msg = "\n".join(rep.failures("determinism"))
    assert "different state hashes" in msg and "wall clock" in msg, rep.summary()
    assert "FAIL    determinism" in rep.summary()
    assert not rep.failures("ordering"), rep.summary()  # only what it breaks
    text = _kit_failure(rep, "determinism")
    assert text.startswith("conformance rule 'determinism' failed (two runs from a fresh engine give the same "
                           "state hash):\n  rank 0 (pp0 dp0 tp0): two runs of 4 steps"), text
    EngineConformance()._check(rep, "ordering")  # passes: no exception


def test_renaming_on_rebind_fails_rebind(dataset):
    rep = _broken(dataset, "RenamingEngine")
    msg = "\n".join(rep.failures("rebind"))
    assert "shard names changed on rebind to generation 1" in msg, rep.summary()
    for rule in ("ordering", "determinism", "shard_names", "save_restore"):
        assert not rep.failures(rule), rep.summary()
    text = _kit_failure(rep, "rebind")
    assert text.startswith("conformance rule 'rebind' failed (rebind to a new generation keeps shard names and "
                           "continues bitwise):\n  rank 0 (pp0 dp0 tp0): shard names changed on rebind"), text


def test_kit_has_one_test_per_rule_and_skips_unsupported_styles():
    from phoenix_hpc.testing import RULES
    from phoenix_hpc.testing.harness import ConformanceReport

    (mark,) = [m for m in EngineConformance.test_rule.pytestmark if m.name == "parametrize"]
    assert mark.args == ("rule", RULES)
    rep = ConformanceReport(world_size=1, violations={r: [] for r in RULES}, skipped=["rebind"])
    with pytest.raises(pytest.skip.Exception, match="rule 'rebind': the engine does not support"):
        EngineConformance()._check(rep, "rebind")
    rep.not_run = ["rebuild"]
    assert "rule rebuild did not run" in _kit_failure(rep, "rebuild")


def test_update_outside_optimizer_step_fails_ordering(dataset):
    rep = _broken(dataset, "EagerEngine")
    msg = "\n".join(rep.failures("ordering"))
    assert "parameters changed inside reduce_gradients" in msg, rep.summary()


def test_coverage_counts_every_element_once():
    lay = lambda opt: {"params": {"w": 10, "b": 3}, "opt": opt}  # noqa: E731
    ok = {0: {"coord": {"pp": 0, "tp": 0, "dp": 0}, "layout": lay({"w": 7})},
          1: {"coord": {"pp": 0, "tp": 0, "dp": 1}, "layout": lay({"w": 3, "b": 3})}}
    assert check_coverage(ok) == []
    bad = {0: ok[0], 1: {"coord": {"pp": 0, "tp": 0, "dp": 1}, "layout": lay({"w": 4, "b": 3})}}
    assert "hold 11 elements of parameter 'w', which has 10" in check_coverage(bad)[0]


def test_kit_device_is_cpu_or_an_available_cuda(dataset):
    import torch

    from phoenix_hpc.errors import ConfigError

    with pytest.raises(ConfigError, match=r"device: 'tpu' is not a conformance device \(allowed: 'cpu', 'cuda'\)"):
        run_conformance(_config(dataset), device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="device: 'cuda' needs a CUDA device, and none is available here"):
            run_conformance(_config(dataset), device="cuda")
