"""The rank-side half of fault injection: make an injected fault happen at exactly its step and phase.

The coordinator forwards an ``inject`` instruction ``{kind, at_step, phase, request_id}`` (wire names, see
:mod:`phoenix_hpc.faults.kinds`) to every targeted slot; the slot's
:class:`phoenix_hpc.control.client.CoordinatorClient` arms it (keeps it in ``client.injections``) when it
polls, if the slot has not started that step yet (:func:`arm_decision`), and refuses it otherwise; it
answers ``inject_ack`` either way, so a request is never accepted for a step that can no longer come. The
training loop and the runtime call :meth:`FaultTrigger.check` at every phase; the trigger fires the pending
injection whose step and phase match. Integration (the rank loop, ``phoenix_hpc.launch``)::

    trigger = FaultTrigger(pending=client.injections,
                           notify=FiredFile(run_dir, world_rank),
                           on_link_down=[client.stop_heartbeat])
    # iteration s = engine.step + 1, after client.poll():
    trigger.check(s, "forward_backward")     # before engine.forward_backward()
    trigger.check(s, "d2h")                  # in the D2H worker, before copying S(s-1)
    trigger.check(s, "h2h")                  # in the H2H worker, before sending S(s-1)
    trigger.check(s, "optimizer_step")       # before engine.optimizer_step()
    trigger.check(live_step + 1, "recovery") # in the quiesce handler; a standby slot checks
                                             # trigger.check(recovery_step(plan), "recovery") as it starts to
                                             # join a plan, every member again before it answers recovered
    trigger.check(recovery_step(plan), "restore")  # every member of a plan, once every member of the
                                             # generation built its groups (the member it is armed on waits
                                             # for the generation's count on the store), before its transfers
    # recovery_step(plan) (phoenix_hpc.launch.execute): R + the plan's replayed steps + 1, the iteration the
    # job was in when the recovery began
    # an InjectedFault raised by check() is reported like any error inside the step:
    #   client.report_fault(generation, s, phase, exc=e, kind=e.fault_kind)

What each kind does (the process-level effect is the real thing, not a simulation of it):

- ``crash``: :data:`EXIT_INJECTED_CRASH` via ``os._exit`` (no cleanup, like a segfaulting process);
- ``node_loss``: SIGKILL to itself (every slot of the node gets the instruction; on the local cluster the
  ``phoenix inject-fault`` command then kills the node's slurmd by its recorded PID);
- ``hang``: SIGSTOP to itself: the process and all its threads (heartbeat included) stop; it stays in the
  process table (state ``T``) until SIGCONT or SIGKILL;
- ``link_down``: sets :attr:`FaultTrigger.link_down`, calls each ``on_link_down`` hook (e.g. stop the
  heartbeat thread, close communicators), then blocks the calling thread: the slot stops talking while its
  process lives, so its peers' collectives time out and the coordinator misses its heartbeats;
- ``transient``: raises :class:`InjectedCommError` (a collective error; ``fault_kind = "comm_error"``);
- ``gpu_error``: raises :class:`InjectedGPUError` (uncorrectable ECC, Xid 48; ``fault_kind = "gpu_memory"``);
- ``corrupt_replica``: calls ``on_corrupt_replica(injection)`` (the member flips bytes in its held replica
  of ``injection.shard_id``) and returns: nothing is raised, nobody is told;
- ``bitflip``: calls ``on_bitflip(injection)`` (the member flips one bit of one live parameter,
  :func:`flip_param_bit`) and returns: nothing is raised, nobody is told; replica agreement finds it;
- ``nan`` / ``exception`` (accepted by the coordinator for clean-stop tests): raise
  :class:`InjectedNumericalError` / :class:`InjectedSoftwareError`.

Before the effect, ``notify(injection, step, phase)`` runs (default: nothing); :class:`FiredFile` writes
``RUN_DIR/faults/fired-<request_id>-w<world_rank>.json`` with fsync, so the landing is on disk even when the
effect is SIGKILL. ``phoenix status`` reads these files.
"""

