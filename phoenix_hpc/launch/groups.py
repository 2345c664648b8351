"""The grid of a generation and its torch process groups.

:func:`resolve_grid` (pure) turns ``parallelism`` and the number of active slots into ``(tp, pp, dp)``.
:func:`init_generation` initialises torch.distributed for one generation over a generation-prefixed store
(``PrefixStore(f"gen{g}", store)``, so members of an older generation can never join) and builds the
dp/pp/tp sub-groups, or, for an engine that creates them itself (``Engine.owns_groups``), only the world
group. torch requires every rank to call ``new_group`` for every group, in the same order
(torch.distributed.new_group docs); the order used is :func:`phoenix_hpc.topology.all_tp_groups`, then
``all_pp_groups``, then ``all_dp_groups``.
"""

from __future__ import annotations

from datetime import timedelta

from phoenix_hpc.engines.base import GridCoord, ProcessGroups
from phoenix_hpc.errors import ConfigError
from phoenix_hpc.topology import Grid, all_dp_groups, all_pp_groups, all_tp_groups, coord_of

__all__ = ["Grid", "init_generation", "resolve_grid"]  # Grid: the one grid type (phoenix_hpc.topology)


def resolve_grid(tp: int, pp: int, dp: int | None, active_slots: int) -> Grid:
    """The grid for ``active_slots`` ranks; ``dp`` None means ``active_slots / (tp * pp)``.

    Raises:
        ConfigError: the grid does not match the number of active slots, naming both.
    """
    if dp is None:
        if active_slots % (tp * pp):
            raise ConfigError(
                f"parallelism: {active_slots} active slots are not divisible by tp ({tp}) x pp ({pp}) = {tp * pp}"
            )
        dp = active_slots // (tp * pp)
    if tp * pp * dp != active_slots:
        raise ConfigError(
            f"parallelism: tp ({tp}) x pp ({pp}) x dp ({dp}) = {tp * pp * dp} does not match the "
            f"{active_slots} active slots (resources.nodes x tasks per node)"
        )
    return Grid(tp, pp, dp)


def init_generation(
    store,
    generation: int,
    rank: int,
    grid: Grid,
    backend: str,
    timeout_s: float,
    device_id=None,
    sub_groups: bool = True,
    prefix: str | None = None,
) -> tuple[ProcessGroups, GridCoord]:
    """``init_process_group`` for generation ``generation`` and build this rank's groups.

    Args:
        store: the job's control-plane store (a ``torch.distributed.Store``); wrapped in
            ``PrefixStore(f"gen{generation}", store)``.
        rank: logical rank in the generation; ``grid``: sizes; ``backend``: ``gloo`` or ``nccl``;
        timeout_s: timeout of every collective (``resilience.collective_timeout_s``).
        sub_groups: False for an engine that owns its groups: no ``new_group`` call, and the returned groups
            are ``ProcessGroups(world, None, None, None, generation)`` (the engine's constructor completes them).
        prefix: the store prefix of the rendezvous; None: ``gen{generation}``. Another one builds groups no
            member of a generation can join (:func:`phoenix_hpc.launch.final_megatron.store_prefix`).

    Returns:
        ``(groups, coord)`` of this rank.
    """
    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    kwargs = {"device_id": device_id} if device_id is not None else {}
    dist.init_process_group(
        backend,
        store=dist.PrefixStore(f"gen{generation}" if prefix is None else prefix, store),
        rank=rank,
        world_size=grid.world_size,
        timeout=timeout,
        **kwargs,
    )
    coord = coord_of(rank, grid.tp, grid.pp, grid.dp)
    if not sub_groups:
        return ProcessGroups(world=dist.group.WORLD, dp=None, pp=None, tp=None, generation=generation), coord
    mine = {}
    for kind, lists in (
        ("tp", all_tp_groups(grid.tp, grid.pp, grid.dp)),
        ("pp", all_pp_groups(grid.tp, grid.pp, grid.dp)),
        ("dp", all_dp_groups(grid.tp, grid.pp, grid.dp)),
    ):
        for ranks in lists:
            g = dist.new_group(ranks, timeout=timeout)
            if rank in ranks:
                mine[kind] = g
    groups = ProcessGroups(world=dist.group.WORLD, dp=mine["dp"], pp=mine["pp"], tp=mine["tp"], generation=generation)
    return groups, coord
