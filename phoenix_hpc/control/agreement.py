"""Replica agreement: the data-parallel replicas of one (pp, tp) coordinate hold the same parameters, bit for
bit, after every optimizer step (docs/design.md section 6, "Replica agreement").

ZeRO-1 (the torch engine's :mod:`phoenix_hpc.engines.zero`, megatron-core's distributed optimizer) updates
each element of the parameters on exactly one DP rank and all-gathers the result, and plain data parallelism
applies the same all-reduced gradient on every replica: either way the DP peers' parameters are equal after
the step. Every member reports, with its commit of step ``s``, one 64-bit digest of its snapshot's parameter
tensors (:func:`phoenix_hpc.runtime.checksum.digest64` over the per-tensor checksums the D2H copy computed
anyway; optimizer shards differ by design and are not compared). The coordinator's :class:`AgreementBook`
gathers the digests per (step, pp, tp) and :func:`compare` judges a complete set.

Pure decisions (:func:`check_report`, :func:`compare`, :func:`majority_of`, :func:`add_strike`,
:func:`judge_corruption`, :func:`restart_advice`) and one
book that owns the pending digests, the steps repaired and the members' strikes; the coordinator journals what they return (``agreement_rejected``, ``silent_corruption``,
``agreement_undetectable`` in :mod:`phoenix_hpc.control.events`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from phoenix_hpc.control.classify import Action, Decision, Fault, FaultKind
from phoenix_hpc.control.view_repairs import REPAIR_ACTIONS, bad_steps  # the journal fold reads decisions so too

#: hex digits of a digest report (64 bits)
DIGEST_HEX = 16
#: steps per (pp, tp) whose digests wait for the rest of their DP peers; older ones are dropped unjudged (a
#: member's newer commit report replaced the older one before a heartbeat carried it: docs/design.md 6)
PENDING_STEPS = 128
#: digests one report may carry (a member repeats those of its newest commits: runtime/protector.py)
REPORT_STEPS = 64
_HEX = re.compile(r"[0-9a-f]{%d}" % DIGEST_HEX)


@dataclass(frozen=True)
class Verdict:
    """The judgement of one complete set of DP digests.

    ``step``: the committed step; ``pp``, ``tp``: the coordinate; ``digests``: {dp index: digest hex};
    ``agree``: all equal; ``majority``: the dp indices of the strict majority digest when the replicas
    disagree and more than half share one (needs dp >= 3), else ``()``; ``suspects``: the dp indices
    outside that majority, or every member when there is none (with dp = 2 nobody can tell who is right)."""

    step: int
    pp: int
    tp: int
    digests: Mapping[int, str]
    agree: bool
    majority: tuple[int, ...] = ()
    suspects: tuple[int, ...] = ()


def check_report(digest: object, generation: int, current_generation: int) -> str | None:
    """Why a member's parameter digest must be rejected, or None when it is acceptable. Pure.

    A digest is :data:`DIGEST_HEX` lower-case hex digits (64 bits) and belongs to the job's current
    generation: an older generation's parameters were trained by another grid and may not be compared."""
    if not isinstance(digest, str) or _HEX.fullmatch(digest) is None:
        shown = digest if isinstance(digest, str) and len(digest) <= 64 else type(digest).__name__
        return f"parameter digest {shown!r} is not {DIGEST_HEX} lower-case hex digits (64 bits)"
    if generation != current_generation:
        return f"parameter digest of generation {generation}, the job is at generation {current_generation}"
    return None


def majority_of(digests: Mapping[int, str]) -> tuple[int, ...]:
    """The dp indices sharing the digest that more than half of ``digests`` hold, sorted; ``()`` when no
    digest has a strict majority (always so with two members that differ). Pure."""
    by: dict[str, list[int]] = {}
    for d, h in digests.items():
        by.setdefault(h, []).append(d)
    best = max(by.values(), key=len, default=[])
    return tuple(sorted(best)) if 2 * len(best) > len(digests) else ()


def compare(step: int, pp: int, tp: int, digests: Mapping[int, str]) -> Verdict:
    """Judge the digests ``{dp index: digest}`` of every DP peer at (``pp``, ``tp``) for committed ``step``.

    Equal: ``agree``. Otherwise the members outside a strict majority are the suspects (dp >= 3), or all of
    them when there is none. Raises ValueError for fewer than two digests: one replica cannot be compared
    (:meth:`AgreementBook.undetectable` says so instead)."""
    if len(digests) < 2:
        raise ValueError(f"compare needs the digests of at least two DP peers, got {len(digests)}")
    ds = dict(sorted(digests.items()))
    if len(set(ds.values())) == 1:
        return Verdict(step, pp, tp, ds, True)
    maj = majority_of(ds)
    suspects = tuple(d for d in ds if d not in maj) if maj else tuple(ds)
    return Verdict(step, pp, tp, ds, False, maj, suspects)