from __future__ import annotations

import json
import math
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, MutableSequence

EXIT_INJECTED_CRASH = 70  # EX_SOFTWARE: an injected crash
FAULTS_DIR = "faults"
RECOVERY_PHASE = "recovery"
#: the phases of a recovery, outside every step: an injection in one lands at the first recovery at or after
#: its step (a recovery's step is not known in advance), also one after the job's last step
RECOVERY_PHASES = (RECOVERY_PHASE, "restore")


class InjectedFault(Exception):
    """Base of the exceptions an injected fault raises inside the step. ``fault_kind`` is the
    :class:`phoenix_hpc.control.classify.FaultKind` value to report; the message alone also classifies
    correctly through :func:`phoenix_hpc.control.classify.kind_from_exception`."""

    fault_kind = "unknown"

    def __init__(self, message: str, injection: "Injection | None" = None):
        super().__init__(message)
        self.injection = injection


class InjectedCommError(InjectedFault, RuntimeError):
    """A collective failed (as gloo/NCCL report a peer's connection reset); every process is alive."""

    fault_kind = "comm_error"


class InjectedGPUError(InjectedFault, RuntimeError):
    """An uncorrectable GPU memory error (what CUDA reports for an HBM ECC fault, Xid 48)."""

    fault_kind = "gpu_memory"


class InjectedNumericalError(InjectedFault, FloatingPointError):
    fault_kind = "numerical"


class InjectedSoftwareError(InjectedFault, RuntimeError):
    fault_kind = "software_bug"


@dataclass(frozen=True)
class Injection:
    """One pending injection as the coordinator forwards it (wire kind and phase names)."""

    kind: str
    at_step: int
    phase: str
    request_id: str = ""
    shard_id: str = ""  # corrupt_replica: the shard whose replica this holder corrupts

    @classmethod
    def from_message(cls, msg: dict[str, Any]) -> "Injection":
        """From an ``inject`` instruction body. Raises KeyError/ValueError on a malformed one."""
        return cls(str(msg["kind"]), int(msg["at_step"]), str(msg["phase"]), str(msg.get("request_id", "")),
                   str(msg.get("shard_id", "")))


def is_due(inj: Injection, step: int, phase: str) -> bool:
    """Whether ``inj`` fires at ``(step, phase)``: same phase and same step; in a phase of a recovery
    (:data:`RECOVERY_PHASES`) the first recovery at or after ``at_step`` (a recovery's step is not known in
    advance)."""
    return landed_exactly(step, phase, inj.at_step, inj.phase)


def landed_exactly(step: Any, phase: Any, at_step: int, want_phase: str) -> bool:
    """Whether a fault that fired at ``(step, phase)`` landed where it was armed (``at_step``, wire phase
    ``want_phase``): the same phase, and the same step, or in a phase of a recovery the first recovery at or after
    it (:func:`is_due`'s rule). Pure."""
    if phase != want_phase or isinstance(step, bool) or not isinstance(step, int):
        return False
    return step >= at_step if want_phase in RECOVERY_PHASES else step == at_step


def take_due(pending: MutableSequence[Any], step: int, phase: str) -> Injection | None:
    """Remove and return the first pending injection due at ``(step, phase)`` (entries may be
    :class:`Injection` objects or ``inject`` message dicts; malformed dicts are skipped)."""
    i, inj = _first_due(pending, step, phase)
    if inj is not None:
        del pending[i]
    return inj


def _first_due(pending: MutableSequence[Any], step: int, phase: str) -> tuple[int, Injection | None]:
    """``(index, injection)`` of the first pending injection due at ``(step, phase)``, ``(-1, None)`` when none
    is (malformed dicts are skipped). Pure."""
    for i, item in enumerate(pending):
        try:
            inj = item if isinstance(item, Injection) else Injection.from_message(item)
        except (KeyError, TypeError, ValueError):
            continue
        if is_due(inj, step, phase):
            return i, inj
    return -1, None


