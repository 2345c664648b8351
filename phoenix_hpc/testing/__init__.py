"""The engine conformance kit: check that an engine (built-in, or your own ``Engine`` subclass, or the torch
engine with your ``model.factory``) does what the PHOENIX runtime relies on. CPU, local gloo processes, no
Slurm. docs/engines.md, "Running the conformance kit".

- :func:`run_conformance` (plain Python): run every rule, get a :class:`ConformanceReport`.
- :class:`EngineConformance` (pytest): subclass it in a test module, give a ``conformance_config`` fixture,
  and every rule becomes a test (``pytest -q tests/test_my_engine.py``).
"""

from __future__ import annotations

from phoenix_hpc.testing.harness import ConformanceReport, run_conformance
from phoenix_hpc.testing.rules import RULES

__all__ = ["RULES", "ConformanceReport", "EngineConformance", "run_conformance"]


def __getattr__(name: str):
    if name == "EngineConformance":  # imports pytest: only when asked for
        from phoenix_hpc.testing.pytest_kit import EngineConformance

        return EngineConformance
    raise AttributeError(name)
