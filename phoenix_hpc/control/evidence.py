"""The coordinator's evidence for the recovery checks (docs/design.md section 6, invariants): what it knows
of every shard's replicas without asking the members it checks.

- the owners' word: with each commit an owner states where its shard's replicas went in this generation
  and the hash of the step it committed (:meth:`EvidenceBook.record_sent`; ``sent``, ``commit_hash``);
- each generation's replica placement, recomputed with the members' own function
  (:func:`phoenix_hpc.topology.generation_placement`) from what the slots registered (``k``, the placement
  levels, their nodes' failure domains) and the generation's rank map (:meth:`EvidenceBook.placements`).
  An owner that died after its holders verified step R but before its commit report arrived has said
  nothing: a holder's claim on its shard is then judged against the placement;
- :meth:`EvidenceBook.expected` puts both together with the plan into the
  :class:`~phoenix_hpc.recovery.invariants.Expected` the checks use; :meth:`EvidenceBook.holder_of` names
  the holder a ``corrupt-replica`` injection goes to.

:class:`EvidenceBook` owns the statements and the placement cache; everything else it needs (the grid, the
slots, the rank maps) is passed in, and it does no I/O. The coordinator holds one (``evidence``).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from phoenix_hpc.control.records import Recovery
from phoenix_hpc.control.states import LIVE_SLOT_STATES
from phoenix_hpc.errors import ReplicationError
from phoenix_hpc.recovery.invariants import Expected, is_hash_hex
from phoenix_hpc.topology import coord_of, generation_placement, world_size_of


def placement_inputs_problem(inputs: Any) -> str:
    """Why a registration's ``placement_inputs`` (``{"k", "levels", "domain"}``,
    :meth:`phoenix_hpc.control.client.CoordinatorClient.register`) is malformed; "" when it is fine. Pure."""
    if not isinstance(inputs, dict):
        return f"{inputs!r} is not an object"
    k, levels, dom = inputs.get("k"), inputs.get("levels"), inputs.get("domain")
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        return f"k {k!r} is not an integer >= 0"
    if not isinstance(levels, list) or not levels or not all(isinstance(x, str) for x in levels):
        return f"levels {levels!r} is not a non-empty list of level names"
    if dom is not None and not (isinstance(dom, dict) and all(isinstance(a, str) and isinstance(b, str)
                                                              for a, b in dom.items())):
        return f"domain {dom!r} is not an object of level name -> domain name"
    return ""


class EvidenceBook:
    """The owners' statements and each generation's placement, for the recovery checks."""

    COMMIT_HASHES_KEPT = 4  # steps per shard: both ping-pong buffers of every copy, with room for lag

    def __init__(self) -> None:
        # (shard id, generation) -> logical ranks its replicas were sent to, as the owner stated
        self.sent: dict[tuple[str, int], frozenset[int]] = {}
        self.commit_hash: dict[str, dict[int, str]] = {}  # shard id -> {step: hash the owner committed}
        self._placement_cache: dict[int, dict[str, frozenset[int]]] = {}

    def record_sent(self, *, world_rank: int, logical_rank: int, grid: tuple[int, int, int] | None, g: int,
                    sent: Any) -> tuple[str, tuple] | None:
        """Keep an owner's statement of where its shard's replicas went in generation ``g`` and the hash of
        the step it committed (only for the shard the owner's ``logical_rank`` owns). Returns None, or the
        reason and journal key to reject the message with (a malformed statement, or one for a shard the
        owner does not own: nothing after it is kept)."""
        if not sent:
            return None
        own = coord_of(logical_rank, *grid).shard_prefix() if grid else None
        for sid, d in dict(sent).items() if isinstance(sent, dict) else ():
            try:
                holders = frozenset(int(h) for h in d["holders"])
                step, h = d.get("step"), d.get("hash")
            except (KeyError, TypeError, ValueError):
                return (f"world rank {world_rank} sent a malformed replica statement for {sid}",
                        ("sent", world_rank, "malformed"))
            if sid != own:
                return (f"world rank {world_rank} (logical {logical_rank}) made a replica statement for shard {sid} "
                        "it does not own", ("sent", world_rank, sid))
            self.sent[(sid, g)] = holders
            if step is not None and is_hash_hex(h):
                hashes = self.commit_hash.setdefault(sid, {})
                hashes[int(step)] = h
                for old in sorted(hashes)[:-self.COMMIT_HASHES_KEPT]:
                    del hashes[old]
        return None

    def placements(self, before: int, *, placement_inputs: Mapping[str, Any] | None,
                   grid_of: Callable[[int], tuple[int, int, int]], slots: Mapping[int, Any],
                   rank_maps: Mapping[int, Mapping[int, int]]) -> dict[tuple[str, int], frozenset[int]]:
        """``(shard id, generation)`` -> the logical ranks the replica placement of that generation gives the
        shard to, for every generation before ``before`` whose placement can be recomputed (the slots
        registered their ``placement_inputs``; :func:`phoenix_hpc.topology.generation_placement`, the
        function every member builds its protector from). ``grid_of``: a generation's grid (a shrink changes
        it); ``slots``: world rank -> slot (``node``, ``domain``). Cached per generation: its inputs never
        change."""
        pi = placement_inputs
        if not pi or int(pi["k"]) < 1:
            return {}
        nodes = {w: s.node for w, s in slots.items()}
        domains = {s.node: s.domain for s in slots.values() if s.domain}
        out: dict[tuple[str, int], frozenset[int]] = {}
        for g, rank_map in sorted(rank_maps.items()):
            if g >= before:
                continue
            if g not in self._placement_cache:
                try:
                    grid = grid_of(g)
                    node_of_rank = [nodes[rank_map[r]] for r in range(world_size_of(*grid))]
                    pl = generation_placement(grid, int(pi["k"]), node_of_rank, domains, tuple(pi["levels"]),
                                              beyond_dp=grid[2] < grid_of(0)[2])
                    self._placement_cache[g] = {sid: frozenset(h) for sid, h in pl.holders_by_shard().items()}
                except (KeyError, ReplicationError):
                    self._placement_cache[g] = {}  # not recomputable: claims need their owner's statement
            out.update({(sid, g): h for sid, h in self._placement_cache[g].items()})
        return out

    def expected(self, rec: Recovery, *, grid: tuple[int, int, int],
                 placement: Mapping[tuple[str, int], frozenset[int]],
                 rank_maps: Mapping[int, Mapping[int, int]]) -> Expected:
        """What the coordinator knows of the recovery's outcome without the members' reports: the plan, the
        owners' commit statements, the ``placement`` (:meth:`placements` before the recovery's generation)
        and the rank map of every earlier generation."""
        plan = rec.plan
        T, PP, D = grid
        coords = {r: coord_of(r, T, PP, D) for r, _ in plan.rank_map}
        return Expected(
            rec.generation, plan.rank_map, {c.shard_prefix(): r for r, c in coords.items()}, plan.recoverable_step,
            param_of={r: c.param_shard() for r, c in coords.items()},
            sources={t.shard_id: t.sender_world for t in plan.transfers if t.kind == "optimizer"},
            sent=dict(self.sent),
            placement=dict(placement),
            rank_maps={g: tuple(sorted(m.items())) for g, m in rank_maps.items() if g < rec.generation},
            committed={(sid, st): h for sid, hs in self.commit_hash.items() for st, h in hs.items()},
            from_memory=plan.action not in ("checkpoint_restart", "shrink"),
        )

    def holder_of(self, owners: list[int], *, rank_map: Mapping[int, int], grid: tuple[int, int, int] | None,
                  generation: int, slots: Mapping[int, Any],
                  placement: Callable[[], Mapping[tuple[str, int], frozenset[int]]],
                  ) -> tuple[tuple[int, str] | None, str]:
        """``((world rank of a live holder, shard id), "")`` for the shard of the first of ``owners`` (world
        ranks): its lowest live logical holder of this ``generation``, by the owner's commit reports (or,
        before the owner's first, by the generation's ``placement()``); else ``(None, why)``."""
        w2l = {w: r for r, w in rank_map.items()}
        r = w2l.get(owners[0])
        if r is None or not grid:
            return None, f"world rank {owners[0]} owns no shard"
        sid = coord_of(r, *grid).shard_prefix()
        holders = self.sent.get((sid, generation)) or placement().get((sid, generation))
        if not holders:
            return None, (f"no holder of shard {sid} is known in generation {generation} (its owner has not "
                          "committed a replica yet, or the job runs with k = 0)")
        live = [h for h in sorted(holders) if rank_map.get(h) in slots
                and slots[rank_map[h]].state in LIVE_SLOT_STATES]
        if not live:
            return None, f"no live holder of shard {sid} (holders: logical ranks {sorted(holders)})"
        return (rank_map[live[0]], sid), ""