def arm_decision(at_step: int, phase: str, started_step: int, last_step: int | None,
                 steps_ahead: int | None = None) -> tuple[int | None, str]:
    """Whether a slot arms an injection, decided by the slot itself when the instruction arrives. Pure.

    ``started_step``: the iteration the slot is in (or was last in), 0 before its first; an instruction is
    read at the start of every iteration *before* the iteration is marked started, so a fault for the
    next iteration, any phase, is still in time. ``last_step``: the job's last step (None: unknown).
    ``steps_ahead``: ``at_step`` is a lower bound and the slot picks ``max(at_step, started_step +
    steps_ahead)``.

    Returns ``(step armed at, "")`` or ``(None, reason refused)``.
    """
    step = max(int(at_step), started_step + int(steps_ahead)) if steps_ahead is not None else int(at_step)
    if step <= started_step:
        return None, (f"the target already started step {started_step} (asked for step {step}, phase {phase}); "
                      "nothing armed")
    if last_step is not None and step > last_step and phase not in RECOVERY_PHASES:
        return None, f"the job ends at step {last_step}, before step {step}; nothing armed"
    return step, ""


def fired_name(request_id: str, world_rank: int) -> str:
    """The file name of a landing record (see :class:`FiredFile`)."""
    rid = "".join(c for c in (request_id or "direct") if c.isalnum() or c in "-_")[:64] or "direct"
    return f"fired-{rid}-w{int(world_rank)}.json"


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _stop_self() -> None:
    os.kill(os.getpid(), signal.SIGSTOP)


def _block(release: threading.Event) -> None:
    release.wait()


@dataclass
class Actions:
    """The process-level effects, injectable so the dispatch can be unit-tested without dying."""

    exit: Callable[[int], None] = os._exit
    kill_self: Callable[[], None] = _kill_self
    stop_self: Callable[[], None] = _stop_self
    block: Callable[[threading.Event], None] = _block


