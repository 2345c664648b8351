"""The recovery invariants I1-I5 (docs/design.md section 6) as pure checks over evidence.

After a recovery every live member of the new generation answers ``recovered`` with a :class:`MemberReport`
that carries *evidence*, not a description of itself:

- the per-part hashes of its restored state at the recoverable step R (``opt_hash`` of its optimizer shard,
  ``param_hash`` of its param shard; :func:`phoenix_hpc.runtime.snapshot.part_hash`);
- what it holds as a replica holder of the previous generation(s): ``held``, one :class:`HeldCopy`
  (logical shard id, step, generation, hash) per verified replica buffer, re-verified (CRC-32 of every
  tensor) when the report is made.

The coordinator adds what it knows independently of the members' reports (:class:`Expected`): the plan
(rank map, R, which holder each restored shard came from) and, from the *owners'* commit reports during
training, to which holders each shard was sent in each generation and the hash of each committed step.

:func:`screen` first rejects evidence that cannot be true (a report of another generation, a malformed hash,
a holder claiming a shard it was never sent, a replica whose hash differs from what its owner committed:
silent corruption). An owner that died after its holders verified step R but before its commit report
reached the coordinator has made no statement: a holder's claim on its shard is then accepted on the
holder's own evidence (the copy's CRC-32s, sealed by the owner, verified on receipt and again for the
report) when the generation's placement, recomputed by the coordinator, gives that holder the shard, and
rejected when it does not (the holder could never have received it)); each rejection has a reason the caller journals. The checks then run on what is left:

- **I1 topology consistency**: every member reported (with accepted evidence), all agree on generation and
  rank map, and each is the logical rank the rank map names.
- **I2 shard integrity**: every logical shard has exactly one owner, the one the rank map names, and (for a
  restore from memory) the owner's optimizer-shard hash equals every accepted replica of that shard at R:
  the one it was restored from, every other holder's, and the hash its owner committed for R.
- **I3 optimizer availability**: every shard restored from a holder was restored from a copy that holder
  proves it holds (an accepted, verified replica of that shard at R).
- **I4 step atomicity**: every member is at R and none holds state of a partial step.
- **I5 parameter consistency**: DP peers at the same (pp, tp) report equal parameter hashes (their
  parameters are identical by construction, docs/design.md section 3).

Each check returns a list of :class:`Violation` (empty when it holds) naming the shard and the members.
A violation stops the job (never train on); the caller journals it first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from phoenix_hpc.errors import RecoveryError

ALL_CHECKS = ("I1", "I2", "I3", "I4", "I5")
HASH_HEX_LEN = 8  # a part hash: combined CRC-32 as 8 lowercase hex digits (runtime.snapshot.hash_hex)


def is_hash_hex(value: Any) -> bool:
    """Whether ``value`` is a well-formed part hash: a str of exactly 8 lowercase hex digits."""
    return isinstance(value, str) and len(value) == HASH_HEX_LEN and all(c in "0123456789abcdef" for c in value)


@dataclass(frozen=True)
class HeldCopy:
    """One verified replica a holder has: logical ``shard_id``, ``step``, the ``generation`` it was sent in
    and its ``hash`` (combined CRC-32 of the optimizer tensors, 8 hex digits)."""

    shard_id: str
    step: int
    generation: int
    hash: str


@dataclass(frozen=True)
class MemberReport:
    """The evidence one member of the new generation sends after its restore.

    ``rank_map``: ``((logical, world), ...)`` sorted; ``step``: its engine's step; ``partial``: whether it
    holds state of an unfinished step; ``opt_shard`` / ``param_shard``: the ids of the optimizer shard
    (``opt/pp/tp/dp``) and param shard (``param/pp/tp``) its engine holds; ``opt_hash`` / ``param_hash``:
    their hashes at ``step``; ``held``: the replicas it holds of earlier generations.
    """

    world_rank: int
    logical_rank: int
    generation: int
    rank_map: tuple[tuple[int, int], ...]
    step: int
    partial: bool = False
    opt_shard: str = ""
    opt_hash: str = ""
    param_shard: str = ""
    param_hash: str = ""
    held: tuple[HeldCopy, ...] = ()


@dataclass(frozen=True)
class Expected:
    """What the coordinator knows without asking the members.

    ``shard_owner``: optimizer shard id -> owner logical rank; ``param_of``: logical rank -> its param shard
    id; ``step``: R; ``sources``: shard id -> world rank of the holder the plan restores it from;
    ``sent``: ``(shard id, generation)`` -> logical ranks its owner reported sending replicas to (a key
    absent: the owner's statement never arrived, e.g. it died before its first commit report);
    ``placement``: ``(shard id, generation)`` -> logical ranks that generation's replica placement gives the
    shard to, as the coordinator recomputed it (:func:`phoenix_hpc.topology.generation_placement`; a key
    absent: not recomputable); ``rank_maps``: generation -> its rank map ``((logical, world), ...)`` (a
    generation absent: not checked);
    ``committed``: ``(shard id, step)`` -> the hash the owner committed (absent: not known);
    ``from_memory``: False for a restart from the persistent checkpoint (no replica comparisons).
    """

    generation: int
    rank_map: tuple[tuple[int, int], ...]
    shard_owner: Mapping[str, int] = field(hash=False)
    step: int
    param_of: Mapping[int, str] = field(default_factory=dict, hash=False)
    sources: Mapping[str, int] = field(default_factory=dict, hash=False)
    sent: Mapping[tuple[str, int], frozenset[int]] = field(default_factory=dict, hash=False)
    placement: Mapping[tuple[str, int], frozenset[int]] = field(default_factory=dict, hash=False)
    rank_maps: Mapping[int, tuple[tuple[int, int], ...]] = field(default_factory=dict, hash=False)
    committed: Mapping[tuple[str, int], str] = field(default_factory=dict, hash=False)
    from_memory: bool = True


@dataclass(frozen=True)
class Violation:
    invariant: str  # "I1".."I5"
    message: str

    def __str__(self) -> str:
        return f"{self.invariant}: {self.message}"


# --- screening ---------------------------------------------------------------------------------------
def screen(expected: Expected, reports: Mapping[int, MemberReport]) -> tuple[dict[int, MemberReport], list[str]]:
    """Drop evidence that cannot be true. Returns ``(accepted reports, rejection reasons)``.

    A whole report is rejected when it is of another generation or one of its state hashes is malformed (its
    member then counts as not reported, I1). A single held copy is rejected when its hash is malformed, it
    claims a generation not older than the new one, its holder was never sent that shard in that generation
    (by its owner's commit reports; without any statement of the owner, by that generation's placement:
    the holder's verified copy is then the evidence), or its hash differs from the one its owner committed
    for that step.
    """
    out: dict[int, MemberReport] = {}
    why: list[str] = []
    for w, rep in sorted(reports.items()):
        if rep.generation != expected.generation:
            why.append(f"report of world rank {w} rejected: it is of generation {rep.generation}, "
                       f"the recovery builds generation {expected.generation}")
            continue
        bad = [(n, v) for n, v in (("opt_hash", rep.opt_hash), ("param_hash", rep.param_hash)) if not is_hash_hex(v)]
        if bad:
            why.append(f"report of world rank {w} rejected: {bad[0][0]} {bad[0][1]!r} is not "
                       f"{HASH_HEX_LEN} lowercase hex digits")
            continue
        keep = []
        for c in rep.held:
            reason = _held_reason(expected, rep, c)
            if reason:
                why.append(f"replica of {c.shard_id} step {c.step} (generation {c.generation}) held by world rank "
                           f"{w} (logical {rep.logical_rank}) rejected: {reason}")
            else:
                keep.append(c)
        out[w] = MemberReport(rep.world_rank, rep.logical_rank, rep.generation, rep.rank_map, rep.step,
                              rep.partial, rep.opt_shard, rep.opt_hash, rep.param_shard, rep.param_hash, tuple(keep))
    return out, why


def _held_reason(expected: Expected, rep: MemberReport, c: HeldCopy) -> str:
    if not is_hash_hex(c.hash):
        return f"hash {c.hash!r} is not {HASH_HEX_LEN} lowercase hex digits"
    if c.generation >= expected.generation:
        return f"a replica of generation {c.generation} cannot exist before generation {expected.generation}"
    past = expected.rank_maps.get(c.generation)
    if past is not None and dict(past).get(rep.logical_rank) != rep.world_rank:
        return (f"world rank {rep.world_rank} was not logical rank {rep.logical_rank} in generation {c.generation} "
                f"(world rank {dict(past).get(rep.logical_rank)} was)")
    holders = expected.sent.get((c.shard_id, c.generation))
    if holders is not None and rep.logical_rank not in holders:
        return (f"its owner never sent it to logical rank {rep.logical_rank} in generation {c.generation} "
                f"(sent to {sorted(holders)})")
    if holders is None:
        # no word from the owner (it died before its commit report arrived): the holder's copy, verified
        # against the owner's sealed CRCs on receipt and again for this report, is the evidence, if the
        # generation's placement gives that holder the shard at all
        planned = expected.placement.get((c.shard_id, c.generation))
        if planned is None:
            return (f"its owner made no statement of its holders in generation {c.generation} and that "
                    "generation's placement is not known")
        if rep.logical_rank not in planned:
            return (f"the placement of generation {c.generation} gives {c.shard_id} to logical ranks "
                    f"{sorted(planned)}, so logical rank {rep.logical_rank} could never have received it")
    want = expected.committed.get((c.shard_id, c.step))
    if want is not None and want != c.hash:
        return f"hash {c.hash} differs from {want}, the hash its owner committed for step {c.step} (corrupt copy)"
    return ""


# --- the checks --------------------------------------------------------------------------------------
def check_i1(expected: Expected, reports: Mapping[int, MemberReport]) -> list[Violation]:
    """Topology consistency: same generation and rank map everywhere; no expected member missing."""
    out = []
    members = {w for _, w in expected.rank_map}
    for w in sorted(members - set(reports)):
        out.append(Violation("I1", f"world rank {w} is a member of generation {expected.generation} but has no "
                                   "accepted report"))
    for w in sorted(set(reports) - members):
        out.append(Violation("I1", f"world rank {w} reported but is not a member of generation {expected.generation}"))
    want = dict(expected.rank_map)
    for w, rep in sorted(reports.items()):
        if rep.generation != expected.generation:
            out.append(Violation("I1", f"world rank {w} is at generation {rep.generation}, expected {expected.generation}"))
        if tuple(rep.rank_map) != tuple(expected.rank_map):
            out.append(Violation("I1", f"world rank {w} has a different rank map"))
        if want.get(rep.logical_rank) != w:
            out.append(Violation("I1", f"world rank {w} believes it is logical rank {rep.logical_rank}"))
    return out


def _copies_at(reports: Mapping[int, MemberReport], sid: str, step: int) -> dict[int, str]:
    """world rank -> hash of every accepted replica of ``sid`` at ``step``."""
    return {w: c.hash for w, rep in reports.items() for c in rep.held if c.shard_id == sid and c.step == step}


def check_i2(expected: Expected, reports: Mapping[int, MemberReport]) -> list[Violation]:
    """Shard integrity: one owner per shard, the one the rank map names, whose optimizer-shard hash equals
    every accepted replica of the shard at R (from memory) and the hash its owner committed for R."""
    out = []
    owners: dict[str, list[tuple[int, int]]] = {sid: [] for sid in expected.shard_owner}
    for w, rep in reports.items():
        if rep.opt_shard:
            owners.setdefault(rep.opt_shard, []).append((rep.logical_rank, w))
    for sid in sorted(owners):
        got = sorted(owners[sid])
        names = ", ".join(f"logical {r} (world {w})" for r, w in got)
        if sid not in expected.shard_owner:
            out.append(Violation("I2", f"shard {sid} is held by {names} but is not a shard of the grid"))
            continue
        if len(got) != 1:
            out.append(Violation("I2", f"shard {sid} has {len(got)} owners [{names}], expected exactly one"))
            continue
        r, w = got[0]
        if r != expected.shard_owner[sid]:
            out.append(Violation("I2", f"shard {sid} is owned by logical rank {r}, expected {expected.shard_owner[sid]}"))
            continue
        if not expected.from_memory:
            continue
        mine = reports[w].opt_hash
        for hw, h in sorted(_copies_at(reports, sid, expected.step).items()):
            if h != mine:
                role = "the replica it was restored from" if expected.sources.get(sid) == hw else "a replica"
                out.append(Violation("I2", f"shard {sid}: owner world rank {w} has optimizer hash {mine} at step "
                                           f"{expected.step}, {role} held by world rank {hw} has {h}"))
        want = expected.committed.get((sid, expected.step))
        if want is not None and want != mine:
            out.append(Violation("I2", f"shard {sid}: owner world rank {w} has optimizer hash {mine} at step "
                                       f"{expected.step}, its owner committed {want}"))
    return out


def check_i3(expected: Expected, reports: Mapping[int, MemberReport]) -> list[Violation]:
    """Optimizer availability: every shard restored from a holder came from a verified copy of R that the
    holder proves it holds."""
    if not expected.from_memory:
        return []
    out = []
    for sid, src in sorted(expected.sources.items()):
        if src not in _copies_at(reports, sid, expected.step):
            out.append(Violation("I3", f"shard {sid} was restored from world rank {src}, which shows no verified "
                                       f"replica of it at step {expected.step}"))
    return out


def check_i4(expected: Expected, reports: Mapping[int, MemberReport]) -> list[Violation]:
    """Step atomicity: every member at the resume step, none with partial-step state."""
    out = []
    for w, rep in sorted(reports.items()):
        if rep.step != expected.step:
            out.append(Violation("I4", f"world rank {w} is at step {rep.step}, expected {expected.step}"))
        if rep.partial:
            out.append(Violation("I4", f"world rank {w} holds state of a partial step"))
    return out


def check_i5(expected: Expected, reports: Mapping[int, MemberReport]) -> list[Violation]:
    """Parameter consistency: the members at one (pp, tp) hold that param shard and report equal hashes."""
    out = []
    groups: dict[str, dict[str, list[int]]] = {}
    for w, rep in sorted(reports.items()):
        want = expected.param_of.get(rep.logical_rank)
        if want is None:
            continue
        if rep.param_shard != want:
            out.append(Violation("I5", f"world rank {w} holds param shard {rep.param_shard!r}, expected {want}"))
            continue
        groups.setdefault(want, {}).setdefault(rep.param_hash, []).append(w)
    for pid, by_hash in sorted(groups.items()):
        if len(by_hash) > 1:
            parts = "; ".join(f"{h} at world rank(s) {ws}" for h, ws in sorted(by_hash.items()))
            out.append(Violation("I5", f"param shard {pid}: DP peers disagree ({parts})"))
    return out


CHECKS = {"I1": check_i1, "I2": check_i2, "I3": check_i3, "I4": check_i4, "I5": check_i5}


def check_all(expected: Expected, reports: Mapping[int, MemberReport], which: Iterable[str] = ALL_CHECKS) -> list[Violation]:
    """Run the named checks in order over already screened reports and return every violation."""
    out: list[Violation] = []
    for name in which:
        out += CHECKS[name](expected, reports)
    return out


def verify_recovery(expected: Expected, reports: Mapping[int, MemberReport],
                    which: Iterable[str] = ALL_CHECKS) -> tuple[list[str], list[Violation]]:
    """:func:`screen`, then :func:`check_all` on the accepted evidence: ``(rejections, violations)``."""
    accepted, rejected = screen(expected, reports)
    return rejected, check_all(expected, accepted, which)


def assert_invariants(expected: Expected, reports: Mapping[int, MemberReport], which: Iterable[str] = ALL_CHECKS) -> None:
    """Raise RecoveryError listing every rejection and violation (nothing when all evidence holds)."""
    rejected, bad = verify_recovery(expected, reports, which)
    if bad:
        raise RecoveryError("recovery invariant violated:\n" + "\n".join(
            [f"  - {v}" for v in bad] + [f"  - (evidence) {r}" for r in rejected]))


def report_from_json(d: Mapping[str, Any]) -> MemberReport:
    """Build a MemberReport from its JSON form (as a rank sends it to the coordinator).

    Raises:
        ValueError: a field is missing or of the wrong type (KeyError/TypeError are mapped to it).
    """
    try:
        return MemberReport(
            world_rank=int(d["world_rank"]),
            logical_rank=int(d["logical_rank"]),
            generation=int(d["generation"]),
            rank_map=tuple((int(a), int(b)) for a, b in d["rank_map"]),
            step=int(d["step"]),
            partial=bool(d.get("partial", False)),
            opt_shard=str(d.get("opt_shard", "")),
            opt_hash=str(d.get("opt_hash", "")),
            param_shard=str(d.get("param_shard", "")),
            param_hash=str(d.get("param_hash", "")),
            held=tuple(HeldCopy(str(s), int(k), int(g), str(h)) for s, k, g, h in d.get("held", ())),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed recovery report: {type(exc).__name__}: {exc}") from None
