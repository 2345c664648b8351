"""The copies of a recoverable step a member holds across generations (docs/design.md section 6).

A recovery closes the generation's protector (:class:`phoenix_hpc.runtime.protector.Protector`) without
waiting on peers; its host buffers stay readable and hold the verified copies the plan counts on: the
member's local snapshot (committed and previous ping-pong buffer) and the replicas it holds of other shards.
They serve the restore (a rollback, an ``optimizer`` or ``params`` transfer, a shrink's old slices) and stay
usable until the new generation's first commit fence, so that a fault in between (a re-plan, a fault in the
first steps after a resume) is still covered from memory. :class:`Copies` owns those protectors: ``old``
(the closed protector of the generation being left) and ``kept`` (closed protectors of earlier generations,
newest first), and a survivor's host copy of ``S(R)`` kept across a plan cut short after its engine ended
(the rebuild path).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from phoenix_hpc.errors import RecoveryError


def split_snapshot(u) -> tuple[dict, dict, dict]:
    """``(optimizer shard, param shard, envelope)`` of an unpacked local snapshot ``u``
    (:class:`phoenix_hpc.runtime.snapshot.Unpacked`): the optimizer's tensors are those named ``opt/...``."""
    opt = {n: t for n, t in u.tensors.items() if n.startswith("opt/")}
    par = {n: t for n, t in u.tensors.items() if not n.startswith("opt/")}
    return opt, par, u.envelope


@dataclass
class Offer:
    """What a member answers ``quiesced`` with: the steps of the verified copies of its own shard
    (``shards``: shard id -> steps, newest first) and of the replicas it holds (``replicas``), the held
    copies that failed verification again (``rejected``: ``[shard id, step, why]``), and, for an engine that
    can shrink, its stage's flat optimizer size (``numel``: ``"pp{pp}/tp{tp}"`` -> elements)."""

    shards: dict[str, list[int]] = field(default_factory=dict)
    replicas: dict[str, list[int]] = field(default_factory=dict)
    rejected: list[list] = field(default_factory=list)
    numel: dict[str, int] | None = None


@dataclass
class HostCopy:
    """A survivor's host copy of ``S(step)`` (``state``: optimizer shard, param shard, envelope) taken before
    its engine ended for a plan that was then cut short; ``rolled``: it is a snapshot older than the live
    step; ``seconds``: the host copy's and teardown's seconds, counted in the next plan's detail."""

    step: int
    state: tuple[dict, dict, dict]
    rolled: bool
    seconds: dict[str, float]


