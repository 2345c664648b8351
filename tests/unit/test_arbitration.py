"""Arbitration of pending faults as a table: queued faults, the active slots' last heartbeats and the clock
in; wait, or the action, the slots to fence and the reporters out (control/arbitration.py)."""

from __future__ import annotations

import pytest

from phoenix_hpc.control.arbitration import Fence, arbitrate, fault_time
from phoenix_hpc.control.classify import Action, Fault, FaultKind as K
from phoenix_hpc.control.records import PendingFault

TIMEOUT = 10.0


def _p(kind: K, slots: tuple[int, ...], t: float, detail: str = "") -> PendingFault:
    return PendingFault(Fault(kind, slots, tuple(f"n{w}" for w in slots), False, detail or kind.value), t)


# (name, pending, active last-seen times, dead member?, restore pending?, now) -> expected
#   expected: None (wait), or (action, fence [(slots, kind)], reporters, transient flags)
CASES = [
    ("a collective error before every slot heartbeated again waits",
     [_p(K.COMM_ERROR, (1,), 5.0)], [4.0, 6.0], False, False, 6.0, None),
    ("... and still waits at exactly the heartbeat timeout",
     [_p(K.COMM_ERROR, (1,), 5.0)], [4.0, 6.0], False, False, 5.0 + TIMEOUT, None),
    ("past the timeout without proof of life it is decided, not transient",
     [_p(K.COMM_ERROR, (1,), 5.0)], [4.0, 6.0], False, False, 5.1 + TIMEOUT,
     (Action.HOT_SWAP, [], {1}, [False])),
    ("every active slot heartbeated after the error: transient, a local recovery",
     [_p(K.COMM_ERROR, (1,), 5.0), _p(K.COLLECTIVE_TIMEOUT, (2,), 5.5)], [6.0, 7.0], False, False, 7.0,
     (Action.LOCAL_RECOVERY, [], {1, 2}, [True, True])),
    ("a heartbeat at the same instant as the error is no proof",
     [_p(K.COMM_ERROR, (1,), 5.0)], [5.0, 7.0], False, False, 7.0, None),
    ("a hardware error on a live member fences it; the peer's collective error does not",
     [_p(K.GPU_MEMORY, (3,), 5.0), _p(K.COMM_ERROR, (1,), 5.2)], [6.0], False, False, 6.0,
     (Action.HOT_SWAP, [((3,), K.GPU_MEMORY)], {1}, [False, False])),
    ("only current members are fenced (world rank 9 holds no logical rank)",
     [_p(K.PCIE, (3, 9), 5.0)], [6.0], False, False, 6.0,
     (Action.HOT_SWAP, [((3,), K.PCIE)], set(), [False])),
    ("a member already dead: nothing more to fence",
     [_p(K.PROCESS_EXIT, (3,), 5.0)], [6.0], True, False, 6.0, (Action.HOT_SWAP, [], set(), [False])),
    ("a spare's cut-short restore pending: nothing to fence",
     [_p(K.GPU_MEMORY, (3,), 5.0)], [6.0], False, True, 6.0, (Action.HOT_SWAP, [], set(), [False])),
    ("replicas that differ at a commit fence, reported by every rank: a local recovery, nobody fenced",
     [PendingFault(Fault(K.SILENT_CORRUPTION, (w,), (f"n{w}",), False, "differ", bad_step=9), 5.0) for w in (0, 1)],
     [6.0], False, False, 6.0, (Action.LOCAL_RECOVERY, [], set(), [False, False])),
    ("... with a repeat offender: only it is fenced, not the ranks that reported the difference",
     [PendingFault(Fault(K.SILENT_CORRUPTION, (0,), ("n0",), False, "differ", bad_step=9), 5.0),
      PendingFault(Fault(K.REPEATED_CORRUPTION, (2,), ("n2",), False, "twice", bad_step=9), 5.1)],
     [6.0], False, False, 6.0, (Action.HOT_SWAP, [((2,), K.REPEATED_CORRUPTION)], set(), [False, False])),
    ("a numerical error wins over a hot swap: clean stop, no fencing",
     [_p(K.NUMERICAL, (0,), 5.0), _p(K.GPU_MEMORY, (3,), 5.0)], [6.0], False, False, 6.0,
     (Action.CLEAN_STOP, [], set(), [False, False])),
]


@pytest.mark.parametrize("name,pending,seen,dead,restore,now,expected", CASES, ids=[c[0] for c in CASES])
def test_arbitration_table(name, pending, seen, dead, restore, now, expected):
    arb = arbitrate(pending, seen, dead_members=dead, restore_pending=restore, members=[0, 1, 2, 3], now=now,
                    heartbeat_timeout_s=TIMEOUT)
    if expected is None:
        assert arb is None
        return
    action, fence, reporters, transient = expected
    assert arb.decision.action is action
    assert [(f.slots, f.kind) for f in arb.fence] == fence
    assert arb.reporters == frozenset(reporters)
    assert [f.all_alive for f in arb.faults] == transient
    assert arb.arrived == tuple(p.t for p in pending)


def test_a_fence_carries_the_faults_detail_as_its_reason():
    arb = arbitrate([_p(K.GPU_MEMORY, (2,), 1.0, "Xid 79 on n2")], [2.0], dead_members=False,
                    restore_pending=False, members=[2], now=2.0, heartbeat_timeout_s=TIMEOUT)
    assert arb.fence == (Fence((2,), K.GPU_MEMORY, "Xid 79 on n2"),)


@pytest.mark.parametrize("arrived,hint,now,expected", [
    ((5.0, 4.0), None, 9.0, 4.0),   # the earliest arrival
    ((5.0,), 3.0, 9.0, 3.0),        # a dead slot's last heartbeat before it
    ((), None, 9.0, 9.0),           # nothing known: now
    ((5.0,), 7.0, 9.0, 5.0),
])
def test_fault_time(arrived, hint, now, expected):
    assert fault_time(arrived, hint, now) == expected
