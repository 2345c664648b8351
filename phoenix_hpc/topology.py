"""Pure grid and topology maths: logical rank <-> grid coordinate, parallel group members.

Logical rank order is Megatron's (``megatron.core.parallel_state``): tp varies fastest, then dp, then pp::

    rank = (pp * dp_size + dp) * tp_size + tp

so the ``tp`` ranks of one (pp, dp) are contiguous, the ``dp`` ranks of one (pp, tp) are ``tp_size`` apart,
and the ``pp`` ranks of one (dp, tp) are ``dp_size * tp_size`` apart. All functions here are pure; they raise
:class:`ValueError` on sizes < 1 or ranks/coordinates out of range (internal misuse, not user input).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple


class Grid(NamedTuple):
    """The sizes of a generation's parallel grid, ``(tp, pp, dp)``, the one grid type: a tuple in that order
    (what the journal, the checkpoints' ``complete.json`` and the planners store), with names, and the JSON
    object ``{"tp", "pp", "dp"}`` of a plan, an envelope and a rank's summary (:meth:`to_json`, :meth:`of`).
    ``world_size = tp * pp * dp``."""

    tp: int
    pp: int
    dp: int

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    @classmethod
    def of(cls, d: Mapping[str, Any]) -> "Grid":
        """The grid of a JSON ``{"tp", "pp", "dp"}`` (a plan's, an envelope's).

        Raises:
            KeyError, TypeError, ValueError: ``d`` is not such an object."""
        return cls(int(d["tp"]), int(d["pp"]), int(d["dp"]))

    def to_json(self) -> dict[str, int]:
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp}


@dataclass(frozen=True, order=True)
class GridCoord:
    """A rank's logical position. Logical rank (Megatron order: tp fastest, then dp, then pp) is
    ``(pp * dp_size + dp) * tp_size + tp``."""

    pp: int
    dp: int
    tp: int

    def shard_prefix(self) -> str:
        """``opt/pp{pp}/tp{tp}/dp{dp}`` -- the logical id of this rank's optimizer shard."""
        return f"opt/pp{self.pp}/tp{self.tp}/dp{self.dp}"

    def param_shard(self) -> str:
        """``param/pp{pp}/tp{tp}`` -- the logical id of this rank's param shard (the same on every DP rank)."""
        return f"param/pp{self.pp}/tp{self.tp}"

    def to_json(self) -> dict[str, int]:
        """``{"pp", "dp", "tp"}``: the coordinate in an envelope and a rank's summary."""
        return {"pp": self.pp, "dp": self.dp, "tp": self.tp}


# --- grid maths ------------------------------------------------------------------------------------------


def _check_sizes(tp: int, pp: int, dp: int) -> None:
    for name, v in (("tp", tp), ("pp", pp), ("dp", dp)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} size must be an int >= 1, got {v!r}")


def world_size_of(tp: int, pp: int, dp: int) -> int:
    """Number of logical ranks of a ``tp x pp x dp`` grid."""
    _check_sizes(tp, pp, dp)
    return tp * pp * dp


def coord_of(rank: int, tp: int, pp: int, dp: int) -> GridCoord:
    """The grid coordinate of logical ``rank`` (Megatron order: tp fastest, then dp, then pp)."""
    n = world_size_of(tp, pp, dp)
    if not 0 <= rank < n:
        raise ValueError(f"rank {rank} out of range for a grid of {n} ranks (tp={tp}, pp={pp}, dp={dp})")
    return GridCoord(pp=rank // (tp * dp), dp=(rank // tp) % dp, tp=rank % tp)


def rank_of(coord: GridCoord, tp: int, pp: int, dp: int) -> int:
    """The logical rank of ``coord``; inverse of :func:`coord_of`."""
    _check_sizes(tp, pp, dp)
    if not (0 <= coord.pp < pp and 0 <= coord.dp < dp and 0 <= coord.tp < tp):
        raise ValueError(f"{coord} out of range for tp={tp}, pp={pp}, dp={dp}")
    return (coord.pp * dp + coord.dp) * tp + coord.tp


def dp_group_ranks(coord: GridCoord, tp: int, pp: int, dp: int) -> list[int]:
    """Logical ranks of the DP group of ``coord`` (same pp, tp), ordered by dp index."""
    return [rank_of(GridCoord(coord.pp, d, coord.tp), tp, pp, dp) for d in range(dp)]


def pp_group_ranks(coord: GridCoord, tp: int, pp: int, dp: int) -> list[int]:
    """Logical ranks of the pipeline of ``coord`` (same dp, tp), ordered by stage."""
    return [rank_of(GridCoord(p, coord.dp, coord.tp), tp, pp, dp) for p in range(pp)]


def tp_group_ranks(coord: GridCoord, tp: int, pp: int, dp: int) -> list[int]:
    """Logical ranks of the TP group of ``coord`` (same pp, dp), ordered by tp index."""
    return [rank_of(GridCoord(coord.pp, coord.dp, t), tp, pp, dp) for t in range(tp)]


def all_dp_groups(tp: int, pp: int, dp: int) -> list[list[int]]:
    """Every DP group of the grid, in (pp, tp) order. torch's ``new_group`` must be called by every rank
    for every group in the same order; this is that order."""
    return [dp_group_ranks(GridCoord(p, 0, t), tp, pp, dp) for p in range(pp) for t in range(tp)]


def all_pp_groups(tp: int, pp: int, dp: int) -> list[list[int]]:
    """Every pipeline group of the grid, in (dp, tp) order."""
    return [pp_group_ranks(GridCoord(0, d, t), tp, pp, dp) for d in range(dp) for t in range(tp)]


def all_tp_groups(tp: int, pp: int, dp: int) -> list[list[int]]:
    """Every TP group of the grid, in (pp, dp) order."""
    return [tp_group_ranks(GridCoord(p, d, 0), tp, pp, dp) for p in range(pp) for d in range(dp)]


# --- failure domains and replica placement ----------------------------------------------------------------
#
# docs/design.md section 5. A failure-domain model maps every node name to its domain names per level, most
# specific first, e.g. ``{"node": "nid00001", "switch": "s0", "group": "g0"}``. The caller builds it (from
# ``scontrol show topology`` text, from each task's ``SLURM_TOPOLOGY_ADDR``, or from a site-profile rule);
# the functions below only parse text they are given and never read the machine.

import dataclasses as _dc  # noqa: E402  (kept with the section that uses it)
from collections.abc import Mapping as _Mapping, Sequence as _Sequence  # noqa: E402

from phoenix_hpc.errors import ReplicationError  # noqa: E402

DomainMap = _Mapping[str, _Mapping[str, str]]
"""node name -> {level name -> domain name at that level}; the ``node`` level may be omitted (it is the
node name itself)."""

DEFAULT_SWITCH_LEVELS = ("switch", "group")
"""Level names given to switch tiers, leaf tier first, when a parser is not told otherwise: on a two-tier
tree the leaf switch is ``switch`` and the tier above it ``group`` (a dragonfly group on Perlmutter, a spine
on Vista's fat tree). Deeper tiers are named ``tier2``, ``tier3``, ..."""


def switch_levels_of(levels: _Sequence[str]) -> tuple[str, ...]:
    """The switch-tier names of a site's failure-domain ``levels`` (most specific first, ``node`` left out),
    for naming the tiers of ``SLURM_TOPOLOGY_ADDR`` / ``scontrol show topology``; the defaults
    (:data:`DEFAULT_SWITCH_LEVELS`) when ``levels`` names no switch tier. Pure."""
    tiers = tuple(lv for lv in levels if lv != "node")
    return tiers or DEFAULT_SWITCH_LEVELS


def _switch_level_names(n: int, names: _Sequence[str]) -> list[str]:
    return [names[i] if i < len(names) else f"tier{i}" for i in range(n)]


def parse_topology_addr(
    addr: str, pattern: str, switch_levels: _Sequence[str] = DEFAULT_SWITCH_LEVELS
) -> dict[str, str]:
    """Failure domains of one node from ``SLURM_TOPOLOGY_ADDR`` and ``SLURM_TOPOLOGY_ADDR_PATTERN``.

    Slurm (topology/tree, srun(1) "OUTPUT ENVIRONMENT VARIABLES") sets ``SLURM_TOPOLOGY_ADDR`` to the
    dot-separated names of the switches from the top of the tree down to the leaf, ending with the node
    name, and ``SLURM_TOPOLOGY_ADDR_PATTERN`` to the matching component kinds, e.g. ``switch.switch.node``.
    Without a tree topology both are just the node name and ``node``.

    Returns ``{"node": <node>, <leaf tier name>: <leaf switch>, <next tier name>: ...}``; tier names come
    from ``switch_levels`` leaf first (default :data:`DEFAULT_SWITCH_LEVELS`).

    Raises:
        ReplicationError: the two strings have different numbers of components, the pattern's last
            component is not ``node``, or a component is empty.
    """
    parts, kinds = addr.strip().split("."), pattern.strip().split(".")
    if len(parts) != len(kinds) or kinds[-1] != "node" or any(not p for p in parts):
        raise ReplicationError(
            f"cannot parse SLURM_TOPOLOGY_ADDR={addr!r} with SLURM_TOPOLOGY_ADDR_PATTERN={pattern!r}: "
            "expected the same number of dot-separated components, the last one of kind 'node'"
        )
    switches = [p for p, k in zip(parts[:-1], kinds[:-1])][::-1]  # leaf first
    out = {"node": parts[-1]}
    out.update(zip(_switch_level_names(len(switches), switch_levels), switches))
    return out


def parse_scontrol_topology(
    text: str, switch_levels: _Sequence[str] = DEFAULT_SWITCH_LEVELS
) -> dict[str, dict[str, str]]:
    """Failure domains of every node from the text of ``scontrol show topology``.

    Each line describes a switch, e.g. ``SwitchName=s0 Level=0 LinkSpeed=1 Nodes=nid[00001-00003]``; a
    switch of level L contains the nodes listed on its line (Slurm lists, for upper tiers too, every node
    below them). Level L is named ``switch_levels[L]``. Node host lists are expanded with python-hostlist.

    Returns node name -> ``{"node": name, <level name>: switch name, ...}``. Raises ReplicationError on a
    line without ``SwitchName``/``Level`` or with a host list that cannot be expanded.
    """
    import hostlist

    out: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if not fields:
            continue
        try:
            name, level = fields["SwitchName"], int(fields["Level"])
            nodes = hostlist.expand_hostlist(fields["Nodes"]) if fields.get("Nodes") else []
        except (KeyError, ValueError, hostlist.BadHostlist) as e:
            raise ReplicationError(f"cannot parse 'scontrol show topology' line {line.strip()!r}: {e}") from e
        level_name = _switch_level_names(level + 1, switch_levels)[level]
        for node in nodes:
            out.setdefault(node, {"node": node})[level_name] = name
    return out


def node_of_rank_blocked(node_names: _Sequence[str], ranks_per_node: int) -> list[str]:
    """Node name of every logical rank when ranks fill nodes in order, ``ranks_per_node`` per node (what a
    block-distributed ``srun --ntasks-per-node=G`` over ``node_names`` gives at generation 0)."""
    if ranks_per_node < 1:
        raise ValueError(f"ranks_per_node must be >= 1, got {ranks_per_node}")
    return [n for n in node_names for _ in range(ranks_per_node)]


@_dc.dataclass(frozen=True, order=True)
class ReplicaPlacement:
    """One replica: ``holder_rank`` keeps a copy of the optimizer shard ``shard_id`` owned by
    ``owner_rank`` (logical ranks of the generation the placement was made for). ``index`` is the
    replica's number (0..k-1) for that shard; ``distinct_at`` is the most general level at which the holder
    is in a different domain than the owner and than the holders chosen before it."""

    shard_id: str
    index: int
    owner_rank: int
    holder_rank: int
    owner_node: str
    holder_node: str
    distinct_at: str


@_dc.dataclass(frozen=True)
class Placement:
    """A full replica placement: ``replicas`` in (shard, index) order and human-readable ``warnings``
    (empty when every shard's holders are spread at the most general requested level)."""

    k: int
    levels: tuple[str, ...]
    replicas: tuple[ReplicaPlacement, ...]
    warnings: tuple[str, ...]

    def holders_of(self, owner_rank: int) -> list[ReplicaPlacement]:
        """Replicas of the shard owned by ``owner_rank``, by index."""
        return [r for r in self.replicas if r.owner_rank == owner_rank]

    def held_by(self, holder_rank: int) -> list[ReplicaPlacement]:
        """Replicas that ``holder_rank`` keeps for others, in shard order."""
        return [r for r in self.replicas if r.holder_rank == holder_rank]

    def holders_by_shard(self) -> dict[str, list[int]]:
        """Shard id -> logical ranks of its holders, by replica index."""
        out: dict[str, list[int]] = {}
        for r in self.replicas:
            out.setdefault(r.shard_id, []).append(r.holder_rank)
        return out

    def load(self) -> dict[int, int]:
        """Number of replicas each logical rank holds (every rank of the grid appears, possibly with 0)."""
        ranks = {r.owner_rank for r in self.replicas} | {r.holder_rank for r in self.replicas}
        counts = dict.fromkeys(sorted(ranks), 0)
        for r in self.replicas:
            counts[r.holder_rank] += 1
        return counts


def _domain_key(node: str, level_idx: int, levels: _Sequence[str], domains: DomainMap | None) -> tuple:
    """Identity of ``node``'s domain at ``levels[level_idx]``: the domain names from that level up to the
    most general one (so equal switch names under different groups stay distinct)."""
    key = []
    for lv in levels[level_idx:]:
        if lv == "node":
            key.append(node)
            continue
        name = (domains or {}).get(node, {}).get(lv)
        if name is None:
            raise ReplicationError(
                f"no '{lv}' failure domain known for node {node!r}; placement_levels asks for {list(levels)} "
                "(give the site's topology, or drop the level)"
            )
        key.append(name)
    return tuple(key)


def place_replicas(
    tp: int,
    pp: int,
    dp: int,
    k: int,
    node_of_rank: _Sequence[str],
    domains: DomainMap | None = None,
    levels: _Sequence[str] = ("node", "switch"),
    beyond_dp: bool = False,
) -> Placement:
    """Choose ``k`` holders for every optimizer shard (docs/design.md section 5).

    For the shard of ``(pp, tp, dp=i)`` (logical id ``opt/pp{pp}/tp{tp}/dp{i}``) the candidates are its DP
    peers ``(pp, tp, dp=j), j != i`` not on the owner's node, in DP-ring order ``i+1, i+2, ...`` (mod dp).
    Holders are picked one at a time (greedy); each pick prefers, in this order: a candidate holding fewer
    than ``2k`` replicas so far (a memory bound: host memory grows with the replicas held); one in a
    different domain from the owner and from the holders already picked at the most general level possible
    (``levels`` runs from most specific, ``node``, to most general, e.g. ``group``); one holding fewer
    than ``k``; the nearest on the ring. With no domain constraint this is the plain ring: shard i goes to
    i+1..i+k and every rank holds exactly k. With constraints, a rank holds at most ``2k`` replicas unless
    the nodes leave no other choice; :meth:`Placement.load` gives the per-rank count.

    Args:
        tp, pp, dp: grid sizes (logical ranks in Megatron order, see :func:`rank_of`).
        k: replicas per shard (>= 1).
        node_of_rank: node name of every logical rank (length ``tp*pp*dp``).
        domains: failure-domain model (:data:`DomainMap`) covering every level of ``levels`` other than
            ``node`` for every node; may be ``None`` when ``levels == ("node",)``.
        levels: failure-domain levels, most specific first; must start with ``node``.
        beyond_dp: where a shard's DP peers on other nodes span fewer than ``k`` nodes, take the other ranks
            of the grid as further candidates (ring order from the owner) instead of raising. Used for the grid
            left by a shrink (docs/design.md section 6), where dp may be below ``k + 1``; a new job's grid is
            held to ``k < dp`` at submit.

    Returns:
        A :class:`Placement`; its ``warnings`` say, per most-general-level reached, how many shards could
        not get k holders in distinct domains at the most general level (with example shard ids).

    Raises:
        ReplicationError: ``k < 1``; ``levels`` does not start with ``node``; a node lacks a requested
            domain level; or a shard's DP peers on other nodes span fewer than ``k`` distinct nodes
            (e.g. ``k >= dp``, or all DP peers on the owner's node as with tp=1 and dp <= GPUs per node).
    """
    levels = tuple(levels)
    n = world_size_of(tp, pp, dp)
    if not isinstance(k, int) or k < 1:
        raise ReplicationError(f"resilience.k must be an int >= 1, got {k!r}")
    if not levels or levels[0] != "node" or len(set(levels)) != len(levels):
        raise ReplicationError(
            f"resilience.placement_levels must start with 'node' (most specific first) and have no "
            f"repeats, got {list(levels)}"
        )
    if len(node_of_rank) != n:
        raise ReplicationError(f"node_of_rank has {len(node_of_rank)} entries, the grid has {n} ranks")
    top = len(levels) - 1
    keys = {
        r: tuple(_domain_key(node_of_rank[r], li, levels, domains) for li in range(len(levels)))
        for r in range(n)
    }
    load = dict.fromkeys(range(n), 0)
    replicas: list[ReplicaPlacement] = []
    shortfall: dict[str, list[str]] = {}
    for p in range(pp):
        for t in range(tp):
            group = [rank_of(GridCoord(p, j, t), tp, pp, dp) for j in range(dp)]  # DP group, ring order
            group_nodes = {node_of_rank[r] for r in group}
            for i in range(dp):
                owner = group[i]
                shard = GridCoord(p, i, t).shard_prefix()
                ring = group[i + 1:] + group[:i]  # DP peers i+1, i+2, ... (mod dp)
                if len(group_nodes) - 1 < k and beyond_dp:  # then the other stages' ranks, in ring order
                    in_group = set(group)
                    ring += [r for r in list(range(owner + 1, n)) + list(range(owner)) if r not in in_group]
                    group_nodes = {node_of_rank[r] for r in ring} | {node_of_rank[owner]}
                if len(group_nodes) - 1 < k:  # the DP peers on other nodes span too few nodes
                    other_nodes = group_nodes - {node_of_rank[owner]}
                    raise ReplicationError(
                        f"shard {shard} (rank {owner} on node {node_of_rank[owner]}) cannot get k={k} replicas "
                        f"on distinct nodes: its {dp - 1} DP peers are on {len(other_nodes)} other node(s) "
                        f"{sorted(other_nodes)}; lower resilience.k, raise dp, or spread DP peers over "
                        "more nodes (e.g. tp>1 so that a node holds one rank per DP group)"
                    )
                chosen: list[int] = []
                worst = top
                for idx in range(k):
                    best = None
                    cands = (r for r in ring if keys[r][0] != keys[owner][0])  # peers not on the owner's node
                    for dist, c in enumerate(cands):
                        if c in chosen:
                            continue
                        taken = [keys[owner]] + [keys[h] for h in chosen]
                        # most general level where c differs from the owner and every chosen holder
                        lvl = max(
                            (li for li in range(len(levels)) if all(keys[c][li] != tk[li] for tk in taken)),
                            default=-1,
                        )
                        if lvl < 0:
                            continue  # same node as a chosen holder
                        score = (load[c] < 2 * k, lvl, load[c] < k, -dist)
                        if best is None or score > best[0]:
                            best = (score, c)
                        if score[:3] == (True, top, True):
                            break  # no later candidate can beat it: they differ only by a larger ring distance
                    assert best is not None  # guaranteed by the distinct-node count check above
                    (_, lvl, _, _), holder = best
                    worst = min(worst, lvl)
                    chosen.append(holder)
                    load[holder] += 1
                    replicas.append(
                        ReplicaPlacement(
                            shard_id=shard,
                            index=idx,
                            owner_rank=owner,
                            holder_rank=holder,
                            owner_node=node_of_rank[owner],
                            holder_node=node_of_rank[holder],
                            distinct_at=levels[lvl],
                        )
                    )
                if worst < top:
                    shortfall.setdefault(levels[worst], []).append(shard)
    warnings = []
    for lv, shards in sorted(shortfall.items(), key=lambda x: levels.index(x[0])):
        ex = ", ".join(shards[:3]) + (", ..." if len(shards) > 3 else "")
        warnings.append(
            f"{len(shards)} of {pp * tp * dp} shards cannot have the owner and its k={k} replica(s) in distinct "
            f"'{levels[top]}' domains; they are distinct only down to '{lv}' ({ex}); a single '{levels[top]}' "
            "failure can lose such a shard"
        )
    return Placement(k=k, levels=levels, replicas=tuple(replicas), warnings=tuple(warnings))


def covered_levels(levels: _Sequence[str], nodes: _Sequence[str], domains: DomainMap | None) -> tuple[str, ...]:
    """The levels of ``levels`` that the failure-domain model ``domains`` names for every node of ``nodes``,
    in order; ``node`` is always covered. A level some node lacks (no ``SLURM_TOPOLOGY_ADDR`` there, a
    site without that tier) is dropped, so the placement spreads replicas over the levels known everywhere."""
    return tuple(lv for lv in levels
                 if lv == "node" or all((domains or {}).get(n, {}).get(lv) is not None for n in nodes))


def generation_placement(
    grid: "Grid",
    k: int,
    node_of_rank: _Sequence[str],
    domains: DomainMap | None = None,
    levels: _Sequence[str] = ("node",),
    beyond_dp: bool = False,
) -> Placement:
    """The replica placement of one generation (docs/design.md section 5): :func:`place_replicas` over the
    node of every logical rank, at the levels of ``levels`` that ``domains`` covers (:func:`covered_levels`).
    The one place a placement is computed: the ranks' protector (every generation), the submit-time
    feasibility check (generation 0, node level) and ``phoenix status`` (generation 0) all call it.

    Args:
        grid: ``(tp, pp, dp)``.
        k: replicas per shard (>= 1).
        node_of_rank: node name of every logical rank (length ``tp*pp*dp``).
        domains: failure-domain model (:data:`DomainMap`), or ``None`` (node level only).
        levels: requested failure-domain levels, most specific first, starting with ``node``.
        beyond_dp: as :func:`place_replicas` (True for a grid a shrink made smaller than the job's first).

    Returns:
        A :class:`Placement`; ``Placement.levels`` are the levels used (compare with ``levels`` to tell
        which were dropped).

    Raises:
        ReplicationError: as :func:`place_replicas`.
    """
    tp, pp, dp = grid
    return place_replicas(tp, pp, dp, k, node_of_rank, domains, covered_levels(levels, node_of_rank, domains),
                          beyond_dp=beyond_dp)
