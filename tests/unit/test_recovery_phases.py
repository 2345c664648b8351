"""The recovery's phase table and its next-step rules as tables: a recovery record, the dead slots, the
members' steps and the clock in; the step (and the slots and reasons it names) out
(control/recovery_phases.py)."""

from __future__ import annotations

import pytest

from phoenix_hpc.control.classify import Action, Decision
from phoenix_hpc.control.records import Recovery
from phoenix_hpc.control.recovery_phases import PHASE_TRANSITIONS, Step, check_move, on_answers, on_tick
from phoenix_hpc.control.states import IllegalTransition
from phoenix_hpc.control.states import RecoveryPhase as RP


class _Plan:
    """What the rules read of a plan: its rank map (logical, world)."""

    def __init__(self, worlds):
        self.rank_map = [(r, w) for r, w in enumerate(worlds)]


def _rec(phase=RP.QUIESCE, quiesced=(), recovered=(), plan=None, target=0):
    rec = Recovery(Decision(Action.HOT_SWAP, "x"), [], 1, {0, 1, 2}, t_fault=0.0, t_start=10.0, deadline=40.0)
    rec.phase, rec.target_step = phase, target
    rec.quiesced = {w: {} for w in quiesced}
    rec.recovered = {w: {} for w in recovered}
    rec.plan = _Plan(plan) if plan is not None else None
    return rec


# (name, record, dead world ranks, steps, faults pending, now) -> (step, slots, reason, dead_reason)
TICK = [
    ("quiesce: waiting on answers", _rec(quiesced=[0, 1]), set(), {}, False, 20.0, (Step.WAIT, (), "", "")),
    ("quiesce: every survivor answered", _rec(quiesced=[0, 1, 2]), set(), {}, False, 20.0, (Step.PLAN, (), "", "")),
    ("quiesce: a survivor died", _rec(quiesced=[0, 1, 2]), {1}, {}, False, 20.0,
     (Step.ABORT, (1,), "slot(s) [1] died during the quiesce phase", "")),
    ("quiesce: past the deadline, the silent are declared dead", _rec(quiesced=[0]), set(), {}, False, 40.5,
     (Step.TIMEOUT, (1, 2), "slot(s) [1, 2] did not answer the quiesce", "no quiesce answer within 30s")),
    ("quiesce: at the deadline still waits", _rec(quiesced=[0]), set(), {}, False, 40.0, (Step.WAIT, (), "", "")),
    ("restore: a spare of the plan died", _rec(RP.RESTORE, plan=[0, 3]), {3}, {}, False, 20.0,
     (Step.ABORT, (3,), "slot(s) [3] died during the restore phase", "")),
    ("restore: a dead non-member does not matter", _rec(RP.RESTORE, recovered=[0, 3], plan=[0, 3]), {2}, {},
     False, 20.0, (Step.CHECK, (), "", "")),
    ("restore: silent past the deadline", _rec(RP.RESTORE, recovered=[3], plan=[0, 3]), set(), {}, False, 41.0,
     (Step.TIMEOUT, (0,), "slot(s) [0] did not answer the restore", "no restore answer within 30s")),
    ("replay: a member not past the target", _rec(RP.REPLAY, plan=[0, 3], target=8), set(), {0: 8, 3: 7}, False,
     20.0, (Step.WAIT, (), "", "")),
    ("replay: every member past the target", _rec(RP.REPLAY, plan=[0, 3], target=8), set(), {0: 9, 3: 8}, True,
     20.0, (Step.FINISH, (), "", "")),
    ("replay: a fault first cuts it short", _rec(RP.REPLAY, plan=[0, 3], target=8), set(), {0: 9, 3: 7}, True,
     20.0, (Step.INTERRUPTED, (), "", "")),
    ("replay: a dead member is the fault's business, not the replay's", _rec(RP.REPLAY, plan=[0, 3], target=8),
     {3}, {0: 9, 3: 7}, False, 99.0, (Step.WAIT, (), "", "")),
]


@pytest.mark.parametrize("name,rec,dead,steps,faults,now,expected", TICK, ids=[c[0] for c in TICK])
def test_on_tick_table(name, rec, dead, steps, faults, now, expected):
    nxt = on_tick(rec, dead=dead.__contains__, step_of=steps.__getitem__, faults_pending=faults, now=now)
    assert (nxt.step, nxt.slots, nxt.reason, nxt.dead_reason) == expected


# (name, record, dead, steps, faults pending, overdue, now) -> step
ANSWERS = [
    ("quiesce: all in, one tick after the start", _rec(quiesced=[0, 1, 2]), set(), {}, False, False, 10.2,
     Step.PLAN),
    ("quiesce: all in, but sooner than a tick", _rec(quiesced=[0, 1, 2]), set(), {}, False, False, 10.05,
     Step.WAIT),
    ("quiesce: all in, a fault pending", _rec(quiesced=[0, 1, 2]), set(), {}, True, False, 20.0, Step.WAIT),
    ("quiesce: all in, a slot overdue", _rec(quiesced=[0, 1, 2]), set(), {}, False, True, 20.0, Step.WAIT),
    ("quiesce: all in, past the deadline (the tick decides)", _rec(quiesced=[0, 1, 2]), set(), {}, False, False,
     40.5, Step.WAIT),
    ("quiesce: a survivor dead", _rec(quiesced=[0, 1, 2]), {2}, {}, False, False, 20.0, Step.WAIT),
    ("restore: all recovered", _rec(RP.RESTORE, recovered=[0, 3], plan=[0, 3]), set(), {}, True, True, 20.0,
     Step.CHECK),
    ("restore: a member dead waits for the tick", _rec(RP.RESTORE, recovered=[0, 3], plan=[0, 3]), {3}, {},
     False, False, 20.0, Step.WAIT),
    ("replay: past the target", _rec(RP.REPLAY, plan=[0, 3], target=8), set(), {0: 8, 3: 8}, False, False, 20.0,
     Step.FINISH),
    ("replay: past the target but a fault pending", _rec(RP.REPLAY, plan=[0, 3], target=8), set(), {0: 8, 3: 8},
     True, False, 20.0, Step.WAIT),
]


@pytest.mark.parametrize("name,rec,dead,steps,faults,overdue,now,expected", ANSWERS, ids=[c[0] for c in ANSWERS])
def test_on_answers_table(name, rec, dead, steps, faults, overdue, now, expected):
    nxt = on_answers(rec, dead=dead.__contains__, step_of=steps.__getitem__, faults_pending=faults,
                     overdue=lambda: overdue, now=now, tick_s=0.1)
    assert nxt.step is expected


@pytest.mark.parametrize("old,new,ok", [
    (RP.QUIESCE, RP.RESTORE, True), (RP.QUIESCE, RP.ABORTED, True), (RP.RESTORE, RP.REPLAY, True),
    (RP.RESTORE, RP.ABORTED, True), (RP.QUIESCE, RP.REPLAY, False), (RP.REPLAY, RP.ABORTED, False),
    (RP.REPLAY, RP.QUIESCE, False), (RP.ABORTED, RP.QUIESCE, False), (RP.RESTORE, RP.QUIESCE, False),
])
def test_phase_table(old, new, ok):
    assert (new in PHASE_TRANSITIONS[old]) is ok
    if ok:
        assert check_move(old, new) is new
        rec = _rec(old)
        rec.move(new)
        assert rec.phase is new
    else:
        with pytest.raises(IllegalTransition, match=f"{old.value} -> {new.value}"):
            _rec(old).move(new)
