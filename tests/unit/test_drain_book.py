"""The planned-drain book as tables: a request, acks, members at the fence, the hot swap's end, the clock or
what came first in; journal events and commands out (control/drains.py DrainBook). No coordinator, no store."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from phoenix_hpc.control.classify import Action
from phoenix_hpc.control.commands import CountRejected, Hold, Reject, Release, Send
from phoenix_hpc.control.drains import DrainBook
from phoenix_hpc.control.records import Slot
from phoenix_hpc.control.states import JobState, SlotState, slot_machine

GRID = (1, 1, 2)  # tp, pp, dp: two members (world 0 on n0, world 1 on n1), one spare (world 2 on n2)


def _slots(step=6):
    out = {}
    for w, (role, state) in enumerate([("active", SlotState.ACTIVE), ("active", SlotState.ACTIVE),
                                       ("standby", SlotState.STANDBY)]):
        s = Slot(w, f"n{w}", 100 + w, role, slot_machine(f"slot {w}"), 0.0,
                 logical_rank=w if role == "active" else None, step=step)
        s.machine.to(state)
        out[w] = s
    return out


def _body(**kw):
    body = {"type": "drain", "target": {"node": "n1"}, "request_id": "d1", "reply_to": "cli"}
    body.update(kw)
    return body


def _request(book, body, *, job=JobState.RUNNING, recovering=False, shrink_capable=False, slots=None):
    return book.request(body, slots=slots or _slots(), rank_map={0: 0, 1: 1}, grid=GRID, job_state=job,
                        recovering=recovering, shrink_capable=shrink_capable, k=1, now=50.0,
                        new_id=lambda: "new")


def _live(w):
    return True


REFUSALS = [
    ("the job ended", {}, dict(job=JobState.DONE), "drain: the job is done: nothing to drain"),
    ("a recovery in progress", {}, dict(recovering=True), "drain: the job is recovering; a drain starts only"),
    ("a spare as the target", {"target": {"node": "n2"}}, {}, "drain: world rank(s) [2] on n2 are standby spares"),
    ("no live slot there", {"target": {"node": "n9"}}, {}, "drain: no live slot on node 'n9'"),
    ("a bad steps_ahead", {"steps_ahead": 0}, {}, "drain: steps_ahead 0 must be an integer >= 1"),
    ("a bad at_step", {"at_step": "9"}, {}, "drain: at_step '9' must be an integer >= 1"),
    ("shrink with an engine that cannot", {"shrink": True}, {}, "drain: --shrink: the job's engine cannot shrink"),
]


@pytest.mark.parametrize("name,fields,kw,reason", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_a_refused_drain_is_only_rejected(name, fields, kw, reason):
    book = DrainBook()
    out = _request(book, _body(**fields), **kw)
    assert out.events == [] and len(out.commands) == 1 and isinstance(out.commands[0], Reject)
    assert out.commands[0].reason.startswith(reason), out.commands[0].reason
    assert book.current is None


def test_an_accepted_drain_is_journalled_held_and_armed_at_every_member():
    book = DrainBook()
    out = _request(book, _body())
    assert [(e.NAME, e.at_step, e.nodes) for e in out.events] == [("drain_requested", 8, ["n1"])]  # step 6 + 2
    assert isinstance(out.commands[0], Hold)
    assert out.commands[1:] == [Send(w, {"type": "drain", "request_id": "d1", "at_step": 8, "attempt": 1})
                                for w in (0, 1)]
    assert _request(book, _body(request_id="d2")).commands[0].reason == (
        "drain: another drain is in progress; one drain at a time")


# (name, acks [(world, ack)], exact at_step?) -> (events, state, at_step, attempt, command kinds)
ACKS = [
    ("every member armed: accepted", [(0, {"armed": True}), (1, {"armed": True})], None,
     (["drain_armed"], "armed", 8, 1, [Release])),
    ("one too late: re-armed later, undrained first", [(0, {"armed": True}),
                                                       (1, {"armed": False, "late": True, "started_step": 9})],
     None, (["drain_rearmed"], "confirming", 11, 2, [Send] * 4)),
    ("too late for an exact step: refused", [(1, {"armed": False, "late": True, "started_step": 9})], 8,
     (["drain_refused"], "refused", 8, 1, [Send, Send, CountRejected, Release])),
    ("any other refusal: refused", [(1, {"armed": False, "reason": "the job ends first"})], None,
     (["drain_refused"], "refused", 8, 1, [Send, Send, CountRejected, Release])),
    ("an ack of another attempt is ignored", [(1, {"armed": True, "attempt": 2})], None,
     ([], "confirming", 8, 1, [])),
]


@pytest.mark.parametrize("name,acks,exact,expected", ACKS, ids=[a[0] for a in ACKS])
def test_acks_table(name, acks, exact, expected):
    book = DrainBook()
    _request(book, _body(**({"at_step": exact} if exact else {})))
    out = None
    for w, ack in acks:
        out = book.ack(w, {"request_id": "d1", "attempt": 1, "at_step": 8, **ack}, live=_live)
    events, state, at_step, attempt, kinds = expected
    d = book.current
    assert [e.NAME for e in out.events] == events
    assert (d.state, d.at_step, d.attempt) == (state, at_step, attempt)
    assert [type(c) for c in out.commands] == kinds


def _armed():
    book = DrainBook()
    _request(book, _body())
    for w in (0, 1):
        book.ack(w, {"request_id": "d1", "attempt": 1, "armed": True}, live=_live)
    return book


def test_the_last_member_at_the_fence_starts_the_move():
    book = _armed()
    assert book.reached(0, {"request_id": "d1"}) is False
    assert book.reached(1, {"request_id": "other"}) is False
    assert book.reached(1, {"request_id": "d1"}) is True
    out, decision, nodes = book.start(_slots())
    assert nodes == ["n1"] and decision.action is Action.HOT_SWAP
    assert decision.reason == "planned drain of n1 (request d1)" and book.current.state == "moving"
    assert [(e.NAME, e.live_step) for e in out.events] == [("drain_start", 7)]
    assert out.commands == [Send(1, {"type": "stop", "drained": True, "job_state": "drained",
                                     "reason": "drained: logical rank 1 moves to a spare"})]


# (name, state before, reason) -> (event, journalled reason prefix)
MISSED = [
    ("confirming: refused", "confirming", "a recovery started first (x)", "drain_refused",
     "a recovery started first (x)"),
    ("armed: missed", "armed", "the job ended (done)", "drain_missed", "the job ended (done)"),
    ("moving: missed, replaced by the next recovery", "moving", "y", "drain_missed",
     "the drain's hot swap was cut short"),
]


@pytest.mark.parametrize("name,state,reason,event,why", MISSED, ids=[m[0] for m in MISSED])
def test_what_came_first(name, state, reason, event, why):
    book = DrainBook()
    _request(book, _body())
    book.current.state = state
    out = book.missed(reason, live=lambda w: w == 0)
    assert [e.NAME for e in out.events] == [event] and out.events[0].reason.startswith(why)
    assert out.commands[0] == Send(0, {"type": "undrain", "request_id": "d1"})  # only the live member
    assert book.missed("again", live=_live).events == []  # never twice


def test_unconfirmed_past_the_deadline_is_refused():
    book = DrainBook()
    _request(book, _body())
    book.ack(0, {"request_id": "d1", "attempt": 1, "armed": True}, live=_live)
    assert book.tick(70.0, live=_live).events == []
    out = book.tick(70.5, live=_live)
    assert out.events[0].reason == "world rank(s) [1] did not confirm within 20 s"


def test_the_hot_swaps_end_is_journalled_with_the_moves():
    book = _armed()
    book.reached(0, {"request_id": "d1"})
    book.reached(1, {"request_id": "d1"})
    book.start(_slots())
    plan = SimpleNamespace(joins=[SimpleNamespace(replaces_world_rank=1, world_rank=2, logical_rank=1)],
                           steps_replayed=0, recoverable_step=7, action="hot_swap", grid=GRID, leavers=())
    other = SimpleNamespace(drain=None, plan=plan, generation=1, t_start=10.0)
    assert book.finished(other, 12.0, standby=lambda w: False).events == []
    rec = SimpleNamespace(drain=book.current, plan=plan, generation=1, t_start=10.0)
    (ev,) = book.finished(rec, 12.5, standby=lambda w: False).events
    assert (ev.NAME, ev.moved, ev.steps_replayed, ev.total_s) == ("drain_done", [[1, 2, 1]], 0, 2.5)
    assert book.current.state == "done"
