"""The fault-injection book as tables: a request, acks, landings, lost slots, the clock or the job's end in;
journal events and commands out (control/injects.py InjectBook). No coordinator, no store."""

from __future__ import annotations

import pytest

from phoenix_hpc.control.commands import CountRejected, Hold, Reject, Release, Send
from phoenix_hpc.control.injects import InjectBook
from phoenix_hpc.control.records import Slot
from phoenix_hpc.control.states import JobState, SlotState, slot_machine

GRID = (1, 1, 2)  # tp, pp, dp


def _slots(steps=(3, 3), dead=()):
    out = {}
    for w, step in enumerate(steps):
        s = Slot(w, f"n{w}", 100 + w, "active", slot_machine(f"slot {w}"), 0.0, logical_rank=w, step=step)
        s.machine.to(SlotState.ACTIVE)
        if w in dead:
            s.machine.to(SlotState.DEAD)
        out[w] = s
    return out


def _req(**kw):
    body = {"type": "inject", "kind": "crash", "phase": "forward_backward", "at_step": 5,
            "target": {"logical_rank": 1}, "reply_to": "cli", "request_id": "r1"}
    body.update(kw)
    return {k: v for k, v in body.items() if v is not None}


def _request(book, body, slots=None, job=JobState.RUNNING, holder=None):
    return book.request(body, slots=slots or _slots(), rank_map={0: 0, 1: 1}, grid=GRID, job_state=job,
                        holder_of=holder or (lambda owners: (None, "no holder")), now=100.0, new_id=lambda: "new")


def _names(out):
    return [e.NAME for e in out.events]


# (name, request fields, slots, job state) -> the refusal's reason
REFUSALS = [
    ("unknown kind", {"kind": "meteor"}, None, JobState.RUNNING, "inject: kind 'meteor' not one of"),
    ("unknown phase", {"phase": "lunch"}, None, JobState.RUNNING, "inject: phase 'lunch' not one of"),
    ("step 0", {"at_step": 0}, None, JobState.RUNNING, "inject: at_step 0 must be an integer >= 1"),
    ("step not an integer", {"at_step": "5"}, None, JobState.RUNNING, "inject: at_step '5' must be an integer >= 1"),
    ("step a bool", {"at_step": True}, None, JobState.RUNNING, "inject: at_step True must be an integer >= 1"),
    ("ended job", {}, None, JobState.DONE, "inject: the job is done"),
    ("dead target", {}, _slots(dead=(1,)), JobState.RUNNING, "inject: no live slot holds logical rank 1"),
    ("bad steps_ahead", {"steps_ahead": True}, None, JobState.RUNNING, "inject: steps_ahead True must be"),
    ("a step already done", {"at_step": 3}, None, JobState.RUNNING,
     "inject: step 3 already done by the target (at step 3)"),
    ("no holder of the shard", {"kind": "corrupt_replica"}, None, JobState.RUNNING, "inject: no holder"),
]


