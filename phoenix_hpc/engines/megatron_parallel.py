"""megatron-core's global parallel state for one generation: build it, read this rank's groups, tear it down.

The Megatron engine owns its groups (:attr:`phoenix_hpc.engines.base.Engine.owns_groups`): the launcher
initialises only the generation's default group, and :func:`init_parallel_state` has megatron-core create
the tp/pp/dp (and embedding, model-parallel, ...) groups on it, so no group exists twice. Every group it
creates gets ``resilience.collective_timeout_s`` (``initialize_model_parallel(distributed_timeout_minutes=
timeout_s / 60)``: megatron-core passes ``timedelta(minutes=...)`` to each ``new_group``), and no gloo
copies of the DP groups are made (``create_gloo_process_groups=False``; the engine passes
``use_gloo_process_groups=False`` to the optimizer, which then never asks for them). Works on any
backend, gloo on CPU included (the unit tests use it).
"""

from __future__ import annotations

from phoenix_hpc.engines.base import GridCoord, ProcessGroups


def parallel_state():
    """``megatron.core.parallel_state``, imported without megatron-core's "no Transformer Engine / Apex"
    warnings."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core import parallel_state as ps
    return ps


def init_parallel_state(tp: int, pp: int, timeout_s: float) -> None:
    """``initialize_model_parallel`` on the already initialised default group, Megatron's rank order
    ``tp-cp-ep-dp-pp`` (tp fastest, then dp, then pp: :mod:`phoenix_hpc.topology`'s order), every group with
    a ``timeout_s`` timeout, no gloo DP groups.

    Raises:
        RuntimeError: parallel state is already initialised (tear the previous generation down first with
            :func:`destroy_parallel_state`).
    """
    ps = parallel_state()
    if ps.model_parallel_is_initialized():
        raise RuntimeError("megatron-core parallel state is already initialised; destroy_parallel_state() first")
    ps.initialize_model_parallel(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, distributed_timeout_minutes=timeout_s / 60.0,
        create_gloo_process_groups=False, order="tp-cp-ep-dp-pp",
    )


def groups_and_coord(world, generation: int) -> tuple[ProcessGroups, GridCoord]:
    """This rank's groups (``world`` as given, dp/pp/tp from megatron-core) and grid coordinate."""
    ps = parallel_state()
    groups = ProcessGroups(
        world=world, dp=ps.get_data_parallel_group(), pp=ps.get_pipeline_model_parallel_group(),
        tp=ps.get_tensor_model_parallel_group(), generation=generation,
    )
    coord = GridCoord(
        pp=ps.get_pipeline_model_parallel_rank(), dp=ps.get_data_parallel_rank(), tp=ps.get_tensor_model_parallel_rank()
    )
    return groups, coord


def created_groups() -> list:
    """Every process group megatron-core created for this rank in :func:`init_parallel_state` (its
    ``_global_process_group_list``, the list its own ``update_pg_timeout`` walks; the default group is left
    out): what an abort of the generation's communicators has to cover besides the default group. Empty
    when parallel state is not initialised."""
    ps = parallel_state()
    if not ps.model_parallel_is_initialized():
        return []
    return [g for g in (getattr(ps, "_global_process_group_list", None) or []) if g is not None]


def destroy_parallel_state() -> None:
    """``destroy_model_parallel()``: megatron-core forgets every group (no collective runs; the groups are
    freed once nothing else references them). Afterwards ``model_parallel_is_initialized()`` is False.
    Idempotent."""
    ps = parallel_state()
    ps.destroy_model_parallel()
