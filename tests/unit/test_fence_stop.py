"""A slot the coordinator declares dead is told to stop at once (control/membership.py ``_fence``): its
process may live (a GPU error, a hang, a lost link), and until it hears it would hold its node's GPU and could
write the summary of the logical rank a spare now holds. It is told again for any message it sends later."""

from test_drain import _coordinator, _events, _sent

from phoenix_hpc.control.classify import FaultKind
from phoenix_hpc.control.states import SlotState


def test_a_slot_declared_dead_is_told_to_stop_as_fenced_and_again_when_it_speaks(tmp_path):
    c = _coordinator(tmp_path)
    since = len(c.store.pushed)
    send, seen = c.transport.send, []

    def recording_send(w, body):  # what was journalled and queued when the stop went out
        seen.append((body["type"], len(_events(tmp_path, "slots_dead")), len(c.faults)))
        send(w, body)

    c.transport.send = recording_send
    c._declare_dead([1], FaultKind.GPU_MEMORY, "uncorrectable ECC", now=1.0)
    assert seen == [("stop", 1, 1)]  # journalled and the fault queued first: a restart knows the slot is dead
    assert c.slots[1].state is SlotState.DEAD and _events(tmp_path, "slots_dead")[0]["slots"] == [1]
    assert [(w, m["type"], m["job_state"], m["reason"]) for w, m in _sent(c, since)] == [
        (1, "stop", "fenced", "this slot was declared dead (gpu_memory: uncorrectable ECC)")]
    # declaring it dead again (a second report of the same fault) sends nothing more
    since = len(c.store.pushed)
    c._declare_dead([1], FaultKind.PROCESS_EXIT, "process exited", now=2.0)
    assert _sent(c, since) == []
    # a heartbeat it sends after is refused and answered with another stop
    c._dispatch({"type": "heartbeat", "world_rank": 1, "pid": 101, "generation": 0, "step": 6})
    assert [(w, m["type"], m["job_state"]) for w, m in _sent(c, since)] == [(1, "stop", "fenced")]
    assert "declared dead" in _events(tmp_path, "rejected")[-1]["reason"]
    # the live member and the spare are told nothing by the fencing
    assert {w for w, _ in _sent(c)} == {1}


def test_a_spare_declared_dead_is_told_to_stop_too_and_no_fault_is_queued(tmp_path):
    c = _coordinator(tmp_path)
    since = len(c.store.pushed)
    c._declare_dead([2], FaultKind.HEARTBEAT_TIMEOUT, "no heartbeat for 4.1 s", now=1.0)
    assert [(w, m["type"], m["job_state"]) for w, m in _sent(c, since)] == [(2, "stop", "fenced")]
    assert _events(tmp_path, "spare_lost")[0]["slots"] == [2] and not c.faults
