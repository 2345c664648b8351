"""A recovery's transfers, one member's part (docs/design.md section 6, step 5).

The plan lists the transfers that restore a spare (:class:`phoenix_hpc.recovery.plan.RecoveryPlan`):
``params`` (the param shard of ``S(R)`` from a live DP peer at the same (pp, tp): the param part of its local
snapshot of ``R``, :func:`phoenix_hpc.runtime.snapshot.param_part`, or sealed from its engine when it has
none), ``optimizer`` (the optimizer shard + envelope as the holder's replica
buffer of ``R``, sent as it lies in memory: the receiver verifies every tensor's checksum before it loads
any) and ``params_from_optimizer`` (dp == 1: no DP peer holds the parameters; the spare takes them from the
optimizer's fp32 master copy, after the optimizer shard is loaded).

Every buffer travels as a :class:`phoenix_hpc.runtime.h2h.BufferTransfer`, all of a member's at once
(:class:`phoenix_hpc.runtime.h2h.TransferSet`: those with one peer in plan order, different peers
concurrently, so a spare receives its parameters and its optimizer shard from their two senders together).
When what a member sends lies in host memory already (its local snapshot of ``R``, the replicas it holds;
:func:`sources_ready`), its engine work -- a spare's construction, a survivor's rollback, a rebuild
member's construction and load -- runs meanwhile (``during``): the transfers then run in a thread of their
own (MPI's ``MPI_THREAD_MULTIPLE`` level, which mpi4py requests, is required, else the two run one after
the other). A member that must seal its parameters from its engine does the engine work first. A received buffer is loaded once the engine work is done and the buffer complete, in plan order,
while the later ones are still on the wire.

Phase times (the ``params`` and ``optimizer`` of the ``recovered`` report) partition this member's wall time
here apart from ``during`` (reported apart): sealing a kind's buffers, the wait for each transfer in plan
order and the load of a received buffer count to its kind. ``wire`` gives each kind's raw time from the start until its
last transfer completed, overlap included.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from phoenix_hpc.errors import RecoveryError
from phoenix_hpc.recovery.plan import Transfer

KINDS = ("params", "optimizer", "params_from_optimizer")
POLL_S = 0.001  # seconds between polls of the transfers (sleeping: never spins a core)


@dataclass
class TransferTimes:
    """Seconds spent by one member on its transfers (see the module doc)."""

    params_s: float = 0.0
    optimizer_s: float = 0.0
    during_s: float = 0.0  # the engine work, run while the buffers went (or before them)
    wire: dict[str, float] = field(default_factory=dict)  # kind -> start .. its last completion, seconds


def mine(transfers: Sequence[Transfer], world_rank: int, step: int, kinds: tuple[str, ...] = KINDS) -> list[Transfer]:
    """The transfers ``world_rank`` takes part in, in plan order, of ``kinds``.

    Raises:
        RecoveryError: one is for another step than the recoverable ``step``, or of an unknown kind."""
    out = []
    for t in transfers:
        if world_rank not in (t.sender_world, t.receiver_world):
            continue
        if t.step != step:
            raise RecoveryError(f"transfer {t} is for step {t.step}, the recoverable step is {step}")
        if t.kind not in kinds:
            raise RecoveryError(f"unknown transfer kind {t.kind!r}")
        out.append(t)
    return out


def sources_ready(member, transfers: Sequence[Transfer], step: int) -> bool:
    """True when every buffer ``member`` sends for ``step`` lies in host memory already, independent of its
    engine: the replicas it holds, and its local snapshot of ``step`` for parameters. Its engine work
    (rollback, construction) may then run while the buffers go; else it must come first (the parameters
    are sealed from the engine at ``step``)."""
    me = member.env.world_rank
    sends = [t for t in transfers if t.sender_world == me and t.kind == "params"]
    return not sends or member.copies.local_buffer(step) is not None


def _threads_ok() -> bool:
    from mpi4py import MPI

    return MPI.Query_thread() >= MPI.THREAD_MULTIPLE


def run(member, transfers: Sequence[Transfer], step: int, during: Callable[[], None] | None = None,
        check: Callable[[], None] | None = None) -> TransferTimes:
    """Run ``member``'s part of the plan's ``transfers`` for the recoverable ``step``, with ``during`` (called
    once: the member's engine work) overlapped with them when :func:`sources_ready`, else before them.
    ``check`` is called between polls while this member waits for its transfers (not during ``during``); what
    it raises (the coordinator re-planned: a peer of these transfers may be gone) ends them: every request
    still posted is abandoned (:meth:`phoenix_hpc.runtime.h2h.TransferSet.abandon`) and the error propagates.

    Raises:
        RecoveryError: a transfer for another step or of an unknown kind, a received buffer naming another
            shard or step;
        ReplicationError: a checksum fails on arrival, the tag space is too small, or a transfer does not
            complete within ``resilience.collective_timeout_s`` of its start.
        TransportWedged: the thread driving the transfers did not leave MPI within ``ABANDON_JOIN_S`` of
            their end (the MPI library deadlocked on a dead peer's connection, ``runtime/h2h.py``): the slot
            cannot take part in another generation.
        what ``check`` raises.
    """
    from phoenix_hpc.errors import TransportWedged
    from phoenix_hpc.runtime.h2h import ABANDON_JOIN_S, TransferSet

    me, res = member.env.world_rank, member.env.cfg.resilience
    todo = mine(transfers, me, step)
    wire = [t for t in todo if t.kind != "params_from_optimizer"]
    out = TransferTimes()
    if during is not None and not sources_ready(member, todo, step):  # it seals its parameters from the
        t0 = time.perf_counter()  # engine: the engine work comes first
        during()
        out.during_s, during = time.perf_counter() - t0, None
    spent = {"params": 0.0, "optimizer": 0.0}
    moves = _moves(member, wire, step, spent)
    ts = TransferSet([x for _, x in moves], res.collective_timeout_s)
    t_start = time.perf_counter()
    th = None
    box: dict[str, BaseException] = {}
    if during is not None and moves and _threads_ok():
        ts.not_before = math.inf  # no timeout counts while this member does its own engine work

        def drive() -> None:
            try:
                ts.drive(POLL_S)
            except BaseException as exc:  # noqa: BLE001 - raised in the member's thread below
                box["error"] = exc

        th = threading.Thread(target=drive, name="phoenix-transfers", daemon=True)
        th.start()
    try:
        if during is not None:
            try:
                during()
            except BaseException as exc:
                ts.stopped = f"the engine work failed: {type(exc).__name__}"
                raise
            finally:
                ts.not_before = time.monotonic()
            out.during_s = time.perf_counter() - t_start
        # in plan order: the wait for each transfer counts to its kind, and a received buffer is loaded as
        # soon as it is complete, while the later ones are still on the wire
        for t, x in moves:
            t0 = time.perf_counter()
            while x.done_at is None:
                if th is None:
                    if not ts.poll():
                        time.sleep(POLL_S)
                elif not th.is_alive():
                    break
                else:
                    time.sleep(POLL_S)
                if check is not None and x.done_at is None:
                    check()
            if x.done_at is None:  # the driving thread ended with an error
                break
            spent[t.kind] += time.perf_counter() - t0
            if t.receiver_world == me:
                t0 = time.perf_counter()
                _load(member, t, x.buf, step)
                spent[t.kind] += time.perf_counter() - t0
    except BaseException as exc:
        ts.stopped = ts.stopped or f"{type(exc).__name__} in the member's thread"
        if th is None:  # else the driving thread abandons them when it sees ``stopped``
            ts.abandon()
        raise
    finally:
        if th is not None:  # it leaves within one poll round once stopped (every MPI call it makes is
            th.join(ABANDON_JOIN_S)  # non-blocking), unless the MPI library itself hangs (runtime/h2h.py)
            if th.is_alive():
                raise TransportWedged(f"rank {member.logical}: the transfer thread did not leave MPI within "
                                      f"{ABANDON_JOIN_S:g} s of the end of its transfers ({ts.stopped}); this slot "
                                      "cannot take part in another generation and leaves so that a spare replaces it")
    if "error" in box:
        raise box["error"]
    for t, x in moves:
        out.wire[t.kind] = max(out.wire.get(t.kind, 0.0), x.done_at - t_start)
    for t in todo:
        if t.kind == "params_from_optimizer":  # after the optimizer shard it derives from
            t0 = time.perf_counter()
            member.engine.params_from_optimizer()
            spent["params"] += time.perf_counter() - t0
    out.params_s, out.optimizer_s = spent["params"], spent["optimizer"]
    return out


def _moves(member, wire: list[Transfer], step: int, spent: dict[str, float]) -> list[tuple[Transfer, Any]]:
    """A :class:`~phoenix_hpc.runtime.h2h.BufferTransfer` for each of ``wire`` (this member's, in plan order),
    with what it sends sealed or found now (its seconds counted to the transfer's kind in ``spent``)."""
    from phoenix_hpc.runtime.h2h import BufferTransfer

    me, res = member.env.world_rank, member.env.cfg.resilience
    w2l = {w: r for r, w in member.rank_map.items()}
    moves = []
    for t in wire:
        sending = t.sender_world == me
        peer = w2l[t.receiver_world if sending else t.sender_world]
        t0 = time.perf_counter()
        arr = _outgoing(member, t, step) if sending else None
        spent[t.kind] += time.perf_counter() - t0
        moves.append((t, BufferTransfer(member.comm, peer, step, res.chunk_bytes, _what(t, peer, sending),
                                        arr=arr)))
    return moves


def _what(t: Transfer, peer: int, sending: bool) -> str:
    what = "the param shard" if t.kind == "params" else "the replica of"
    return f"{'sending' if sending else 'receiving'} {what} {t.shard_id} {'to' if sending else 'from'} rank {peer}"


def _outgoing(member, t: Transfer, step: int):
    """What a sender sends, none of it checksummed again here (the receiver verifies every tensor before it
    loads any): parameters as the param part of its local snapshot of ``step``
    (:func:`phoenix_hpc.runtime.snapshot.param_part`: a new header and index, then the tensor bytes where
    they lie), or, without such a snapshot, its param shard sealed now from the engine (which is at
    ``step``; model dtype, own shapes, a checksum per tensor); an optimizer shard as the prefix of the
    replica buffer of ``step`` it holds (header, index, optimizer part) as it lies in memory -- verified
    when it arrived and again at the quiesce (``reverify_held``)."""
    from phoenix_hpc.runtime.snapshot import PARAM, param_part, read_header, seal_part

    if t.kind == "params":
        sid = t.shard_id  # the plan's: the param shard at the spare's (pp, tp), the sender's too
        local = member.copies.local_buffer(step)
        if local is not None:
            return param_part(local, sid)
        return seal_part(member.engine.param_shard(), PARAM, sid, step, member.generation).numpy()
    buf = member.copies.held_buffer(t.shard_id, step, member.env.world_rank)
    h = read_header(buf)
    if h.step != step or h.index.get("shard_id") != t.shard_id:
        raise RecoveryError(f"the held buffer of {t.shard_id} step {step} names {h.index.get('shard_id')} "
                            f"step {h.step}")
    return buf.numpy()[: int(h.opt_end)]


def _load(member, t: Transfer, buf, step: int) -> None:
    """Verify a received buffer (every tensor's checksum; views of ``buf``, loaded at once) and load it."""
    from phoenix_hpc.runtime.snapshot import OPT, PARAM, unpack

    if t.kind == "params":
        sid = member.coord.param_shard()
        u = unpack(buf, (PARAM,), copy=False)  # raises ReplicationError when a checksum fails
        if u.shard_id != sid or u.step != step:
            raise RecoveryError(f"received param shard is {u.shard_id} step {u.step}, expected {sid} step {step}")
        member.engine.load_param_shard(u.tensors)
        return
    u = unpack(buf, (OPT,), copy=False)
    if u.shard_id != t.shard_id or u.step != step:
        raise RecoveryError(f"received replica is {u.shard_id} step {u.step}, expected {t.shard_id} step {step}")
    member.engine.load_optimizer_shard(u.tensors)
    member.engine.load_envelope(u.envelope)
