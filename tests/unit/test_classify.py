"""docs/design.md section 6 table: local recovery, hot swap, clean stop."""

import pytest

from phoenix_hpc.control.classify import Action, Fault, FaultKind, classify, combine, kind_from_exception

K = FaultKind


def test_transient_comm_error_with_everyone_alive_is_local_recovery():
    d = classify(Fault(K.COMM_ERROR, (3,), ("nid00002",), all_alive=True, detail="Connection reset by peer"))
    assert d.action is Action.LOCAL_RECOVERY and "no spare used" in d.reason and "slots 3" in d.reason
    assert classify(Fault(K.COLLECTIVE_TIMEOUT, all_alive=True)).action is Action.LOCAL_RECOVERY


def test_comm_error_with_a_dead_member_is_a_hot_swap():
    assert classify(Fault(K.COLLECTIVE_TIMEOUT, (1,), all_alive=False)).action is Action.HOT_SWAP


@pytest.mark.parametrize("kind", [K.GPU_MEMORY, K.PCIE, K.HOST_FAULT, K.NODE_LOSS, K.NODE_REBOOT, K.NETWORK_LOSS,
                                  K.STORAGE_LOSS, K.PROCESS_EXIT, K.HEARTBEAT_TIMEOUT])
def test_hardware_and_node_faults_hot_swap_even_if_all_alive(kind):
    assert classify(Fault(kind, all_alive=True)).action is Action.HOT_SWAP


@pytest.mark.parametrize("kind", [K.NUMERICAL, K.SOFTWARE_BUG, K.SILENT_CORRUPTION, K.UNKNOWN])
def test_out_of_scope_faults_never_hot_swap(kind):
    for alive in (True, False):
        d = classify(Fault(kind, all_alive=alive))
        assert d.action is Action.CLEAN_STOP and "persistent checkpoint" in d.reason


def test_combine_takes_the_most_severe():
    node = Fault(K.HEARTBEAT_TIMEOUT, (4, 5, 6, 7), ("nid00002",))
    comm = Fault(K.COMM_ERROR, (0,), all_alive=False)
    nan = Fault(K.NUMERICAL, (1,), detail="loss is nan")
    assert combine([comm, node]).action is Action.HOT_SWAP
    d = combine([node, nan, comm])
    assert d.action is Action.CLEAN_STOP and "NaN" in d.reason
    assert combine([Fault(K.COMM_ERROR, all_alive=True)]).action is Action.LOCAL_RECOVERY
    with pytest.raises(ValueError):
        combine([])


@pytest.mark.parametrize(
    "type_name,message,kind",
    [
        ("RuntimeError", "loss is NaN at step 7", K.NUMERICAL),
        ("FloatingPointError", "overflow", K.NUMERICAL),
        ("RuntimeError", "non-finite gradient norm", K.NUMERICAL),
        ("DistBackendError", "[gloo] Connection closed by peer [127.0.0.1]:1234", K.COMM_ERROR),
        ("RuntimeError", "[../gloo/transport/tcp/pair.cc] Timed out waiting 5000ms for recv operation", K.COLLECTIVE_TIMEOUT),
        ("RuntimeError", "CUDA error: uncorrectable ECC error encountered", K.GPU_MEMORY),
        ("RuntimeError", "CUDA error: an illegal memory access was encountered", K.GPU_MEMORY),
        ("RuntimeError", "GPU has fallen off the bus", K.PCIE),
        ("ReplicationError", "checksum mismatch for shard opt/pp0/tp0/dp1", K.SILENT_CORRUPTION),
        ("OSError", "[Errno 5] Input/output error", K.STORAGE_LOSS),
        ("KeyError", "'layers.0.weight'", K.SOFTWARE_BUG),
        ("torch.OutOfMemoryError", "CUDA out of memory", K.SOFTWARE_BUG),
        ("RuntimeError", "something odd happened", K.UNKNOWN),
    ],
)
def test_kind_from_exception(type_name, message, kind):
    assert kind_from_exception(type_name, message) is kind


def test_information_is_not_mistaken_for_inf():
    assert kind_from_exception("RuntimeError", "information lost") is K.UNKNOWN


@pytest.mark.parametrize("fault, action", [
    (Fault(K.SILENT_CORRUPTION, (1,), bad_step=12, agreed_step=11), Action.LOCAL_RECOVERY),
    (Fault(K.SILENT_CORRUPTION, (1,), bad_step=12), Action.LOCAL_RECOVERY),
    (Fault(K.SILENT_CORRUPTION, (1,)), Action.CLEAN_STOP),  # a checksum failure: no step to roll back before
    (Fault(K.REPEATED_CORRUPTION, (1,), bad_step=12), Action.HOT_SWAP),
])
def test_replicas_that_differ_at_a_known_step_are_rolled_back_and_a_repeat_offender_replaced(fault, action):
    d = classify(fault)
    assert d.action is action
    if action is Action.LOCAL_RECOVERY:
        assert "differ at step 12" in d.reason and "roll every member back" in d.reason
    assert combine([fault, Fault(K.PROCESS_EXIT, (3,))]).action is (
        Action.CLEAN_STOP if action is Action.CLEAN_STOP else Action.HOT_SWAP)
