"""What ends a member's step, its training or its part in a recovery before it is done (docs/design.md
section 6): the coordinator's ``quiesce`` heard at a step boundary (:class:`QuiesceRequested`, which leaves the
training loop), a re-plan heard in the restore's waits (:class:`RestoreInterrupted`, turned into the recovery's
transition back to quiescing in one place, :class:`phoenix_hpc.launch.rank_recovery.RankRecovery`), the
coordinator's ``stop`` (:class:`StopRequested`: the slot's end), a shrink that sent the slot back to standby
(:class:`LeftToStandby`, what the entry point hears), and the fault kind an error in the step is reported with.
"""

from __future__ import annotations

from typing import Any

from phoenix_hpc.errors import RecoveryError, ReplicationError


class QuiesceRequested(Exception):
    """The coordinator asked this member to stop at the step boundary (``msg`` is the ``quiesce`` body)."""

    def __init__(self, msg: dict[str, Any]):
        super().__init__(f"quiesce for generation {msg.get('generation')}")
        self.msg = msg


class RestoreInterrupted(Exception):
    """The coordinator re-planned the recovery this member is applying: a member of the plan was lost before
    every member answered ``recovered`` (``msg``: the newer ``quiesce``). Raised where the member waits on the
    others (``at``): at the arrival barrier (:meth:`Member._arrive_all`, ``"barrier"``), where nothing of the
    new generation exists yet and a survivor's engine on the rebind path is untouched; in its transfers
    (:func:`phoenix_hpc.launch.transfers.run`, ``"transfers"``), whose requests are then abandoned; at its new
    protector's arrival (:meth:`Member._build_protector`, ``"protector"``), before any of its buffers exist.
    The member answers the newer quiesce from the copies it quiesced with, which it still holds, and applies
    the next plan (docs/design.md section 6, "A loss in the restore phase")."""

    def __init__(self, msg: dict[str, Any], at: str = "barrier"):
        super().__init__(f"recovery re-planned as generation {msg.get('generation')}")
        self.msg = msg
        self.at = at


#: where a member was when its plan was cut short (:class:`RestoreInterrupted`), for its log line
CUT_AT = {"barrier": "waiting for the members of generation {g}",
          "transfers": "in its transfers of generation {g}",
          "protector": "waiting for the members of generation {g} to start protection",
          "groups": "waiting for the members of generation {g} to build their groups"}


class LeftToStandby(RecoveryError):
    """A shrink removed this slot's DP replica: it sent what it held and is a standby slot again (the
    entry point waits for a recovery plan that names it, as a spare does)."""

    job_state = "standby"


class StopRequested(RecoveryError):
    """The coordinator told this slot to stop (job ended, clean stop, fallback, or this slot was fenced)."""

    def __init__(self, msg: dict[str, Any]):
        self.msg = msg
        self.job_state = msg.get("job_state")
        super().__init__(f"stopped by the coordinator: {msg.get('reason', 'no reason given')}")


def fault_kind_of(exc: BaseException) -> str | None:
    """The fault kind to report for an error raised inside the step, or None (the coordinator classifies
    the message). An injected fault anywhere in the cause chain gives its own kind; a replication error
    (H2H over MPI, commit timeout) is a communication error unless its text names something more specific
    (a checksum: silent corruption)."""
    from phoenix_hpc.control.classify import FaultKind, kind_from_exception
    from phoenix_hpc.faults.trigger import InjectedFault

    e: BaseException | None = exc
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, InjectedFault):
            return e.fault_kind
        e = e.__cause__ or e.__context__
        seen += 1
    if isinstance(exc, ReplicationError):
        k = kind_from_exception(type(exc).__name__, str(exc))
        return FaultKind.COMM_ERROR.value if k is FaultKind.UNKNOWN else k.value
    return None
