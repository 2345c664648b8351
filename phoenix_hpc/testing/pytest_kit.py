"""The conformance kit as a pytest base class: one test per rule of :data:`phoenix_hpc.testing.rules.RULES`.

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


class EngineConformance:
    """Base class: subclass as ``Test...`` and provide the class-scoped fixture ``conformance_config``
    (a job config path, or a mapping whose relative paths are relative to ``base_dir``)."""

    world_size: int | None = None
    steps: int = 2
    timeout_s: float = 300.0
    base_dir: str | None = None

    @pytest.fixture(scope="class")
    @classmethod
    def conformance_report(cls, conformance_config) -> ConformanceReport:
        return run_conformance(conformance_config, world_size=cls.world_size, steps=cls.steps,
                               timeout_s=cls.timeout_s, base_dir=cls.base_dir)

    def _check(self, report: ConformanceReport, rule: str) -> None:
        msgs = report.failures(rule)
        if msgs:
            pytest.fail(f"conformance rule {rule!r} failed:\n  " + "\n  ".join(msgs)
                        + f"\n\nrank logs (tail):\n{report.logs}", pytrace=False)
        if rule in report.skipped:
            pytest.skip(f"rule {rule!r}: the engine does not support this recovery style")

    def test_ordering(self, conformance_report):
        """forward_backward / reduce_gradients change no state; optimizer_step advances step by 1."""
        self._check(conformance_report, "ordering")

    def test_determinism(self, conformance_report):
        """Two runs from a fresh engine give the same state hash."""
        self._check(conformance_report, "determinism")

    def test_shard_names(self, conformance_report):
        """Shard names carry the rank's coordinate; DP ranks' optimizer shards cover every parameter once."""
        self._check(conformance_report, "shard_names")

    def test_save_restore(self, conformance_report):
        """A fresh engine loaded with saved shards and envelope continues bitwise."""
        self._check(conformance_report, "save_restore")

    def test_recovery_style(self, conformance_report):
        """recovery_style / supported_recovery_styles are consistent."""
        self._check(conformance_report, "recovery_style")

    def test_rebind(self, conformance_report):
        """Rebind to a new generation keeps shard names and continues bitwise."""
        self._check(conformance_report, "rebind")

    def test_rebuild(self, conformance_report):
        """Teardown + a new engine loaded from saved state continues bitwise."""
        self._check(conformance_report, "rebuild")
