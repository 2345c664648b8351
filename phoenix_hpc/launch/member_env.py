"""What a member of the job's generations is given and keeps (:class:`MemberEnv`, :class:`RecoveryRecord`),
and the per-generation pieces it builds from them: the MPI communicator (:func:`make_comm`), the abort of a
generation's communicators (:func:`generation_abort`), the landing notice of an injected fault
(:func:`fired_notice`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

COMM_TAG_BASE = 7000  # Create_group tag of generation g: COMM_TAG_BASE + g


def make_comm(world_comm, members_world: list[int], generation: int, tag_base: int = 0):
    """The MPI communicator of a generation: ``Create_group`` over ``members_world`` (world ranks in
    logical-rank order, so the new communicator's rank of a member is its logical rank). Collective over
    the members only (MPI-3 ``MPI_Comm_create_group``); dead world ranks are not involved. Its error
    handler is ``MPI.ERRORS_RETURN`` (:func:`phoenix_hpc.runtime.mpi_faults.errors_return`). ``tag_base``:
    another tag range for a second communicator of the same generation (a shrink's exchange)."""
    from phoenix_hpc.runtime.mpi_faults import errors_return

    group = world_comm.Get_group().Incl(list(members_world))
    try:  # errors returned, not fatal: a member may die while the communicator is in use
        return errors_return(world_comm.Create_group(group, tag=(tag_base or COMM_TAG_BASE) + generation))
    finally:
        group.Free()


def quiesce_watchdog(client, on_quiesce, world_rank: int):
    from phoenix_hpc.launch.quiesce_watch import QuiesceWatchdog

    return QuiesceWatchdog(client, on_quiesce, name=f"phoenix-quiesce-{world_rank}")


def generation_abort(backend: str, generation: int, sockets: dict[int, str], groups):
    """The :class:`phoenix_hpc.launch.abort.GenerationAbort` of a generation: the gloo sockets captured
    while its groups were built, and (NCCL) its groups, aborted besides those torch has registered."""
    from phoenix_hpc.launch.abort import GenerationAbort

    pgs = () if backend != "nccl" or groups is None else tuple(
        g for g in (groups.world, groups.dp, groups.pp, groups.tp) if g is not None)
    return GenerationAbort(backend, generation, dict(sockets) if backend != "nccl" else {}, pgs)


@dataclass
class MemberEnv:
    """What a member needs that does not change across generations.

    ``nodes``: node name of every world rank; ``domains``: failure-domain model (node -> {level: name});
    ``store``: a client of the coordinator's TCPStore; ``client``/``progress``: the slot's coordinator
    attachment; ``grid``: :class:`phoenix_hpc.launch.groups.Grid`; ``levels``: the failure-domain levels
    replicas are spread over (``resilience.placement_levels`` restricted to those ``domains`` covers).
    """

    cfg: Any
    run_dir: Path
    world_comm: Any
    world_rank: int
    client: Any
    progress: Any
    store: Any
    nodes: list[str]
    domains: dict[str, dict[str, str]]
    grid: Any
    backend: str
    device: Any
    levels: tuple[str, ...] = ("node",)
    log: Callable[[str], None] = print
    instruction_timeout_s: float = 0.0  # 0: derived from the resilience timeouts
    # the slot's quiesce watchdog when the entry point made it at registration (listening since then), else
    # the member makes one
    watchdog: Any = None


@dataclass
class RecoveryRecord:
    """One recovery as this member saw it (seconds)."""

    generation: int
    recoverable_step: int
    live_step: int | None
    dirty: bool
    rolled_back: bool
    timings: dict[str, float] = field(default_factory=dict)
    detail: dict[str, float] = field(default_factory=dict)
    path: str = "rebind"  # the recovery path that ran: rebind | rebuild


def fired_notice(client, run_dir, world_rank: int) -> Callable[[Any, int, str], None]:
    """The ``notify`` of this slot's :class:`~phoenix_hpc.faults.trigger.FaultTrigger`: the landing record
    (:class:`~phoenix_hpc.faults.trigger.FiredFile`, durable before the effect), then an ``inject_fired``
    message to the coordinator, which journals the landing (best effort: the file is what counts)."""
    from phoenix_hpc.faults.trigger import FiredFile

    record = FiredFile(run_dir, world_rank)

    def notify(inj, step: int, phase: str) -> None:
        record(inj, step, phase)
        try:
            client.send({"type": "inject_fired", "world_rank": int(world_rank), "pid": client.pid,
                         "request_id": inj.request_id, "step": int(step), "phase": phase})
        except Exception:  # noqa: BLE001 -- the coordinator also finds the landing record
            pass

    return notify