@dataclass
class AgreementBook:
    """The digests of generation ``generation`` (a grid of ``dp`` replicas) that wait for their DP peers,
    per ((pp, tp), step) -> {dp: digest}; the count of sets
    judged (``checked``) and found different (``disagreed``), the newest judged step, and the reports already
    rejected (each journalled once)."""

    dp: int
    generation: int = 0
    pending: dict[tuple[int, int], dict[int, dict[int, str]]] = field(default_factory=dict)
    checked: int = 0
    disagreed: int = 0
    last_step: int | None = None
    rejected: set[tuple] = field(default_factory=set)
    #: per logical rank, the newest step whose digest it reported was taken (a report repeats older ones)
    newest: dict[int, int] = field(default_factory=dict)
    #: per (pp, tp): the newest step judged (older ones are judged or dropped: never taken again), and the
    #: newest judged in agreement
    done_to: dict[tuple[int, int], int] = field(default_factory=dict)
    last_agreed: dict[tuple[int, int], int] = field(default_factory=dict)
    #: the first step found to differ, and the newest step its coordinate agreed at before (None: unknown)
    first_bad: int | None = None
    bad_last_agreed: int | None = None
    #: steps whose difference a recovery rolled back before (a second difference at one of them stops the job)
    repaired: set[int] = field(default_factory=set)
    #: world rank -> the steps at which it was named the suspect against a majority (add_strike)
    strikes: dict[int, tuple[int, ...]] = field(default_factory=dict)

    def carry_from(self, old: "AgreementBook") -> None:
        """Take over what holds for the whole run from the book of an earlier generation: steps number the
        whole run, so what was seen to agree, first differ or was repaired stays so, and strikes count across
        recoveries."""
        self.last_agreed, self.first_bad, self.bad_last_agreed = (dict(old.last_agreed), old.first_bad,
                                                                   old.bad_last_agreed)
        self.repaired, self.strikes = set(old.repaired), dict(old.strikes)

    def add(self, step: int, pp: int, dp: int, tp: int, digest: str) -> Verdict | None:
        """A member's accepted digest of ``step``; the verdict once every DP peer's digest of that step and
        coordinate is in (None before, for a repeated report, and for a step already judged). Older pending
        steps of the coordinate than a judged one are dropped. O(dp) (O(PENDING_STEPS) when that many wait)."""
        key = (pp, tp)
        if self.dp < 2 or step <= self.done_to.get(key, -1):
            return None
        steps = self.pending.setdefault(key, {})
        got = steps.setdefault(step, {})
        got[dp] = digest
        if len(got) < self.dp:
            if len(steps) > PENDING_STEPS:
                del steps[min(steps)]
            return None
        del steps[step]
        for old in [s for s in steps if s < step]:
            del steps[old]
        self.done_to[key] = step
        v = compare(step, pp, tp, got)
        self.checked += 1
        self.disagreed += 0 if v.agree else 1
        if v.agree:
            self.last_agreed[key] = step
        elif self.first_bad is None or step < self.first_bad:
            self.first_bad, self.bad_last_agreed = step, self.last_agreed.get(key)
        self.last_step = step if self.last_step is None else max(self.last_step, step)
        return v

    def first_rejection(self, key: tuple) -> bool:
        """Whether rejection ``key`` is new (then it is remembered): a node board re-sends a slot's newest
        commit report with every heartbeat, and a rejection is journalled once."""
        if key in self.rejected:
            return False
        self.rejected.add(key)
        return True


    def summary(self) -> dict[str, int | None]:
        """``{"checked", "disagreed", "last_step"}`` for the journal's ``commit`` record and status."""
        return {"checked": self.checked, "disagreed": self.disagreed, "last_step": self.last_step}


def add_strike(strikes: Mapping[int, Sequence[int]], member: int, step: int,
               window: int) -> tuple[dict[int, tuple[int, ...]], bool]:
    """Count that ``member`` (a world rank) was named the suspect against a majority at ``step``. Pure.

    Returns the new strikes (member -> steps, only those within ``window`` steps of the newest kept) and
    whether ``member`` is now a repeat offender: named at two different steps at most ``window`` steps
    apart (``resilience.agreement_strikes_window_steps``; 0: never). A step named again (the same
    difference judged once more, or replayed) is no new strike."""
    out = {m: tuple(v) for m, v in strikes.items()}
    mine = sorted(set(out.get(member, ())) | {int(step)})
    newest = mine[-1]
    mine = [s for s in mine if newest - s <= window] if window > 0 else [newest]
    out[member] = tuple(mine)
    return out, window > 0 and len(mine) >= 2