class FaultTrigger:
    """Fires pending injections at their step and phase.

    Args:
        pending: the list the injections arrive in (``client.injections``); :meth:`arm` appends to it too.
        notify: called as ``notify(injection, step, phase)`` just before the effect (must be durable on its
            own: the effect may be SIGKILL).
        on_link_down: hooks run when a ``link_down`` fires, before the thread blocks.
        on_corrupt_replica: what a ``corrupt_replica`` does (None: nothing, the landing is still recorded).
        on_bitflip: what a ``bitflip`` does (None: nothing, the landing is still recorded).
        actions: the process-level effects (default: the real ones).
        lock: guards ``pending`` (pass the lock of whoever else changes it, e.g. the client's
            ``injections_lock``, which arms and disarms injections as instructions arrive).

    Thread-safe: :meth:`check` may be called from the training thread and the D2H/H2H workers.
    """

    def __init__(self, pending: MutableSequence[Any] | None = None, *,
                 notify: Callable[[Injection, int, str], None] | None = None,
                 on_link_down: Iterable[Callable[[], None]] = (), actions: Actions | None = None,
                 lock: threading.Lock | None = None,
                 on_corrupt_replica: Callable[["Injection"], None] | None = None,
                 on_bitflip: Callable[["Injection"], None] | None = None):
        self.pending: MutableSequence[Any] = pending if pending is not None else []
        self.notify = notify
        self.on_link_down = list(on_link_down)
        self.on_corrupt_replica = on_corrupt_replica
        self.on_bitflip = on_bitflip
        self.actions = actions or Actions()
        self.link_down = threading.Event()
        self.release = threading.Event()  # set it to let a link_down-blocked thread return (tests, shutdown)
        self.fired: list[tuple[Injection, int, str]] = []
        self._lock = lock or threading.Lock()

    def arm(self, kind: str, at_step: int, phase: str, request_id: str = "") -> Injection:
        """Add an injection directly (wire kind/phase names), e.g. in a user's own step-targeted test."""
        inj = Injection(kind, int(at_step), phase, request_id)
        with self._lock:
            self.pending.append(inj)
        return inj

    def armed(self, step: int, phase: str) -> bool:
        """Whether an injection is pending that :meth:`check` would fire at ``(step, phase)``; nothing is taken.
        A phase whose landing point a member must first reach (``restore``: every member built its groups)
        is waited for only when it is armed here."""
        with self._lock:
            return _first_due(self.pending, step, phase)[1] is not None

    def check(self, step: int, phase: str) -> None:
        """Fire the injection due at ``(step, phase)``, if any; otherwise return at once.

        Raises:
            InjectedCommError, InjectedGPUError, InjectedNumericalError, InjectedSoftwareError: for the
                kinds that raise. Other kinds do not return (exit, SIGKILL, SIGSTOP, block).
            ValueError: a pending injection has a kind this trigger does not know.
        """
        with self._lock:
            inj = take_due(self.pending, step, phase) if self.pending else None
        if inj is not None:
            self.fire(inj, step, phase)

    def fire(self, inj: Injection, step: int, phase: str) -> None:
        """Produce the effect of ``inj`` now (see the module doc)."""
        if inj.kind not in _EFFECTS:
            raise ValueError(f"unknown injected fault kind {inj.kind!r}; known: {', '.join(_EFFECTS)}")
        self.fired.append((inj, step, phase))
        if self.notify is not None:
            self.notify(inj, step, phase)
        _EFFECTS[inj.kind](self, inj, step, phase)

    # --- effects ---------------------------------------------------------------------------------------
    def _crash(self, inj: Injection, step: int, phase: str) -> None:
        self.actions.exit(EXIT_INJECTED_CRASH)

    def _node_loss(self, inj: Injection, step: int, phase: str) -> None:
        self.actions.kill_self()

    def _hang(self, inj: Injection, step: int, phase: str) -> None:
        self.actions.stop_self()

    def _link_down(self, inj: Injection, step: int, phase: str) -> None:
        self.link_down.set()
        for hook in self.on_link_down:
            hook()
        self.actions.block(self.release)

    def _transient(self, inj: Injection, step: int, phase: str) -> None:
        raise InjectedCommError(f"DistBackendError: gloo collective failed: connection reset by peer "
                                f"[injected transient fault at step {step}, {phase}]", inj)

    def _gpu_error(self, inj: Injection, step: int, phase: str) -> None:
        raise InjectedGPUError(f"CUDA error: uncorrectable ECC error encountered (Xid 48, HBM) "
                               f"[injected at step {step}, {phase}]", inj)

    def _corrupt_replica(self, inj: Injection, step: int, phase: str) -> None:
        if self.on_corrupt_replica is not None:
            self.on_corrupt_replica(inj)

    def _bitflip(self, inj: Injection, step: int, phase: str) -> None:
        if self.on_bitflip is not None:
            self.on_bitflip(inj)

    def _nan(self, inj: Injection, step: int, phase: str) -> None:
        raise InjectedNumericalError(f"non-finite loss (NaN) [injected at step {step}, {phase}]", inj)

    def _exception(self, inj: Injection, step: int, phase: str) -> None:
        raise InjectedSoftwareError(f"injected software exception at step {step}, {phase}", inj)


_EFFECTS: dict[str, Callable[[FaultTrigger, Injection, int, str], None]] = {
    "crash": FaultTrigger._crash,
    "node_loss": FaultTrigger._node_loss,
    "hang": FaultTrigger._hang,
    "link_down": FaultTrigger._link_down,
    "transient": FaultTrigger._transient,
    "gpu_error": FaultTrigger._gpu_error,
    "corrupt_replica": FaultTrigger._corrupt_replica,
    "bitflip": FaultTrigger._bitflip,
    "nan": FaultTrigger._nan,
    "exception": FaultTrigger._exception,
}
KNOWN_WIRE_KINDS = tuple(_EFFECTS)


