"""The coordinator's evidence for the recovery checks (docs/design.md section 6, invariants): what it knows
of every shard's replicas without asking the members it checks.

- the owners' word: with each commit an owner states where its shard's replicas went in this generation
  and the hash of the step it committed (:meth:`EvidenceMixin._record_sent`; ``sent``, ``commit_hash``);
- each generation's replica placement, recomputed with the members' own function
  (:func:`phoenix_hpc.topology.generation_placement`) from what the slots registered (``k``, the placement
  levels, their nodes' failure domains) and the generation's rank map (:meth:`EvidenceMixin._placements`).
  An owner that died after its holders verified step R but before its commit report arrived has said
  nothing: a holder's claim on its shard is then judged against the placement;
- :meth:`EvidenceMixin._expected` puts both together with the plan into the
  :class:`~phoenix_hpc.recovery.invariants.Expected` the checks use; :meth:`EvidenceMixin._holder_of` names
  the holder a ``corrupt-replica`` injection goes to.

:class:`EvidenceMixin` is part of :class:`phoenix_hpc.control.coordinator.Coordinator`.
"""

from __future__ import annotations

from typing import Any

from phoenix_hpc.control.records import Recovery, Slot
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


class EvidenceMixin:
    """The owners' statements and each generation's placement, for the recovery checks."""

    _COMMIT_HASHES_KEPT = 4  # steps per shard: both ping-pong buffers of every copy, with room for lag

    def _record_sent(self, slot: Slot, g: int, sent: Any, body: dict) -> None:
        """Keep an owner's statement of where its shard's replicas went in generation ``g`` and the hash of
        the step it committed (only for the shard the owner's logical rank owns; anything else is rejected
        with a journal reason)."""
        if not sent:
            return
        own = coord_of(slot.logical_rank, *self.grid).shard_prefix() if self.grid else None
        for sid, d in dict(sent).items() if isinstance(sent, dict) else ():
            try:
                holders = frozenset(int(h) for h in d["holders"])
                step, h = d.get("step"), d.get("hash")
            except (KeyError, TypeError, ValueError):
                return self._reject(f"world rank {slot.world_rank} sent a malformed replica statement for {sid}",
                                    body, key=("sent", slot.world_rank, "malformed"), reply=False)
            if sid != own:
                return self._reject(f"world rank {slot.world_rank} (logical {slot.logical_rank}) made a replica "
                                    f"statement for shard {sid} it does not own", body,
                                    key=("sent", slot.world_rank, sid), reply=False)
            self.sent[(sid, g)] = holders
            if step is not None and is_hash_hex(h):
                hashes = self.commit_hash.setdefault(sid, {})
                hashes[int(step)] = h
                for old in sorted(hashes)[:-self._COMMIT_HASHES_KEPT]:
                    del hashes[old]

    def _placements(self, before: int) -> dict[tuple[str, int], frozenset[int]]:
        """``(shard id, generation)`` -> the logical ranks the replica placement of that generation gives the
        shard to, for every generation before ``before`` whose placement can be recomputed (the slots
        registered their placement inputs; :func:`phoenix_hpc.topology.generation_placement`, the function
        every member builds its protector from). Cached per generation: its inputs never change."""
        pi = self.placement_inputs
        if not pi or not self.grid or int(pi["k"]) < 1:
            return {}
        nodes = {w: s.node for w, s in self.slots.items()}
        domains = {s.node: s.domain for s in self.slots.values() if s.domain}
        out: dict[tuple[str, int], frozenset[int]] = {}
        for g, rank_map in sorted(self.rank_maps.items()):
            if g >= before:
                continue
            if g not in self._placement_cache:
                try:
                    grid = self._grid_of(g)  # a shrink changes the grid from its generation on
                    node_of_rank = [nodes[rank_map[r]] for r in range(world_size_of(*grid))]
                    pl = generation_placement(grid, int(pi["k"]), node_of_rank, domains, tuple(pi["levels"]),
                                              beyond_dp=grid[2] < self._grid_of(0)[2])
                    self._placement_cache[g] = {sid: frozenset(h) for sid, h in pl.holders_by_shard().items()}
                except (KeyError, ReplicationError):
                    self._placement_cache[g] = {}  # not recomputable: claims need their owner's statement
            out.update({(sid, g): h for sid, h in self._placement_cache[g].items()})
        return out

    def _expected(self, rec: Recovery) -> Expected:
        """What the coordinator knows of the recovery's outcome without the members' reports: the plan, the
        owners' commit statements, the placement and rank map of every earlier generation."""
        plan = rec.plan
        T, PP, D = self.grid
        coords = {r: coord_of(r, T, PP, D) for r, _ in plan.rank_map}
        return Expected(
            rec.generation, plan.rank_map, {c.shard_prefix(): r for r, c in coords.items()}, plan.recoverable_step,
            param_of={r: c.param_shard() for r, c in coords.items()},
            sources={t.shard_id: t.sender_world for t in plan.transfers if t.kind == "optimizer"},
            sent=dict(self.sent),
            placement=self._placements(before=rec.generation),
            rank_maps={g: tuple(sorted(m.items())) for g, m in self.rank_maps.items() if g < rec.generation},
            committed={(sid, st): h for sid, hs in self.commit_hash.items() for st, h in hs.items()},
            from_memory=plan.action not in ("checkpoint_restart", "shrink"),
        )

    def _holder_of(self, owners: list[int]) -> tuple[tuple[int, str] | None, str]:
        """``((world rank of a live holder, shard id), "")`` for the shard of the first of ``owners`` (world
        ranks): its lowest live logical holder of this generation, by the owner's commit reports (or, before
        the owner's first, by the generation's placement); else ``(None, why)``."""
        w2l = {w: r for r, w in self.rank_map.items()}
        r = w2l.get(owners[0])
        if r is None or not self.grid:
            return None, f"world rank {owners[0]} owns no shard"
        sid = coord_of(r, *self.grid).shard_prefix()
        holders = self.sent.get((sid, self.generation)) or self._placements(before=self.generation + 1).get(
            (sid, self.generation))
        if not holders:
            return None, (f"no holder of shard {sid} is known in generation {self.generation} (its owner has not "
                          "committed a replica yet, or the job runs with k = 0)")
        live = [h for h in sorted(holders) if self.rank_map.get(h) in self.slots
                and self.slots[self.rank_map[h]].state in LIVE_SLOT_STATES]
        if not live:
            return None, f"no live holder of shard {sid} (holders: logical ranks {sorted(holders)})"
        return (self.rank_map[live[0]], sid), ""