def book_from_records(records: Sequence[Mapping], *, dp: int, generation: int,
                      rank_maps: Mapping[int, Mapping[int, int]], rank_map: Mapping[int, int],
                      window: int) -> AgreementBook:
    """The book a restarted coordinator starts from, rebuilt from the journal ``records`` (oldest first). Pure.

    What must outlive the coordinator's process: the steps a recovery rolled back before (``decision``
    records whose faults name a ``bad_step``; a second difference there stops the job) and the members'
    strikes (``silent_corruption`` records with a majority: each suspect, by the world rank its logical rank
    had in the record's generation, ``rank_maps`` falling back to ``rank_map``). The digests waiting for
    their peers are not kept: the members' next commit reports bring them again."""
    book = AgreementBook(dp=dp, generation=generation)
    for rec in records:
        ev = rec.get("event")
        if ev == "decision" and rec.get("action") in REPAIR_ACTIONS:
            book.repaired.update(bad_steps(rec.get("faults")))
        elif ev == "silent_corruption" and rec.get("majority") and type(rec.get("step")) is int:
            ranks = rank_maps.get(rec.get("generation"), rank_map)
            for r in rec.get("suspects") or ():
                w = ranks.get(r)
                if w is not None:
                    book.strikes, _ = add_strike(book.strikes, w, rec["step"], window)
    return book


def restart_advice(first_bad: int, last_agreed: int | None, checkpoints: Sequence[int]) -> tuple[int | None, str]:
    """``(checkpoint step, words)``: where a job whose replicas differed at ``first_bad`` can restart. Pure.

    The corrupted replica's gradients of the steps after the corruption were reduced into every replica, so
    every state after the newest step the replicas were seen to agree at (``last_agreed``; at most
    ``first_bad - 1``) may carry it, persistent checkpoints included: the one to restart from is the newest
    of ``checkpoints`` (complete checkpoint steps) at or before that step. With none known to agree, no
    checkpoint can be vouched for."""
    good = first_bad - 1 if last_agreed is None else min(last_agreed, first_bad - 1)
    after = sorted(s for s in checkpoints if s > good)
    ck = max((s for s in checkpoints if s <= good), default=None) if last_agreed is not None else None
    text = (f"the replicas' parameters differed at step {first_bad}"
            + (f" and last agreed at step {last_agreed}" if last_agreed is not None else
               ", and no earlier step was seen to agree") + "; ")
    text += (f"continue from the persistent checkpoint of step {ck}, the newest from before the corruption"
             if ck is not None else "no persistent checkpoint from before the corruption is known: submit the "
             "config again")
    if after:
        text += (f"; the checkpoint(s) of step(s) {', '.join(map(str, after))} were written after it and may carry "
                 "it (`phoenix submit --resume` takes the newest complete checkpoint: move those aside first)")
    return ck, text


@dataclass(frozen=True)
class CorruptionVerdict:
    """What a decision on queued faults becomes once the replica agreement's history is known
    (:func:`judge_corruption`): the ``decision`` to carry out; ``stop_from``, for a clean stop over replicas that
    differed, ``(first differing step, newest step known to agree or None)`` that :func:`restart_advice` takes;
    ``repaired``, the steps the recovery rolls back before (the book records them once it starts: a second
    difference there stops the job)."""

    decision: Decision
    stop_from: tuple[int, int | None] | None
    repaired: frozenset[int]


def judge_corruption(decision: Decision, faults: Sequence[Fault], book: AgreementBook | None) -> CorruptionVerdict:
    """The verdict on ``decision`` (what :func:`phoenix_hpc.control.arbitration.arbitrate` called for) given the
    agreement ``book`` (None: no digest was ever compared). Pure (reads ``book``, changes nothing).

    - A ``silent_corruption`` fault whose ``bad_step`` was already repaired (rolled back before and replayed)
      differs again: memory cannot be trusted, the decision becomes a clean stop.
    - A clean stop with replicas known to differ (the book's first difference, or the step that differs again)
      names where to restart (``stop_from``; see :func:`restart_advice`): the first differing step and the
      newest step known to agree before it (the book's, or the fault reports' ``agreed_step``).
    - Otherwise the decision stands; ``repaired`` lists the faults' ``bad_step``\ s.
    """
    if book is None:
        return CorruptionVerdict(decision, None, frozenset())
    silent = [f for f in faults if f.kind is FaultKind.SILENT_CORRUPTION]
    again = sorted({f.bad_step for f in silent if f.bad_step is not None and f.bad_step in book.repaired})
    if again:
        decision = Decision(Action.CLEAN_STOP, f"silent data corruption: the DP replicas' parameters differ again at "
                                               f"step {again[0]} after a rollback before it and its replay")
    stop_from = None
    if decision.action is Action.CLEAN_STOP and silent and (book.first_bad is not None or again):
        first_bad = min(s for s in (book.first_bad, *again) if s is not None)
        agreed = book.bad_last_agreed if book.first_bad == first_bad else max(
            (f.agreed_step for f in faults if f.bad_step == first_bad and f.agreed_step is not None), default=None)
        stop_from = (first_bad, agreed)
    return CorruptionVerdict(decision, stop_from, frozenset(f.bad_step for f in faults if f.bad_step is not None))
