"""CUDA_DEVICE_MAX_CONNECTIONS as Megatron-LM requires it: 1 with tensor parallelism before Blackwell."""

import pytest

from phoenix_hpc.engines.megatron_env import MAX_CONNECTIONS, apply_megatron_cuda_env, needs_one_connection
from phoenix_hpc.errors import EngineError


def test_only_megatron_with_tp_before_blackwell_needs_one_connection():
    assert needs_one_connection("megatron", 4, 8) and needs_one_connection("megatron", 2, None)
    assert not needs_one_connection("megatron", 1, 8)  # vista-7b: tp=1
    assert not needs_one_connection("megatron", 4, 10)  # Blackwell
    assert not needs_one_connection("torch", 4, 8)


def test_set_where_unset_kept_where_one_refused_otherwise():
    env = {}
    assert apply_megatron_cuda_env(env, "megatron", 4, 8) == {MAX_CONNECTIONS: "1"} and env[MAX_CONNECTIONS] == "1"
    assert apply_megatron_cuda_env(env, "megatron", 4, 8) == {}
    assert apply_megatron_cuda_env({}, "megatron", 1, 8) == {}
    with pytest.raises(EngineError, match="CUDA_DEVICE_MAX_CONNECTIONS='8'.*tp=4"):
        apply_megatron_cuda_env({MAX_CONNECTIONS: "8"}, "megatron", 4, 9)
