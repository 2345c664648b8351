"""Explicit lifecycles of a slot and of a job: an Enum each and an allowed-transition table.

Slot (one process of the job, docs/design.md section 2)::

    STARTING --register--> STANDBY (spare node) | ACTIVE (holds a logical rank)
    STANDBY  --taken by a recovery--> JOINING --restored--> ACTIVE
    ACTIVE   --quiesce for a recovery--> QUIESCED --resume--> ACTIVE
    QUIESCED --its DP replica removed by a shrink--> STANDBY
    any live state --> DEAD (missed heartbeats, process exit, node loss)    [terminal]
    STANDBY | ACTIVE --> DONE (job finished)                                  [terminal]

Job::

    STARTING --> RUNNING <--> RECOVERING
    RUNNING | RECOVERING --> FALLBACK (memory replicas cannot cover the loss: restart from the
                                       persistent checkpoint) --> RUNNING
    RUNNING --> DONE; any non-terminal --> FAILED / STOPPED (told to stop)   [terminal]

An illegal transition raises :class:`IllegalTransition`: it always means a bug in the control plane (or a
message arriving in an impossible order), never something to recover from silently.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Generic, Mapping, TypeVar


class SlotState(str, enum.Enum):
    STARTING = "starting"
    STANDBY = "standby"
    JOINING = "joining"
    ACTIVE = "active"
    QUIESCED = "quiesced"
    DEAD = "dead"
    DONE = "done"


class RecoveryPhase(str, enum.Enum):
    """Where the coordinator's recovery of one generation is: survivors leave their step (QUIESCE), every
    member restores from the plan (RESTORE), the members replay the lost steps (REPLAY); ABORTED: a second
    fault cut it short (a new recovery follows). Its transition table: control/recovery_phases.py."""

    QUIESCE = "quiesce"
    RESTORE = "restore"
    REPLAY = "replay"
    ABORTED = "aborted"


class JobState(str, enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    RECOVERING = "recovering"
    FALLBACK = "fallback"
    DONE = "done"
    FAILED = "failed"
    STOPPED = "stopped"


S = SlotState
J = JobState

SLOT_TRANSITIONS: Mapping[SlotState, frozenset[SlotState]] = {
    S.STARTING: frozenset({S.STANDBY, S.ACTIVE, S.DEAD}),
    S.STANDBY: frozenset({S.JOINING, S.DEAD, S.DONE}),
    S.JOINING: frozenset({S.ACTIVE, S.DEAD}),
    S.ACTIVE: frozenset({S.QUIESCED, S.DEAD, S.DONE}),
    S.QUIESCED: frozenset({S.ACTIVE, S.DEAD, S.STANDBY}),
    S.DEAD: frozenset(),
    S.DONE: frozenset(),
}

JOB_TRANSITIONS: Mapping[JobState, frozenset[JobState]] = {
    J.STARTING: frozenset({J.RUNNING, J.FAILED, J.STOPPED}),
    J.RUNNING: frozenset({J.RECOVERING, J.FALLBACK, J.DONE, J.FAILED, J.STOPPED}),
    J.RECOVERING: frozenset({J.RUNNING, J.FALLBACK, J.FAILED, J.STOPPED}),
    J.FALLBACK: frozenset({J.RUNNING, J.FAILED, J.STOPPED}),
    J.DONE: frozenset(),
    J.FAILED: frozenset(),
    J.STOPPED: frozenset(),
}

# Slots in these states are processes we expect to be alive and heartbeating.
LIVE_SLOT_STATES = frozenset({S.STARTING, S.STANDBY, S.JOINING, S.ACTIVE, S.QUIESCED})
TERMINAL_JOB_STATES = frozenset({J.DONE, J.FAILED, J.STOPPED})


class IllegalTransition(RuntimeError):
    """A state machine was asked to move along an edge its table does not allow."""


E = TypeVar("E", SlotState, JobState)


@dataclass
class StateMachine(Generic[E]):
    """A current state plus its allowed-transition table and a history of ``(from, to, reason)``.

    ``name`` appears in error messages (e.g. ``"slot 5"``, ``"job"``).
    """

    state: E
    table: Mapping[E, frozenset[E]]
    name: str = "state machine"
    history: list[tuple[str, str, str]] = field(default_factory=list)

    def can(self, new: E) -> bool:
        """Whether ``new`` is reachable from the current state in one transition."""
        return new in self.table[self.state]

    def to(self, new: E, reason: str = "") -> E:
        """Move to ``new``. Returns the previous state.

        Raises:
            IllegalTransition: ``new`` is not allowed from the current state (also for self-loops).
        """
        if not self.can(new):
            allowed = ", ".join(sorted(s.value for s in self.table[self.state])) or "none (terminal)"
            raise IllegalTransition(
                f"{self.name}: illegal transition {self.state.value} -> {new.value}"
                f"{f' ({reason})' if reason else ''}; allowed from {self.state.value}: {allowed}"
            )
        old = self.state
        self.state = new
        self.history.append((old.value, new.value, reason))
        return old


def slot_machine(name: str, state: SlotState = SlotState.STARTING) -> StateMachine[SlotState]:
    """A slot's lifecycle, starting in ``state``."""
    return StateMachine(state, SLOT_TRANSITIONS, name)


def job_machine(state: JobState = JobState.STARTING) -> StateMachine[JobState]:
    """The job's lifecycle, starting in ``state``."""
    return StateMachine(state, JOB_TRANSITIONS, "job")