@pytest.mark.parametrize("name,fields,slots,job,reason", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_a_refused_request_is_only_rejected(name, fields, slots, job, reason):
    book = InjectBook()
    out = _request(book, _req(**fields), slots=slots, job=job)
    assert out.events == [] and len(out.commands) == 1 and isinstance(out.commands[0], Reject)
    assert out.commands[0].reason.startswith(reason), out.commands[0].reason
    assert book.requests == {}


def test_an_accepted_request_is_journalled_held_and_forwarded():
    book = InjectBook()
    out = _request(book, _req(steps_ahead=4))
    assert _names(out) == ["inject_forwarded"] and out.events[0].at_step == 7  # max(5, step 3 + 4)
    hold, send = out.commands
    assert isinstance(hold, Hold) and hold.request["reply_to"] == "cli"
    assert send == Send(1, {"type": "inject", "kind": "crash", "at_step": 7, "phase": "forward_backward",
                            "request_id": "r1", "steps_ahead": 4})
    assert book.requests["r1"].deadline == 120.0  # the default 20 s to confirm
    again = _request(book, _req())
    assert again.commands[0].reason == "inject: request id 'r1' was already used"


def test_corrupt_replica_goes_to_the_holder_with_the_shard():
    book = InjectBook()
    out = _request(book, _req(kind="corrupt_replica"), holder=lambda owners: ((0, "pp0-dp1-tp0"), ""))
    assert out.events[0].targets == [0] and out.events[0].shard_id == "pp0-dp1-tp0"
    assert out.commands[1] == Send(0, {"type": "inject", "kind": "corrupt_replica", "at_step": 5,
                                       "phase": "forward_backward", "request_id": "r1", "shard_id": "pp0-dp1-tp0"})


def _armed_book():
    """A book with request r1 being confirmed by world ranks 0 and 1."""
    book = InjectBook()
    _request(book, _req(target={"world_rank": 0}))
    req = book.requests["r1"]
    req.targets = [0, 1]
    return book, req


def test_every_target_armed_accepts_and_one_refusal_refuses_and_disarms():
    book, _ = _armed_book()
    assert book.ack(0, {"request_id": "r1", "armed": True, "at_step": 5, "started_step": 3},
                    live=lambda w: True).events == []
    out = book.ack(1, {"request_id": "r1", "armed": True, "at_step": 6, "started_step": 4}, live=lambda w: True)
    assert _names(out) == ["inject_armed"] and out.events[0].armed_steps == [(0, 5), (1, 6)]
    (rel,) = out.commands
    assert isinstance(rel, Release) and rel.body["at_step"] == 6 and rel.body["type"] == "accepted"
    # an ack after the verdict changes nothing
    assert book.ack(1, {"request_id": "r1", "armed": False}, live=lambda w: True).commands == []

    book, _ = _armed_book()
    out = book.ack(1, {"request_id": "r1", "armed": False, "reason": "step 5 started"}, live=lambda w: w != 0)
    assert _names(out) == ["inject_refused"]
    assert out.commands[:-2] == [Send(1, {"type": "disarm", "request_id": "r1"})]  # only the live target
    assert isinstance(out.commands[-2], CountRejected)
    assert out.commands[-1].body == {"type": "rejected", "reason": "inject: world rank 1: step 5 started"}


def test_unconfirmed_past_the_deadline_is_refused_naming_the_silent():
    book, _ = _armed_book()
    book.ack(0, {"request_id": "r1", "armed": True, "at_step": 5}, live=lambda w: True)
    assert book.tick(120.0, live=lambda w: True).events == []
    out = book.tick(120.5, live=lambda w: True)
    assert _names(out) == ["inject_refused"] and out.events[0].reason.startswith("world rank(s) [1] did not confirm")


# (name, fired already, lost worlds) -> missed world ranks
LOST = [
    ("a lost armed target that did not fire is missed", set(), [1], [1]),
    ("its landing file says it fired: not missed", {1}, [1], []),
    ("a slot that is no target: nothing", set(), [7], []),
]


@pytest.mark.parametrize("name,fired,lost,missed", LOST, ids=[c[0] for c in LOST])
def test_lost_targets_of_an_armed_request(name, fired, lost, missed):
    book, req = _armed_book()
    for w in (0, 1):
        book.ack(w, {"request_id": "r1", "armed": True, "at_step": 5}, live=lambda w: True)
    out = book.lost(lost, "process exited", live=lambda w: True, has_fired=lambda rid, w: w in fired)
    assert [e.world_rank for e in out.events] == missed and out.commands == []
    if missed:
        assert out.events[0].reason == "world rank 1 was lost before step 5 (process exited)"
        assert book.lost(lost, "again", live=lambda w: True, has_fired=lambda rid, w: False).events == []


def test_a_landing_is_journalled_exact_or_not():
    book, _ = _armed_book()
    for w in (0, 1):
        book.ack(w, {"request_id": "r1", "armed": True, "at_step": 5}, live=lambda w: True)
    out = book.fired(0, {"request_id": "r1", "step": 5, "phase": "forward_backward"})
    assert _names(out) == ["inject_landed"] and out.events[0].exact is True
    assert book.fired(1, {"request_id": "r1", "step": 6, "phase": "forward_backward"}).events[0].exact is False
    # the job ends: what fired is not missed; nothing else is pending
    assert book.at_end(JobState.DONE, live=lambda w: True, has_fired=lambda rid, w: False).events == []


def test_the_end_refuses_the_unconfirmed_and_misses_the_unfired():
    book, _ = _armed_book()
    out = book.at_end(JobState.STOPPED, live=lambda w: False, has_fired=lambda rid, w: False)
    assert _names(out) == ["inject_refused"] and out.events[0].reason == "the job ended (stopped)"
    assert not any(isinstance(c, Send) for c in out.commands)  # no live target to disarm
    book, _ = _armed_book()
    for w in (0, 1):
        book.ack(w, {"request_id": "r1", "armed": True, "at_step": 5}, live=lambda w: True)
    out = book.at_end(JobState.STOPPED, live=lambda w: True, has_fired=lambda rid, w: w == 0)
    assert [(e.NAME, e.world_rank) for e in out.events] == [("inject_missed", 1)]
    assert out.events[0].reason == "the job ended (stopped) before step 5, phase forward_backward"
