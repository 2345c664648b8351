"""The NCCL error-handling environment a protected job sets (phoenix_hpc.launch.nccl_env)."""

import pytest

from phoenix_hpc.launch.nccl_env import ASYNC_ERROR_HANDLING, ENABLE_MONITORING, nccl_error_env


def test_unset_variables_get_abort_only_and_no_monitor_kill():
    updates, problems = nccl_error_env({}, "nccl", protected=True)
    assert updates == {ASYNC_ERROR_HANDLING: "2", ENABLE_MONITORING: "0"} and problems == []


@pytest.mark.parametrize("value", ["0", "2", " 2 "])
def test_values_that_keep_the_process_alive_are_kept(value):
    updates, problems = nccl_error_env({ASYNC_ERROR_HANDLING: value, ENABLE_MONITORING: "1"}, "nccl", True)
    assert updates == {} and problems == []


@pytest.mark.parametrize("value,meaning", [("1", "tear down the process"), ("3", "without aborting"),
                                          ("yes", "not a value torch knows")])
def test_values_under_which_torch_kills_a_survivor_are_refused_naming_variable_value_and_allowed(value, meaning):
    updates, problems = nccl_error_env({ASYNC_ERROR_HANDLING: value}, "nccl", True)
    assert ASYNC_ERROR_HANDLING not in updates
    (msg,) = problems
    assert f"{ASYNC_ERROR_HANDLING}={value!r}" in msg and meaning in msg and "0 or 2" in msg


@pytest.mark.parametrize("backend,protected", [("gloo", True), ("nccl", False)])
def test_nothing_is_set_on_gloo_or_without_protection(backend, protected):
    assert nccl_error_env({ASYNC_ERROR_HANDLING: "3"}, backend, protected) == ({}, [])


def test_rank_applies_the_decision_to_its_environment(monkeypatch):
    from types import SimpleNamespace

    import torch

    from phoenix_hpc.errors import EngineError
    from phoenix_hpc.launch.rank import set_nccl_error_env

    cfg = SimpleNamespace(resilience=SimpleNamespace(enabled=True, mode="phoenix"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    env: dict[str, str] = {}
    assert set_nccl_error_env(cfg, env) == {ASYNC_ERROR_HANDLING: "2", ENABLE_MONITORING: "0"}
    assert env == {ASYNC_ERROR_HANDLING: "2", ENABLE_MONITORING: "0"}
    with pytest.raises(EngineError, match="TORCH_NCCL_ASYNC_ERROR_HANDLING='3'"):
        set_nccl_error_env(cfg, {ASYNC_ERROR_HANDLING: "3"})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert set_nccl_error_env(cfg, {}) == {}
