"""The coordinator (control/coordinator.py): every request type of the protocol has exactly one handler in
its dispatch table, and the coordinator is one class (no mixins) holding its transport."""

from __future__ import annotations

import re
from pathlib import Path

from phoenix_hpc.control import protocol
from phoenix_hpc.control.coordinator import HANDLERS, Coordinator
from phoenix_hpc.control.journal import Journal, read_journal


def _protocol_request_types() -> list[str]:
    """The request types in the protocol's table (``ctl/in``), from its docstring."""
    table = protocol.__doc__.split("Request bodies", 1)[1].split("Every body also carries", 1)[0]
    return re.findall(r"^([a-z_]+) {2,}", table, flags=re.M)


def test_every_request_type_of_the_protocol_has_a_handler():
    types = _protocol_request_types()
    assert {"register", "heartbeat", "commit", "recovered", "inject", "stop"} <= set(types)
    reports = ["quiesced", "checkpoint", "stopping", "shard_written", "signal"]
    assert set(HANDLERS) == set(types) | set(reports)
    assert all(callable(h) for h in HANDLERS.values())


def test_dispatch_goes_through_the_table_only(tmp_path):
    """A message type is dispatched by the table, never by a method named after it: a ``_on_<type>``
    method outside the table is not reachable by a message."""
    c = Coordinator(tmp_path, grid=(1, 1, 1))
    c.journal = Journal(tmp_path)
    c._on_no_table_entry = lambda body: (_ for _ in ()).throw(AssertionError("reached by name"))
    c._dispatch({"type": "no_table_entry", "world_rank": 0})
    c._dispatch({"type": ["not", "a", "name"], "world_rank": 0})
    reasons = [r["reason"] for r in read_journal(tmp_path) if r["event"] == "rejected"]
    assert reasons == ["unknown message type 'no_table_entry'", "unknown message type ['not', 'a', 'name']"]


def test_the_coordinator_is_one_class_that_holds_its_transport(tmp_path):
    """No mixins: the coordinator has no base class; messaging is an object it holds, and the fields the
    transport owns are the same objects read through the coordinator."""
    from phoenix_hpc.control.messaging import Transport

    assert Coordinator.__bases__ == (object,)
    c = Coordinator(tmp_path, grid=(1, 1, 1))
    assert isinstance(c.transport, Transport) and c.transport.counters is c.counters
    c.journal = Journal(tmp_path)
    assert c.transport.journal is c.journal


def test_an_unknown_message_type_is_rejected_and_journalled(tmp_path):
    c = Coordinator(tmp_path, grid=(1, 1, 1))
    c.journal = Journal(tmp_path)
    c._dispatch({"type": "no_such_type", "world_rank": 0})
    (rec,) = [r for r in read_journal(tmp_path) if r["event"] == "rejected"]
    assert "unknown message type 'no_such_type'" in rec["reason"] and c.counters["rejected"] == 1


def test_every_instruction_to_a_slot_goes_through_the_doorbell_send():
    """A slot reads its instruction queue only after its doorbell rings (besides a slow safety read), so
    every push into a slot's queue must go through ``Transport.send_encoded``, which marks the slot for ringing; a
    direct push left a survivor blocked in a commit wait deaf to ``quiesce`` until its commit timeout."""
    import re

    root = Path(__file__).resolve().parents[2] / "phoenix_hpc" / "control"
    pushes = {p.name: len(re.findall(r"queue_push\(P\.key_out\(", p.read_text())) for p in root.glob("*.py")}
    assert {k: v for k, v in pushes.items() if v} == {"messaging.py": 1}, pushes
