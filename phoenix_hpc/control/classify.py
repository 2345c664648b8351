"""Fault classification: the table of docs/design.md section 6 as a pure function.

=====================================================================  ==================
signal                                                                 action
=====================================================================  ==================
transient communication error / collective timeout, all processes      LOCAL_RECOVERY
alive; DP replicas whose parameters differ at a commit fence (silent
corruption naming the step: roll back before it)
GPU memory (HBM/ECC/Xid), PCIe / host / kernel fault, node reboot or   HOT_SWAP
loss, network or storage loss on a node, process crash, missed
heartbeats (hang), communication error with a dead member; a member
found corrupting its replica twice within the strike window
software bug, numerical error (NaN/Inf), silent corruption without     CLEAN_STOP
a step to roll back before (checksum failures), unknown
=====================================================================  ==================

``CLEAN_STOP`` means: stop at once without training on, and hand over to the persistent-checkpoint restart
path with a clear message. Numerical and unknown faults never trigger a hot swap: replacing hardware cannot
fix them and replaying would reproduce them.

:func:`kind_from_exception` maps an exception raised inside the training step (type name + message, as a
rank reports it) to a :class:`FaultKind`; unrecognised text is ``UNKNOWN``.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class FaultKind(str, enum.Enum):
    COMM_ERROR = "comm_error"
    COLLECTIVE_TIMEOUT = "collective_timeout"
    GPU_MEMORY = "gpu_memory"
    PCIE = "pcie"
    HOST_FAULT = "host_fault"
    NODE_LOSS = "node_loss"
    NODE_REBOOT = "node_reboot"
    NETWORK_LOSS = "network_loss"
    STORAGE_LOSS = "storage_loss"
    PROCESS_EXIT = "process_exit"
    HEARTBEAT_TIMEOUT = "heartbeat_timeout"
    NUMERICAL = "numerical"
    SOFTWARE_BUG = "software_bug"
    SILENT_CORRUPTION = "silent_corruption"
    REPEATED_CORRUPTION = "repeated_corruption"
    UNKNOWN = "unknown"


class Action(str, enum.Enum):
    LOCAL_RECOVERY = "local_recovery"
    HOT_SWAP = "hot_swap"
    CLEAN_STOP = "clean_stop"


@dataclass(frozen=True)
class Fault:
    """One detected fault.

    ``slots``: world ranks of the slots the signal names (the reporter, the silent ones, the exited ones).
    ``all_alive``: whether every active slot is still alive (heartbeating, process running) -- only that
    makes a communication error transient. ``detail``: free text (exception message, detect reason).
    ``bad_step``: for ``silent_corruption`` found by the commit fence, the first committed step whose DP
    replicas differ (a recovery must restore an older step); ``agreed_step``: the newest step the fences
    showed in agreement before it (None: unknown).
    """

    kind: FaultKind
    slots: tuple[int, ...] = ()
    nodes: tuple[str, ...] = ()
    all_alive: bool = False
    detail: str = ""
    bad_step: int | None = None
    agreed_step: int | None = None


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str


_COMM = frozenset({FaultKind.COMM_ERROR, FaultKind.COLLECTIVE_TIMEOUT})
_HARDWARE = frozenset(
    {
        FaultKind.GPU_MEMORY,
        FaultKind.PCIE,
        FaultKind.HOST_FAULT,
        FaultKind.NODE_LOSS,
        FaultKind.NODE_REBOOT,
        FaultKind.NETWORK_LOSS,
        FaultKind.STORAGE_LOSS,
        FaultKind.PROCESS_EXIT,
        FaultKind.HEARTBEAT_TIMEOUT,
        FaultKind.REPEATED_CORRUPTION,
    }
)
_OUT_OF_SCOPE = {
    FaultKind.NUMERICAL: "numerical error (NaN/Inf): replaying on new hardware would reproduce it",
    FaultKind.SOFTWARE_BUG: "software bug: a hot swap cannot fix it",
    FaultKind.SILENT_CORRUPTION: "silent data corruption: in-memory state cannot be trusted",
    FaultKind.UNKNOWN: "unknown fault: not known to be fixed by replacing a node",
}


def _where(f: Fault) -> str:
    bits = []
    if f.slots:
        bits.append("slots " + ",".join(map(str, f.slots)))
    if f.nodes:
        bits.append("nodes " + ",".join(f.nodes))
    where = f" on {'; '.join(bits)}" if bits else ""
    return where + (f": {f.detail}" if f.detail else "")


def classify(fault: Fault) -> Decision:
    """The action for ``fault`` (docs/design.md section 6 table), with a reason a user can read."""
    k = fault.kind
    if k in _COMM:
        if fault.all_alive:
            return Decision(
                Action.LOCAL_RECOVERY,
                f"transient {k.value} with all processes alive{_where(fault)}: rebuild groups, roll back "
                "to the committed local snapshot, no spare used",
            )
        return Decision(Action.HOT_SWAP, f"{k.value} with a dead member{_where(fault)}: replace the lost slots")
    if k is FaultKind.SILENT_CORRUPTION and fault.bad_step is not None:
        return Decision(
            Action.LOCAL_RECOVERY,
            f"silent data corruption: the DP replicas' parameters differ at step {fault.bad_step}{_where(fault)}: "
            f"roll every member back to the newest step before it and replay, no spare used",
        )
    if k in _HARDWARE:
        return Decision(Action.HOT_SWAP, f"{k.value}{_where(fault)}: replace the node with a spare")
    return Decision(
        Action.CLEAN_STOP,
        f"{_OUT_OF_SCOPE[k]}{_where(fault)}; stopping cleanly, restart from the persistent checkpoint",
    )


# (pattern over "TypeName: message", kind); first match wins, so specific patterns come first.
_EXCEPTION_RULES: tuple[tuple[re.Pattern[str], FaultKind], ...] = tuple(
    (re.compile(p, re.IGNORECASE), k)
    for p, k in (
        (r"\bnan\b|\binf\b|non-?finite|FloatingPointError", FaultKind.NUMERICAL),
        (r"checksum|corrupt", FaultKind.SILENT_CORRUPTION),
        (r"ECC|\bXid\b|illegal memory access|HBM|uncorrectable", FaultKind.GPU_MEMORY),
        (r"PCIe|fallen off the bus", FaultKind.PCIE),
        (r"out of memory|OutOfMemoryError", FaultKind.SOFTWARE_BUG),
        (r"timed? ?out|timeout|watchdog", FaultKind.COLLECTIVE_TIMEOUT),
        (
            r"DistBackendError|DistNetworkError|gloo|nccl|connection (closed|reset|refused)|broken pipe"
            r"|ProcessGroup|peer",
            FaultKind.COMM_ERROR,
        ),
        (r"No space left|Input/output error|Stale file handle", FaultKind.STORAGE_LOSS),
        (
            r"^(AssertionError|TypeError|ValueError|KeyError|IndexError|AttributeError|NameError"
            r"|ZeroDivisionError|NotImplementedError)\b",
            FaultKind.SOFTWARE_BUG,
        ),
    )
)


def kind_from_exception(type_name: str, message: str) -> FaultKind:
    """Map an exception from inside the training step to a fault kind (``UNKNOWN`` when no rule matches).

    Args:
        type_name: the exception's class name, e.g. ``"DistBackendError"``.
        message: ``str(exc)``.
    """
    text = f"{type_name}: {message}"
    for pattern, kind in _EXCEPTION_RULES:
        if pattern.search(text):
            return kind
    return FaultKind.UNKNOWN


_PRIORITY = {Action.CLEAN_STOP: 2, Action.HOT_SWAP: 1, Action.LOCAL_RECOVERY: 0}


def combine(faults: "list[Fault] | tuple[Fault, ...]") -> Decision:
    """One decision for faults detected together (e.g. a node's four slots going silent plus the survivors'
    collective errors they caused). The most severe action wins: CLEAN_STOP > HOT_SWAP > LOCAL_RECOVERY,
    so a numerical error is never papered over by a hot swap; the reasons of that action are joined.

    Raises:
        ValueError: ``faults`` is empty.
    """
    if not faults:
        raise ValueError("combine() needs at least one fault")
    decisions = [classify(f) for f in faults]
    top = max(decisions, key=lambda d: _PRIORITY[d.action]).action
    reasons = list(dict.fromkeys(d.reason for d in decisions if d.action == top))
    return Decision(top, "; ".join(reasons))
