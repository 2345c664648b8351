"""The recovery invariants I1-I4 (docs/design.md section 6) as pure checks over the members' reports.

After a recovery every live active member reports a :class:`MemberReport`; the coordinator compares them
with the :class:`Expected` state of the plan:

- **I1 topology consistency**: every member agrees on generation and rank map (hence on membership and on
  the shard map, which is a function of the rank map), and every expected member reported.
- **I2 shard integrity**: every logical shard has exactly one owner, and that owner is the one the rank map
  names.
- **I3 optimizer availability**: every shard's optimizer state is held in memory at the resume step by some
  live member whose copy verified (the owner's live state, or a committed replica).
- **I4 step atomicity**: every member is at the resume step and none carries a partial step (gradients
  accumulated or an update applied past the resume step).

Each check returns a list of :class:`Violation` (empty when it holds); :func:`assert_invariants` raises
:class:`~phoenix_hpc.errors.RecoveryError` listing all of them. A violation must stop the job (never train
on); the caller journals it first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from phoenix_hpc.errors import RecoveryError


@dataclass(frozen=True)
class MemberReport:
    """What one live active member states after a recovery.

    ``rank_map``: ``((logical, world), ...)`` sorted; ``owned_shards``: shard ids whose optimizer state it
    owns; ``copies``: ``((shard id, step), ...)`` of verified optimizer copies it holds in memory (its own
    live shard and committed replicas); ``partial``: whether it holds state of an unfinished step.
    """

    world_rank: int
    logical_rank: int
    generation: int
    rank_map: tuple[tuple[int, int], ...]
    step: int
    partial: bool = False
    owned_shards: tuple[str, ...] = ()
    copies: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Expected:
    """The state a recovery must produce: generation, rank map, every shard id -> its owner's logical rank,
    and the resume step."""

    generation: int
    rank_map: tuple[tuple[int, int], ...]
    shard_owner: Mapping[str, int] = field(hash=False)
    step: int


@dataclass(frozen=True)
class Violation:
    invariant: str  # "I1".."I4"
    message: str

    def __str__(self) -> str:
        return f"{self.invariant}: {self.message}"


def check_i1(expected: Expected, reports: Mapping[int, MemberReport]) -> list[Violation]:
    """Topology consistency: same generation and rank map everywhere; no expected member missing."""
    out = []
    members = {w for _, w in expected.rank_map}
    for w in sorted(members - set(reports)):
        out.append(Violation("I1", f"world rank {w} is a member of generation {expected.generation} but did not report"))
    for w in sorted(set(reports) - members):
        out.append(Violation("I1", f"world rank {w} reported but is not a member of generation {expected.generation}"))
    for w, rep in sorted(reports.items()):
        if rep.generation != expected.generation:
            out.append(Violation("I1", f"world rank {w} is at generation {rep.generation}, expected {expected.generation}"))
        if tuple(rep.rank_map) != tuple(expected.rank_map):
            out.append(Violation("I1", f"world rank {w} has a different rank map"))
        want = dict(expected.rank_map)
        if want.get(rep.logical_rank) != w:
            out.append(Violation("I1", f"world rank {w} believes it is logical rank {rep.logical_rank}"))
    return out


def check_i2(expected: Expected, reports: Mapping[int, MemberReport]) -> list[Violation]:
    """Shard integrity: every shard exactly one owner, the one the rank map names."""
    out = []
    owners: dict[str, list[int]] = {sid: [] for sid in expected.shard_owner}
    for w, rep in reports.items():
        for sid in rep.owned_shards:
            owners.setdefault(sid, []).append(rep.logical_rank)
    for sid in sorted(owners):
        got = sorted(owners[sid])
        if sid not in expected.shard_owner:
            out.append(Violation("I2", f"shard {sid} is owned by {got} but is not a shard of the grid"))
        elif len(got) != 1:
            out.append(Violation("I2", f"shard {sid} has {len(got)} owners {got}, expected exactly one"))
        elif got[0] != expected.shard_owner[sid]:
            out.append(Violation("I2", f"shard {sid} is owned by logical rank {got[0]}, expected {expected.shard_owner[sid]}"))
    return out


def check_i3(expected: Expected, reports: Mapping[int, MemberReport]) -> list[Violation]:
    """Optimizer availability: a verified in-memory copy of every shard at the resume step."""
    have: dict[str, set[int]] = {}
    for rep in reports.values():
        for sid, step in rep.copies:
            have.setdefault(sid, set()).add(step)
    return [
        Violation("I3", f"shard {sid} has no verified in-memory copy at step {expected.step} (copies at {sorted(have.get(sid, ()))})")
        for sid in sorted(expected.shard_owner)
        if expected.step not in have.get(sid, set())
    ]


def check_i4(expected: Expected, reports: Mapping[int, MemberReport]) -> list[Violation]:
    """Step atomicity: every member at the resume step, none with partial-step state."""
    out = []
    for w, rep in sorted(reports.items()):
        if rep.step != expected.step:
            out.append(Violation("I4", f"world rank {w} is at step {rep.step}, expected {expected.step}"))
        if rep.partial:
            out.append(Violation("I4", f"world rank {w} holds state of a partial step"))
    return out


def check_all(expected: Expected, reports: Mapping[int, MemberReport], which: Iterable[str] = ("I1", "I2", "I3", "I4")) -> list[Violation]:
    """Run the named checks in order and return every violation."""
    checks = {"I1": check_i1, "I2": check_i2, "I3": check_i3, "I4": check_i4}
    out: list[Violation] = []
    for name in which:
        out += checks[name](expected, reports)
    return out


def assert_invariants(expected: Expected, reports: Mapping[int, MemberReport], which: Iterable[str] = ("I1", "I2", "I3", "I4")) -> None:
    """Raise RecoveryError listing every violation of the named invariants (nothing when all hold)."""
    bad = check_all(expected, reports, which)
    if bad:
        raise RecoveryError("recovery invariant violated:\n" + "\n".join(f"  - {v}" for v in bad))


def report_from_json(d: Mapping) -> MemberReport:
    """Build a MemberReport from its JSON form (as a rank sends it to the coordinator)."""
    return MemberReport(
        world_rank=int(d["world_rank"]),
        logical_rank=int(d["logical_rank"]),
        generation=int(d["generation"]),
        rank_map=tuple((int(a), int(b)) for a, b in d["rank_map"]),
        step=int(d["step"]),
        partial=bool(d.get("partial", False)),
        owned_shards=tuple(d.get("owned_shards", ())),
        copies=tuple((str(s), int(k)) for s, k in d.get("copies", ())),
    )
