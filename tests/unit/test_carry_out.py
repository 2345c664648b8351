"""The coordinator carries out a decision's outcome (control/messaging.py ``Transport.carry_out``): the events are
journalled before any command acts, then each command in order: a send queues a signed instruction and rings
the slot, a reply answers the request, a rejection is counted and journalled once per key, a held answer
keeps the operator connection open until it is released."""

from __future__ import annotations

import pytest
from test_drain import _coordinator, _sent

from phoenix_hpc.control import events as E
from phoenix_hpc.control import protocol as P
from phoenix_hpc.control.commands import CountRejected, Hold, Outcome, Reject, Release, Reply, Send
from phoenix_hpc.control.journal import read_journal


def _replies(c, to):
    return [P.decode(raw, c.secret) for k, raw in c.store.pushed if k == P.key_reply(to)]


def test_events_first_then_the_commands_in_order(tmp_path):
    c = _coordinator(tmp_path)
    order = []
    write, push = c.journal.write, c.store.queue_push  # the recorder journals through Journal.write
    c.journal.write = lambda ev, sync=True: (order.append(ev.NAME), write(ev, sync=sync))[1]
    c.store.queue_push = lambda key, raw: (order.append(key), push(key, raw))
    req = {"type": "inject", "reply_to": "cli-1", "nonce": "n1"}
    c.transport.carry_out(Outcome([E.SpareLost(slots=[2], spares_left=[])],
                         [Send(0, {"type": "disarm", "request_id": "r"}), Send(1, {"type": "stop", "reason": "x"}),
                          Reply(req, {"type": "ok"})]))
    assert order == ["spare_lost", "ctl/out/0", "ctl/out/1", P.key_reply("cli-1")]
    assert [r["event"] for r in read_journal(tmp_path)] == ["spare_lost"]
    assert [(w, m["type"]) for w, m in _sent(c)] == [(0, "disarm"), (1, "stop")]
    assert c.transport.to_ring == {0, 1}  # rung at the loop's next _ring
    assert [(m["type"], m["in_reply_to"]) for m in _replies(c, "cli-1")] == [("ok", "n1")]


@pytest.mark.parametrize("commands,rejected,records,answered", [
    ([Reject("bad", {"type": "x", "reply_to": "cli-2", "nonce": "n"})], 1, 1, ["rejected"]),
    ([Reject("same", None, key=("k",)), Reject("same", None, key=("k",))], 2, 1, []),  # journalled once per key
    ([CountRejected()], 1, 0, []),
])
def test_rejections_are_counted_and_journalled_once(tmp_path, commands, rejected, records, answered):
    c = _coordinator(tmp_path)
    c.transport.carry_out(Outcome([], commands))
    assert c.counters["rejected"] == rejected
    assert len([r for r in read_journal(tmp_path) if r["event"] == "rejected"]) == records
    assert [m["type"] for m in _replies(c, "cli-2")] == answered


def test_a_held_answer_goes_out_when_released(tmp_path):
    c = _coordinator(tmp_path)
    req = {"type": "drain", "reply_to": "cli-3", "nonce": "n3"}
    c.transport.carry_out(Outcome([], [Hold(req)]))
    assert "cli-3" in c.transport.held_replies and _replies(c, "cli-3") == []
    c.transport.carry_out(Outcome([], [Release(req, {"type": "accepted"})]))
    assert "cli-3" not in c.transport.held_replies and [m["type"] for m in _replies(c, "cli-3")] == ["accepted"]


def test_something_else_is_no_command(tmp_path):
    with pytest.raises(TypeError, match="not a command"):
        _coordinator(tmp_path).transport.carry_out(Outcome([], ["send it"]))
