"""Fault kinds that can be injected, the phases each one can land in, and request validation (pure).

A fault is injected at a *step* and a *phase* of one target (a logical rank, a node or a grid coordinate).
``at_step = s`` means "during the training iteration that produces S(s)", i.e. while the target has
completed ``s - 1`` optimizer steps; the phases of that iteration (docs/design.md section 4) are:

=========== ==================================================================================
phase       where in iteration s (wire name sent to the coordinator)
=========== ==================================================================================
forward     inside forward/backward of step s (``forward_backward``)
d2h         while S(s-1) is copied device -> host into the staging buffer (``d2h``)
h2h         while the optimizer part of S(s-1) is sent to the replica holders (``h2h``)
optimizer   inside ``optimizer.step()`` of step s, after the commit (``optimizer_step``)
recovery    during a recovery (quiesce, rebuild, restore) that begins in step s or later
            (``recovery``): a second fault while the first is being handled; it lands as the target
            starts its part of the recovery (a survivor as it quiesces, a spare as it starts to join)
restore     in a recovery that begins in step s or later, once every member of the new generation
            built its groups, as the target starts to restore state (its transfers or the
            checkpoint load, then its new protector) (``restore``): in a hot swap, a loss while
            the others send, receive or wait for it to start protection
=========== ==================================================================================

The kinds, what each does to its target, and the coordinator's expected reaction (docs/design.md section 6):

============ ======================================================= ================ =============
kind         effect on every targeted slot                           classified as    action
============ ======================================================= ================ =============
crash        the process exits at once (``os._exit``)               process_exit     hot swap
kill-node    every slot of the node is SIGKILLed; on the local       node_loss        hot swap
             cluster the node's slurmd is killed too and the node
             is marked DOWN
hang         the process stops itself (SIGSTOP): alive, silent       heartbeat_timeout hot swap
link-down    the slot stops communicating (heartbeats, collectives,  heartbeat_timeout hot swap
             H2H) while the process keeps running
transient    one collective raises a communication error; every      comm_error       local recovery
             process stays alive
gpu-error    an error with the signature of an uncorrectable HBM     gpu_memory       hot swap
             ECC fault (Xid 48) is raised
corrupt-     bytes flipped in one holder's committed replica (and    silent_corruption none until a
replica      its previous buffer) of the target's shard; nobody is                    recovery needs
             told. The coordinator sends it to a holder of that                       it
             shard (the target names the shard, by its owner)
bitflip      one bit of one live parameter flips on the target at    silent_corruption local
             the start of iteration s, before its snapshot of                          recovery to
             S(s-1) starts: its parameter digest of step s - 1                         S(s-2), every
             differs from its DP peers' at that commit fence, which                    member, and
             every rank reads (replica agreement, control/                             replay
             agreement.py); no rank overwrites its copy of S(s-2).
             With dp = 1 it is journalled as undetectable; a
             member named twice within resilience.agreement_
             strikes_window_steps is replaced (hot swap); a second
             difference at the same step stops the job cleanly
============ ======================================================= ================ =============

A ``corrupt-replica`` fault causes no recovery by itself: the copy is caught when a recovery needs it (the
holder verifies its replicas again when it quiesces, docs/design.md section 6). In phase ``recovery`` it
lands at the start of the next recovery, before that verification: with a second verified replica (k=2) the
plan takes that one and the journal names the rejected copy (``replica_rejected``); with none the job
restarts from the persistent checkpoint, every member at the same step.

Phases a kind does not support are refused: a ``transient`` collective error needs a collective (forward
and backward carry the TP/PP/DP collectives, h2h the replica exchange, optimizer the ZeRO parameter
all-gather), a ``link-down`` needs communication (not the local D2H copy), a ``gpu-error`` needs GPU work
(not the host-to-host replica exchange). ``restore`` takes the kinds that end or stop a process (crash,
kill-node, hang): a raised error there is no fault of a step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from phoenix_hpc.errors import FaultError

PHASES: tuple[str, ...] = ("forward", "d2h", "h2h", "optimizer", "recovery", "restore")
"""User-facing phase names, in the order they occur in a step (``recovery`` and ``restore`` are outside the
step, in a recovery: :data:`phoenix_hpc.faults.trigger.RECOVERY_PHASES`)."""

PHASE_WIRE: Mapping[str, str] = {
    "forward": "forward_backward",
    "d2h": "d2h",
    "h2h": "h2h",
    "optimizer": "optimizer_step",
    "recovery": "recovery",
    "restore": "restore",
}
"""User phase -> the phase name of the control protocol (``phoenix_hpc.control.protocol.INJECT_PHASES``),
which is also what the rank loop passes to :meth:`phoenix_hpc.faults.trigger.FaultTrigger.check`."""

PHASE_OF_WIRE: Mapping[str, str] = {w: p for p, w in PHASE_WIRE.items()}

DEFAULT_PHASE = "forward"


@dataclass(frozen=True)
class KindSpec:
    """One injectable fault kind.

    ``wire``: the kind name in the ``inject`` message; ``phases``: user phases it can land in;
    ``fault_kind``: the :class:`phoenix_hpc.control.classify.FaultKind` value the coordinator should
    detect; ``action``: the expected decision (``hot_swap`` or ``local_recovery``); ``effect``: one line
    for help texts and reports.
    """

    name: str
    wire: str
    phases: tuple[str, ...]
    fault_kind: str
    action: str
    effect: str


_ALL = PHASES
KINDS: Mapping[str, KindSpec] = {
    k.name: k
    for k in (
        KindSpec("crash", "crash", _ALL, "process_exit", "hot_swap", "the target process exits"),
        KindSpec("kill-node", "node_loss", _ALL, "node_loss", "hot_swap",
                 "every slot of the node dies (on the local cluster its slurmd too; the node is marked down)"),
        KindSpec("hang", "hang", _ALL, "heartbeat_timeout", "hot_swap",
                 "the target process stops itself (SIGSTOP): alive but silent"),
        KindSpec("link-down", "link_down", ("forward", "h2h", "optimizer", "recovery"), "heartbeat_timeout",
                 "hot_swap", "the target stops communicating while its process keeps running"),
        KindSpec("transient", "transient", ("forward", "h2h", "optimizer"), "comm_error", "local_recovery",
                 "one collective raises a communication error; every process stays alive"),
        KindSpec("gpu-error", "gpu_error", ("forward", "d2h", "optimizer", "recovery"), "gpu_memory", "hot_swap",
                 "an uncorrectable HBM ECC error (Xid 48) is raised on the target"),
        KindSpec("corrupt-replica", "corrupt_replica", ("forward", "optimizer", "recovery"), "silent_corruption",
                 "none", "bytes flip in one holder's committed replica of the target's shard; nobody is told"),
        KindSpec("bitflip", "bitflip", ("forward",), "silent_corruption", "local_recovery",
                 "one bit of one live parameter flips on the target; its DP peers' parameter digests differ "
                 "at the next commit fence and every member rolls back before it"),
    )
}

KIND_OF_WIRE: Mapping[str, str] = {k.wire: k.name for k in KINDS.values()}


def kind_spec(kind: str) -> KindSpec:
    """The :class:`KindSpec` of a user kind name.

    Raises:
        FaultError: unknown kind (the message lists the allowed ones).
    """
    try:
        return KINDS[kind]
    except KeyError:
        raise FaultError(f"--kind: {kind!r} is not a fault kind; allowed: {', '.join(KINDS)}") from None


def check_phase(kind: str, phase: str | None) -> str:
    """The phase a fault of ``kind`` lands in (``phase``, or :data:`DEFAULT_PHASE` when None).

    Raises:
        FaultError: unknown kind, unknown phase, or a phase the kind does not support (says which are).
    """
    spec = kind_spec(kind)
    p = DEFAULT_PHASE if phase is None else phase
    if p not in PHASES:
        raise FaultError(f"--phase: {p!r} is not a phase; allowed: {'|'.join(PHASES)}")
    if p not in spec.phases:
        raise FaultError(f"--phase: a {kind} fault cannot land in phase {p!r}; {kind} supports "
                         f"{'|'.join(spec.phases)}")
    return p


def check_at_step(at_step: int | None, *, live_step: int | None = None, total_steps: int | None = None,
                  as_of_s: float | None = None) -> None:
    """Validate a requested step.

    Args:
        at_step: the iteration to fail in (see the module doc), or None (the CLI picks the next one).
        live_step: the newest step the job is known to have completed, if known.
        total_steps: ``training.steps`` of the job, if known (a fault after the last step never lands).
        as_of_s: how old ``live_step`` is, in seconds (the status's ``now - step_at``), said in the refusal:
            the same step and age ``phoenix status`` shows.

    Raises:
        FaultError: ``at_step < 1``, beyond the job's last step, or not after the live step.
    """
    if at_step is None:
        return
    if at_step < 1:
        raise FaultError(f"--at-step: {at_step} is not allowed; steps start at 1")
    if total_steps is not None and at_step > total_steps:
        raise FaultError(f"--at-step: {at_step} is beyond the job's last step (training.steps = {total_steps})")
    if live_step is not None and at_step <= live_step:
        fresh = "" if as_of_s is None else (
            f" as of {as_of_s:.1f} s ago, the step `phoenix status` shows; the job trains on meanwhile")
        raise FaultError(f"--at-step: step {at_step} is already done (the job is at step {live_step}){fresh}; "
                         f"choose a step > {live_step}")


def parse_coord(text: str, grid: tuple[int, int, int] | None = None) -> tuple[int, int, int]:
    """``"pp,dp,tp"`` -> ``(pp, dp, tp)``, checked against ``grid = (tp, pp, dp)`` sizes when given.

    Raises:
        FaultError: not three non-negative integers, or outside the grid.
    """
    parts = [p.strip() for p in str(text).split(",")]
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise FaultError(f"--coord: {text!r} is not allowed; expected three integers pp,dp,tp (e.g. 0,1,0)")
    pp, dp, tp = (int(p) for p in parts)
    if grid is not None:
        T, PP, D = grid
        if not (pp < PP and dp < D and tp < T):
            raise FaultError(f"--coord: ({pp},{dp},{tp}) is outside the job's grid; allowed pp 0..{PP - 1}, "
                             f"dp 0..{D - 1}, tp 0..{T - 1}")
    return pp, dp, tp
