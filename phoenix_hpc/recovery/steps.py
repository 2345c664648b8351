"""The recoverable step ``R`` (docs/design.md sections 4 and 6): the one definition, as pure functions.

Every optimizer shard exists as several copies: the owner's local snapshot and one replica per holder. A
copy can provide one step (the step of its committed buffer) or, in a recovery, the steps of both buffers of
its ping-pong pair. A *shard* can be restored to any step one of its usable copies provides;
``R = min over shards of (newest step that shard can provide)``, and a recovery from memory needs every
shard to provide exactly ``R`` (:func:`shards_without`).

In training the coordinator knows one committed step per copy; a shard counts as committed at a step once
its owner and every holder committed it (:func:`committed_step`, the oldest of the copies' steps), which is
when the owner flips staging -> committed (after ``k`` acks).

Users: the coordinator's journalled recoverable step (:mod:`phoenix_hpc.control.handlers`), the recovery
plan (:func:`phoenix_hpc.recovery.plan.plan_recovery`) and the planned end's common step
(:func:`phoenix_hpc.control.ending.choose_step`). The ranks' commit fence computes the same minimum as an
MPI ``MIN`` all-reduce (:mod:`phoenix_hpc.runtime.h2h`).
"""

from __future__ import annotations

from typing import Hashable, Iterable, Mapping

StepsOf = Mapping[str, "int | Iterable[int] | None"]


def _steps(copy: int | Iterable[int] | None) -> set[int]:
    """The steps one entry can provide: none, one step, or a collection of steps (``None`` entries skipped)."""
    if copy is None:
        return set()
    if isinstance(copy, int):
        return {copy}
    return {int(s) for s in copy if s is not None}


def committed_step(copies: Mapping[int, int]) -> int | None:
    """The step a shard is committed at, from the committed step of each of its copies (logical rank of the
    owner or holder -> step): the oldest of them; ``None`` for no copies."""
    return min((int(s) for s in copies.values()), default=None)


def recoverable_step(steps_of: StepsOf) -> int | None:
    """``R``: the minimum over shards of the newest step each shard can provide.

    Args:
        steps_of: shard id -> the step(s) that shard can provide (an int, a collection of ints, or ``None``).

    Returns:
        ``R``, or ``None`` when there is no shard or some shard can provide no step.
    """
    newest = []
    for copy in steps_of.values():
        s = _steps(copy)
        if not s:
            return None
        newest.append(max(s))
    return min(newest) if newest else None


def shards_without(steps_of: StepsOf, step: int) -> list[str]:
    """The shard ids (sorted) that cannot provide exactly ``step``."""
    return sorted(sid for sid, copy in steps_of.items() if step not in _steps(copy))


def newest_common_step(steps_of: Mapping[Hashable, Iterable[int]]) -> int | None:
    """The newest step that every entry can provide (e.g. member -> steps of its verified host snapshots);
    ``None`` when there is no such step or no entry."""
    common: set[int] | None = None
    for copy in steps_of.values():
        common = _steps(copy) if common is None else common & _steps(copy)
    return max(common) if common else None


def before_step(copies: Mapping[str, Mapping[int, Iterable[int]]], live_steps: Mapping[int, int], dirty: Iterable[int],
                bad_step: int) -> tuple[dict[str, dict[int, list[int]]], list[int]]:
    """A recovery's copies and dirty members once every state from ``bad_step`` on is known bad (the DP
    replicas' parameters differed at that step's commit fence, docs/design.md section 6): the copies of
    ``bad_step`` and later are dropped (a copy left with no step is gone), and every member whose live step is
    ``bad_step`` or later is dirty (its live state is not offered), so the recoverable step is older than
    ``bad_step``. ``copies``: shard id -> logical rank -> the steps of its buffers; ``live_steps``: logical
    rank -> live step. Pure.

    Returns:
        ``(copies, dirty)``: the kept copies, and the dirty members (sorted).
    """
    kept: dict[str, dict[int, list[int]]] = {}
    for sid, per in copies.items():
        for r, steps in per.items():
            good = [int(s) for s in _steps(steps) if int(s) < bad_step]
            if good:
                kept.setdefault(sid, {})[r] = sorted(good, reverse=True)
    return kept, sorted(set(dirty) | {r for r, s in live_steps.items() if s >= bad_step})