def flip_param_bit(params) -> tuple[str, int, int]:
    """The effect of ``bitflip``: invert the lowest bit of the middle element of the first non-empty tensor
    of ``params`` (``[(name, tensor)]``, a rank's :meth:`~phoenix_hpc.engines.base.Engine.param_shard`:
    any dtype, any device), in place. The lowest bit of a float's mantissa: the value changes by one unit
    in the last place, never into a NaN or an infinity, as a single-event upset in memory would. Returns
    ``(name, element index, byte offset in the tensor)``.

    Raises:
        ValueError: no tensor of ``params`` has an element.
    """
    import torch

    for name, t in params:
        if t.numel() == 0:
            continue
        flat = t.detach().view(-1)
        i = flat.numel() // 2
        with torch.no_grad():
            raw = flat[i : i + 1].view(torch.uint8)  # the element's bytes (little-endian: byte 0 is the lowest)
            raw[0] ^= 1
        return name, i, i * t.element_size()
    raise ValueError("the rank has no parameter with an element")


def flip_replica_bytes(buf) -> int:
    """The effect of ``corrupt_replica`` on one replica buffer (a uint8 host tensor holding a sealed copy,
    :mod:`phoenix_hpc.runtime.snapshot`): invert the middle byte of its first non-empty optimizer tensor, in
    place, leaving header and index untouched (so only the tensor's CRC-32 can tell). Returns the byte's
    offset.

    Raises:
        ValueError: the buffer has no optimizer tensor with data.
    """
    from phoenix_hpc.runtime.snapshot import OPT, read_header

    h = read_header(buf)
    for e in h.index["tensors"]:
        if e["part"] == OPT and e["nbytes"] > 0:
            off = int(e["offset"]) + int(e["nbytes"]) // 2
            buf[off] = int(buf[off]) ^ 0xFF
            return off
    raise ValueError("the replica holds no optimizer tensor with data")


@dataclass
class FiredFile:
    """``notify`` that records a landing in ``RUN_DIR/faults/fired-<request_id>-w<world_rank>.json``
    (``{"ts", "request_id", "world_rank", "pid", "kind", "at_step", "step", "phase"}``; written to a
    temporary name, fsynced and renamed, mode 0600)."""

    run_dir: str | os.PathLike
    world_rank: int
    clock: Callable[[], float] = field(default=time.time)

    def __call__(self, inj: Injection, step: int, phase: str) -> None:
        from phoenix_hpc.files import ensure_private_dir, write_private_file

        d = ensure_private_dir(Path(self.run_dir) / FAULTS_DIR)
        rec = {"ts": self.clock(), "request_id": inj.request_id, "world_rank": int(self.world_rank),
               "pid": os.getpid(), "kind": inj.kind, "at_step": inj.at_step, "step": int(step), "phase": phase}
        write_private_file(d / fired_name(inj.request_id, self.world_rank), json.dumps(rec) + "\n")


def read_fired(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The landing records of a run (see :class:`FiredFile`), oldest first; unreadable files are skipped
    (a rank killed mid-rename leaves only a temporary file, which is not matched), and so are records whose
    ``ts`` is not a finite number (a hand edit: they cannot be put in order)."""
    d = Path(run_dir) / FAULTS_DIR
    out = []
    for p in sorted(d.glob("fired-*.json")) if d.is_dir() else []:
        try:
            rec = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        ts = rec.get("ts") if isinstance(rec, dict) else None
        if type(ts) is int or (type(ts) is float and math.isfinite(ts)):
            out.append(rec)
    return sorted(out, key=lambda r: r["ts"])
