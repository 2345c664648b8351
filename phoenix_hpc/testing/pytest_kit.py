"""The conformance kit as a pytest base class: one test per rule of :data:`phoenix_hpc.testing.rules.RULE_TABLE`
(a test parametrized over the table: ``test_rule[ordering]``, ``test_rule[determinism]``, ...).

Usage (in your test module)::

    import pytest
    from phoenix_hpc.testing import EngineConformance

    class TestMyEngine(EngineConformance):
        world_size = 2                      # local gloo processes (tp x pp x dp)

        @pytest.fixture(scope="class")
        @classmethod
        def conformance_config(cls):
            return "configs/my-job.yaml"    # or a job-config mapping

The kit runs once per class (all rules, in ``world_size`` processes) and each test reports its rule; a
failing test's message names the rule and what broke it, rank by rank.
"""

from __future__ import annotations

import pytest

from phoenix_hpc.testing.harness import ConformanceReport, run_conformance
from phoenix_hpc.testing.rules import RULE_TABLE, RULES


class EngineConformance:
    """Base class: subclass as ``Test...`` and provide the class-scoped fixture ``conformance_config``
    (a job config path, or a mapping whose relative paths are relative to ``base_dir``)."""

    world_size: int | None = None
    steps: int = 2
    timeout_s: float = 300.0
    base_dir: str | None = None
    device: str = "cpu"  # "cuda": NCCL, one GPU per rank (engines that need CUDA)

    @pytest.fixture(scope="class")
    @classmethod
    def conformance_report(cls, conformance_config) -> ConformanceReport:
        return run_conformance(conformance_config, world_size=cls.world_size, steps=cls.steps,
                               timeout_s=cls.timeout_s, base_dir=cls.base_dir, device=cls.device)

    def _check(self, report: ConformanceReport, rule: str) -> None:
        """Fail naming ``rule``, what it requires and every rank's violation; skip a recovery-style rule the
        engine does not support."""
        msgs = report.failures(rule)
        if msgs:
            pytest.fail(f"conformance rule {rule!r} failed ({RULE_TABLE[rule]}):\n  " + "\n  ".join(msgs)
                        + f"\n\nrank logs (tail):\n{report.logs}", pytrace=False)
        if rule in report.skipped:
            pytest.skip(f"rule {rule!r}: the engine does not support this recovery style")

    @pytest.mark.parametrize("rule", RULES)
    def test_rule(self, conformance_report, rule):
        """One rule of :data:`phoenix_hpc.testing.rules.RULE_TABLE` (the test id names it:
        ``test_rule[determinism]``)."""
        self._check(conformance_report, rule)
