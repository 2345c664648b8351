"""Fixtures shared by the end-to-end modules that run the tiny GPT job of :mod:`test_hotswap`.

Session-scoped, so the modules that use them (test_hotswap, test_hotswap_more, test_planned_end,
test_custom_model, test_inject_exact, test_shrink, test_resume_shrunk) prepare the dataset once and run the
fault-free reference job and the pp=2 shrink jobs once, instead of once per module (pytest builds a
module-scoped fixture again for every module that imports it).
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def data(tmp_path_factory):
    """A byte-level dataset (Megatron indexed format) of the first 300 kB of the standard library: its path
    prefix."""
    from phoenix_hpc.data.prepare import prepare_dataset, stdlib_dir

    d = tmp_path_factory.mktemp("hotswap-data") / "stdlib"
    prepare_dataset(stdlib_dir(), d, max_bytes=300_000)
    return d


@pytest.fixture(scope="session")
def env(slurm_env, tmp_path_factory):
    """:func:`slurm_env` with a ``PHOENIX_HOME`` of its own (pass as ``env=`` to ``phoenix`` commands)."""
    e = dict(slurm_env)
    e["PHOENIX_HOME"] = str(tmp_path_factory.mktemp("phoenix-home"))
    return e


@pytest.fixture(scope="session")
def reference(env, data, tmp_path_factory):
    """The fault-free run of :data:`test_hotswap.CONFIG`: its ``job_done`` (the oracle's reference hash)."""
    from test_hotswap import _run_reference

    return _run_reference(env, data, tmp_path_factory.mktemp("ref"), "ref")


@pytest.fixture(scope="session")
def pp2_shrink(env, data, tmp_path_factory):
    """The pp=2 x dp=2 fault job that shrinks to dp = 1 at its recoverable step ``R`` and the fault-free job
    drained with ``--shrink`` at ``R + 1`` (:func:`test_shrink.run_pp2_shrink`): the shrink test's oracle, and
    the never-stopped run of the same grid history for the resume tests."""
    from test_shrink import run_pp2_shrink

    return run_pp2_shrink(env, data, tmp_path_factory.mktemp("pp2-shrink"))
