"""What a recovery's planner takes from the members' answers, and which checkpoint a fallback names
(docs/design.md section 6). Pure functions of the coordinator's recovery
(:mod:`phoenix_hpc.control.recovery_machine` carries them out).

- :func:`gather_quiesced`: the ``quiesced`` answers (world rank -> body) as the planner's inputs: each
  survivor's live step, the steps of the copies it holds (shard id -> logical rank -> steps of its buffers,
  committed first), the members whose live state is dirty, the optimizer sizes a shrink re-partitions, and
  the members to restore again in place (a spare whose restore was cut short answers live step -1 and offers
  nothing). With ``bad_step`` (the DP replicas' parameters differed at that step's commit fence) every copy
  from it on is dropped and every member at or past it is dirty (:func:`phoenix_hpc.recovery.steps.before_step`).
- :func:`fallback_checkpoint`: the persistent checkpoint a recovery that memory cannot cover falls back to,
  and how many finished steps it loses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from phoenix_hpc.recovery.steps import before_step


@dataclass(frozen=True)
class Quiesced:
    """The planner's inputs from the ``quiesced`` answers (logical ranks; steps are training steps).

    ``committed``: shard id -> logical rank -> the steps its buffers hold; ``live_steps``: logical rank ->
    live step; ``dirty``: members whose live state is not offered; ``numel``: stage -> elements of its flat
    optimizer vector; ``restore_pending``: members to restore again in place (their copies are not offered).
    """

    committed: dict[str, dict[int, list[int]]]
    live_steps: dict[int, int]
    dirty: list[int]
    numel: dict[str, int]
    restore_pending: frozenset[int]


def gather_quiesced(answers: Mapping[int, Mapping[str, Any]], logical_of: Mapping[int, int | None],
                    restore_pending: Iterable[int], bad_step: int | None = None) -> Quiesced:
    """The :class:`Quiesced` inputs of ``answers`` (world rank -> ``quiesced`` body: ``live_step``, ``dirty``,
    ``shards`` and ``replicas`` {shard id: step or [steps]}, ``opt_numel``), ``logical_of`` (world rank ->
    logical rank, None for a slot that holds none), the members already to restore in place and the
    ``bad_step`` (see the module docstring). Pure.

    Raises:
        KeyError, TypeError, ValueError: an answer without an integer ``live_step`` (the admission of
            ``quiesced`` reports checks it; a body that reached here malformed is a bug).
    """
    pending = set(restore_pending)
    for w, q in answers.items():
        r = logical_of.get(w)
        if r is not None and int(q.get("live_step", 0)) < 0:
            pending.add(r)
    committed: dict[str, dict[int, list[int]]] = {}
    live_steps: dict[int, int] = {}
    dirty: list[int] = []
    numel: dict[str, int] = {}
    for w, q in answers.items():
        for key, v in dict(q.get("opt_numel") or {}).items():
            numel[str(key)] = int(v)
        r = logical_of.get(w)
        if r is None or r in pending:
            continue
        live_steps[r] = int(q["live_step"])
        if q.get("dirty"):
            dirty.append(r)
        for sid, st in {**dict(q.get("shards", {})), **dict(q.get("replicas", {}))}.items():
            committed.setdefault(sid, {})[r] = [int(st)] if isinstance(st, int) else [int(x) for x in st]
    if bad_step is not None:
        committed, dirty = before_step(committed, live_steps, dirty, bad_step)
    return Quiesced(committed, live_steps, dirty, numel, frozenset(pending))


def fallback_checkpoint(newest: int | None, complete: Sequence[int], bad_step: int | None,
                        live_steps: Mapping[int, int], reported_steps: Iterable[int]) -> tuple[int | None, int | None]:
    """``(checkpoint step, lost steps)`` of a fallback. Pure.

    ``newest``: the newest complete persistent checkpoint (rank 0's report or the checkpoint root); with a
    ``bad_step`` (replicas that differed) a checkpoint from it on may carry the corruption, so the newest of
    ``complete`` (every complete checkpoint step) before it is taken instead. The lost steps run from it to the
    newest step any member finished: the survivors' ``live_steps`` or, with none left, the members' last
    ``reported_steps``. None, None: no checkpoint to name."""
    ck = newest
    if bad_step is not None and ck is not None and ck >= bad_step:
        ck = max((s for s in complete if s < bad_step), default=None)
    done = max(live_steps.values(), default=None)
    if done is None:
        done = max(reported_steps, default=0)
    return ck, None if ck is None else max(0, done - ck)