class Copies:
    """The closed protectors whose verified copies a recovery may use (module doc).

    ``log``: where a rejected copy is said."""

    def __init__(self, log: Callable[[str], None] = print):
        self.log = log
        self.old = None  # the closed protector of the generation being left (or None)
        self.kept: list = []  # closed protectors of earlier generations, still serving until the first fence
        self.host_copy: HostCopy | None = None

    def sources(self, current=None) -> list:
        """The protectors whose verified copies a recovery may use, newest first: ``current`` (the one being
        closed) or :attr:`old`, then the kept ones of earlier generations."""
        out = [p for p in (current if current is not None else self.old,) if p is not None]
        return out + [p for p in self.kept if p not in out]

    def find(self, pair_of, step: int):
        """The first buffer holding ``step`` in ``pair_of(protector)`` (a ping-pong pair, or None) over
        :meth:`sources`, newest first; None when none holds it."""
        for prot in self.sources():
            pp = pair_of(prot)
            buf = pp.find(step) if pp is not None else None
            if buf is not None:
                return buf
        return None

    def held_buffer(self, shard_id: str, step: int, world_rank: int):
        """The replica buffer of ``shard_id`` at ``step`` this slot holds: the newest generation's copy, else a
        kept one (not verified here).

        Raises:
            RecoveryError: it holds none."""
        buf = self.find(lambda prot: prot.buffers.held.get(shard_id), step)
        if buf is None:
            raise RecoveryError(f"world rank {world_rank} holds no replica of {shard_id} at step {step}")
        return buf

    def local_buffer(self, step: int):
        """The buffer of this slot's local snapshot of ``step`` (committed or the previous one; the newest
        generation's copy, else a kept one; not verified here), or None when it has none."""
        return self.find(lambda prot: prot.buffers.local, step)

    def snapshot_state(self, step: int, logical: int | None) -> tuple[dict, dict, dict]:
        """S(step) from the committed local snapshot (verified; host memory): ``(optimizer shard, param shard,
        envelope)``, the tensors views of that buffer (nobody writes a closed protector's buffers; the engine's
        load copies them).

        Raises:
            RecoveryError: there is no closed protector; ReplicationError: no verified snapshot of ``step``."""
        srcs = self.sources()
        if not srcs:
            raise RecoveryError(f"rank {logical} must roll back to step {step} but has no local snapshot")
        for prot in srcs[:-1]:  # the newest generation's snapshot of ``step`` if it has one, else an older one
            if step in prot.copy_steps()[0]:
                break
        else:
            prot = srcs[-1]
        return split_snapshot(prot.local_snapshot(step=step, copy=False))

    def offer(self, closing, logical: int | None) -> Offer:
        """What this member offers a plan, from ``closing`` (the protector just closed, or None) and the kept
        ones: every held replica is verified again first (one corrupted in memory since it arrived is left out
        and listed in ``rejected``); both ping-pong buffers count (a copy one step behind the others is still
        recoverable). ``closing`` becomes :attr:`old`, unless it never committed (re-planned before its first
        step): it offers nothing and is not kept, so its buffers go before the next generation allocates."""
        out = Offer()
        for p in self.sources(closing):
            for sid, step, why in p.reverify_held()[1]:
                out.rejected.append([sid, step, why])
                self.log(f"[phoenix] rank {logical}: held replica of {sid} step {step} fails verification and "
                         f"is not offered: {why}")
            local, held = p.copy_steps()
            if local:
                out.shards[p.shard_id] = sorted(set(out.shards.get(p.shard_id, [])) | set(local), reverse=True)
            for sid, v in held.items():
                if v:
                    out.replicas[sid] = sorted(set(out.replicas.get(sid, [])) | set(v), reverse=True)
        empty = closing is not None and closing.copy_steps() == ([], {})
        self.old = None if empty else closing
        return out

    def held_evidence(self, logical: int | None) -> list[list[Any]]:
        """Every replica the closed protectors hold, verified again now (CRC-32 of every tensor), as
        ``[shard id, step, generation, hash of its optimizer part]``; a copy that fails is left out and
        logged (the coordinator sees it missing)."""
        from phoenix_hpc.runtime.snapshot import hash_hex

        held = []
        for prot in self.sources():
            good, bad = prot.reverify_held()
            held += [[sid, step, gen, hash_hex(crc)] for sid, step, gen, crc in good]
            for sid, step, why in bad:
                self.log(f"[phoenix] rank {logical}: held replica of {sid} step {step} rejected: {why}")
        return held

    def carry_into(self) -> None:
        """At a new generation's protector: the copies of ``R`` stay usable until its first commit fence, the
        old protector's, and those kept before it unless the old generation had a fence of its own."""
        old, self.old = self.old, None
        if old is not None and old.recoverable_step is not None:
            self.kept = [old]
        else:
            self.kept = ([old] if old is not None else []) + self.kept

    def drop(self) -> None:
        """Forget every closed protector (a shrink: they name shards of the old grid)."""
        self.old, self.kept = None, []

    def corrupt(self, shard_id: str, current, logical: int | None) -> int:
        """An injected ``corrupt_replica``: flip a byte in every verified copy (committed and previous buffer)
        of the replica of ``shard_id`` held in ``current`` and the closed protectors, telling nobody (only
        the log says it); a recovery verifies them again. Returns how many copies were flipped."""
        from phoenix_hpc.faults.trigger import flip_replica_bytes

        flipped = 0
        for prot in self.sources(current):
            pp = prot.buffers.held.get(shard_id)
            for step in pp.verified_steps() if pp is not None else []:
                off = flip_replica_bytes(pp.find(step))
                flipped += 1
                self.log(f"[phoenix] rank {logical}: injected corrupt-replica: flipped the byte at offset {off} "
                         f"of the replica of {shard_id} step {step} (generation {prot.generation})")
        if not flipped:
            self.log(f"[phoenix] rank {logical}: injected corrupt-replica: no replica of {shard_id} held here, "
                     "nothing corrupted")
        return flipped
