"""The coordinator's records of slots and recoveries (plain data; the logic is in the mixins of
:class:`phoenix_hpc.control.coordinator.Coordinator`).

:class:`Slot`: one training process as the coordinator knows it (world rank, node, pid, role, lifecycle,
logical rank, generation, last reported step). :class:`PendingFault`: a fault waiting for a decision.
:class:`Recovery`: the one recovery in progress (:mod:`phoenix_hpc.control.recovery_machine`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from phoenix_hpc.control.classify import Decision, Fault
from phoenix_hpc.control.recovery_phases import check_move
from phoenix_hpc.control.states import RecoveryPhase, SlotState, StateMachine
from phoenix_hpc.recovery.plan import RecoveryPlan


@dataclass
class Slot:
    """One registered training process: ``world_rank`` (its srun task), ``node``, ``pid``, ``role``
    (``active`` or ``standby`` at registration), its lifecycle ``machine`` (:mod:`phoenix_hpc.control.states`),
    ``last_seen`` (coordinator clock, seconds), the ``logical_rank`` it holds (None for a spare), the
    ``generation`` it was last restored to and the newest ``step`` it reported."""

    world_rank: int
    node: str
    pid: int
    role: str  # "active" | "standby"
    machine: StateMachine
    last_seen: float
    logical_rank: int | None = None
    generation: int = 0
    step: int = 0
    domain: dict[str, str] | None = None  # failure domains of its node, as it registered them
    registered_at: float | None = None  # coordinator clock; default: last_seen at construction

    def __post_init__(self) -> None:
        if self.registered_at is None:
            self.registered_at = self.last_seen

    @property
    def state(self) -> SlotState:
        return self.machine.state


@dataclass
class PendingFault:
    """A fault waiting for the recovery machine's decision, with the coordinator clock ``t`` it arrived at."""

    fault: Fault
    t: float  # coordinator clock when it arrived


@dataclass
class Recovery:
    """The one recovery in progress (times on the coordinator clock, seconds): what was decided for which
    faults, the new ``generation``, the surviving world ranks, the ``phase`` with its ``deadline``, the
    answers collected per world rank (``quiesced``, ``recovered``), the ``plan`` once made, per-phase
    durations, and the step the members must pass before the recovery is done (``target_step``)."""

    decision: Decision
    faults: list[Fault]
    generation: int
    survivors: set[int]
    t_fault: float  # estimated time the fault happened (coordinator clock)
    t_start: float
    phase: RecoveryPhase = RecoveryPhase.QUIESCE  # quiesce -> restore -> replay (control/recovery_phases.py)
    deadline: float = 0.0
    quiesced: dict[int, dict] = field(default_factory=dict)
    plan: RecoveryPlan | None = None
    recovered: dict[int, dict] = field(default_factory=dict)
    t_restored: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    target_step: int = 0
    drain: Any = None  # the control.drains.PendingDrain this hot swap carries out (a planned drain), else None

    def move(self, phase: RecoveryPhase) -> None:
        """Go to ``phase``.

        Raises:
            IllegalTransition: :data:`phoenix_hpc.control.recovery_phases.PHASE_TRANSITIONS` does not allow it.
        """
        self.phase = check_move(self.phase, phase)
