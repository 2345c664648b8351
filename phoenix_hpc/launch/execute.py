"""The rank side of a recovery (docs/design.md section 6, steps 1-7) and the protected training driver.

One :class:`Member` per active slot (and per standby slot once it joins). It owns, for the current
generation ``g``: the torch process groups (``PrefixStore(f"gen{g}")`` on the coordinator's store, explicit
``resilience.collective_timeout_s`` on every group), the MPI communicator of the members
(``COMM_WORLD.Create_group`` over the live members in logical-rank order, so communicator rank == logical
rank), the engine, and the runtime's :class:`~phoenix_hpc.runtime.protector.Protector`.

Training (:meth:`Member.run`) is :func:`phoenix_hpc.launch.loop.train` with a phase hook that, at the start
of every iteration, polls the coordinator (``quiesce`` / ``stop`` instructions, ``inject`` requests) and at
every phase fires due injections (:class:`~phoenix_hpc.faults.trigger.FaultTrigger`). After each commit the
member reports its shard's committed step and the steps of the replicas it holds (``commit``).

A recovery starts either with an error inside the step (a gloo collective that failed or timed out because
a peer died, a commit that timed out, an injected fault: reported as ``fault``, then the member waits for
the coordinator's ``quiesce``) or with a ``quiesce`` received at a step boundary. Then:

1. *quiesce*: the partial step is abandoned, the torch process groups of ``g`` are destroyed at once
   (:meth:`Member.release_groups`: a member still blocked in a collective with this one fails with a closed
   connection instead of waiting for ``collective_timeout_s``), the protector is closed without waiting on
   peers (its buffers stay readable), and the member answers ``quiesced`` with its live step (optimizer steps fully applied),
   the steps of the verified copies of its shard and of the replicas it holds (committed and previous
   ping-pong buffer, committed first; every held replica is verified again first and one that fails is
   left out and listed in ``rejected``), and ``dirty`` when the error hit inside
   ``optimizer_step`` (an update partially applied: only the committed snapshot may be used, I4);
2. *plan*: it waits for ``recover`` {plan} (:class:`phoenix_hpc.recovery.plan.RecoveryPlan` JSON);
3. *reconfigure*: ``destroy_process_group`` and :func:`phoenix_hpc.launch.groups.init_generation` for
   ``g + 1`` with the plan's rank map, and the new MPI communicator (``Create_group`` involves only the
   members of the group, never a dead rank; the spare's world rank joins it);
4. *roll back*: a survivor whose live step is past the recoverable step ``R`` (or that is dirty) loads
   S(R) from its committed local snapshot (checksums verified): optimizer shard, parameters, envelope (step,
   data position, LR schedule, RNG);
5. *restore the spare* (the plan's transfers, :mod:`phoenix_hpc.launch.transfers`: a rank's transfers with
   one peer in plan order, with different peers at once, while it rolls back (step 4), builds its engine
   (a joining spare) or does steps 3''-4' (rebuild path), :func:`~phoenix_hpc.launch.transfers.sources_ready`
   permitting): parameters from a live DP peer at the same (pp, tp), the param part of its local snapshot
   of R (a checksum per tensor; sealed from its engine when it has none), and optimizer shard + envelope
   as the holder's replica buffer of step R, both sent over the new MPI communicator as H2H sends a
   replica (:class:`phoenix_hpc.runtime.h2h.BufferTransfer`: windowed chunks, tags under ``MPI_TAG_UB``)
   and verified (CRC-32 of every tensor) by the receiver before use; the copies of R come from this
   generation's protector or, before its first commit fence, from the kept protectors of earlier
   generations (:meth:`Member._copy_sources`);
6. *re-establish replication*: a new protector for ``g + 1`` (placement recomputed from the new node list
   with :func:`phoenix_hpc.topology.generation_placement`);
7. it answers ``recovered`` {MemberReport, timings {reconfigure, params, optimizer} in seconds}, waits for
   ``resume`` and continues training from step ``R``. The report is evidence for the coordinator's checks
   (:meth:`Member._evidence`): the hashes of its restored optimizer and param shard and the replicas its
   previous protector holds, verified again; plus the holders its new protector sends to.

A standby slot named in a plan's ``joins`` does steps 3, 5, 6, 7 with a freshly built engine
(:meth:`Member.join`).

Steps 3 and 4 above are the ``rebind`` recovery path: a survivor keeps its engine and gives it the new
groups (:meth:`Engine.rebind`). On the ``rebuild`` path (``resilience.recovery_path``, default the engine's
own style; an engine with global state, such as megatron-core's ``parallel_state``, supports only this one)
every member of the new generation, survivors and joining spares together, builds the generation anew:

3'. a survivor first takes its own host copy of S(R): the committed local snapshot of R from its old
   protector when its live step is past R or it is dirty, else (live step R, clean) a copy of its live
   state (param shard, optimizer shard, envelope) to host memory; then it ends its engine
   (:meth:`Engine.teardown`: no object or global state of the old generation is left);
3''. every member builds the generation's groups (only the world group when the engine owns its groups,
   ``Engine.owns_groups``; the engine's constructor creates dp/pp/tp and the member uses ``engine.groups``)
   and constructs a new engine, in lockstep: every collective of construction is entered by every member
   in the same order;
4'. a survivor loads its host copy of S(R) into the new engine; a spare is restored by the transfers of
   step 5 as on the ``rebind`` path, which run meanwhile (a survivor sends the param part of its local
   snapshot of R, or, without one, seals the parameters from its new engine once that is at S(R)).

A ``checkpoint_restart`` plan takes the same steps 3' (without the host copy) and 3'', then loads the
checkpoint. :attr:`RecoveryRecord.path` (also in ``rank{r}.json`` and the rank's log line) says which path
ran.

A plan with ``action == "checkpoint_restart"`` (memory replicas could not cover the loss) replaces steps 4
and 5: every member of the new generation loads the persistent checkpoint of the plan's recoverable step
(:func:`phoenix_hpc.launch.persist.restore_step`, collective over the new world group).
"""

from __future__ import annotations

import gc
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from phoenix_hpc.errors import ConfigError, RecoveryError, ReplicationError
from phoenix_hpc.launch.interrupt import ComputeInterrupt
from phoenix_hpc.launch.transfers import run as run_transfers
from phoenix_hpc.recovery.plan import RecoveryPlan

COMM_TAG_BASE = 7000  # Create_group tag of generation g: COMM_TAG_BASE + g


class QuiesceRequested(Exception):
    """The coordinator asked this member to stop at the step boundary (``msg`` is the ``quiesce`` body)."""

    def __init__(self, msg: dict[str, Any]):
        super().__init__(f"quiesce for generation {msg.get('generation')}")
        self.msg = msg


class RestoreInterrupted(Exception):
    """The coordinator re-planned the recovery this member is applying: a member of the plan was lost before
    every member answered ``recovered`` (``msg``: the newer ``quiesce``). Raised where the member waits on the
    others (``at``): at the arrival barrier (:meth:`Member._arrive_all`, ``"barrier"``), where nothing of the
    new generation exists yet and a survivor's engine on the rebind path is untouched; in its transfers
    (:func:`phoenix_hpc.launch.transfers.run`, ``"transfers"``), whose requests are then abandoned; at its new
    protector's arrival (:meth:`Member._build_protector`, ``"protector"``), before any of its buffers exist.
    The member answers the newer quiesce from the copies it quiesced with, which it still holds, and applies
    the next plan (docs/design.md section 6, "A loss in the restore phase")."""

    def __init__(self, msg: dict[str, Any], at: str = "barrier"):
        super().__init__(f"recovery re-planned as generation {msg.get('generation')}")
        self.msg = msg
        self.at = at


#: where a member was when its plan was cut short (:class:`RestoreInterrupted`), for its log line
CUT_AT = {"barrier": "waiting for the members of generation {g}",
          "transfers": "in its transfers of generation {g}",
          "protector": "waiting for the members of generation {g} to start protection",
          "groups": "waiting for the members of generation {g} to build their groups"}


#: how often the arrival barrier looks for a newer quiesce, seconds (at each doorbell ring; every FULL_POLL_S
#: it reads the coordinator's store even without one, as ``CoordinatorClient.wait_instruction`` does)
ARRIVE_CHECK_S = 0.05
FULL_POLL_S = 2.0


class LeftToStandby(RecoveryError):
    """A shrink removed this slot's DP replica: it sent what it held and is a standby slot again (the
    entry point waits for a recovery plan that names it, as a spare does)."""

    job_state = "standby"


class StopRequested(RecoveryError):
    """The coordinator told this slot to stop (job ended, clean stop, fallback, or this slot was fenced)."""

    def __init__(self, msg: dict[str, Any]):
        self.msg = msg
        self.job_state = msg.get("job_state")
        super().__init__(f"stopped by the coordinator: {msg.get('reason', 'no reason given')}")


def fault_kind_of(exc: BaseException) -> str | None:
    """The fault kind to report for an error raised inside the step, or None (the coordinator classifies
    the message). An injected fault anywhere in the cause chain gives its own kind; a replication error
    (H2H over MPI, commit timeout) is a communication error unless its text names something more specific
    (a checksum: silent corruption)."""
    from phoenix_hpc.control.classify import FaultKind, kind_from_exception
    from phoenix_hpc.faults.trigger import InjectedFault

    e: BaseException | None = exc
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, InjectedFault):
            return e.fault_kind
        e = e.__cause__ or e.__context__
        seen += 1
    if isinstance(exc, ReplicationError):
        k = kind_from_exception(type(exc).__name__, str(exc))
        return FaultKind.COMM_ERROR.value if k is FaultKind.UNKNOWN else k.value
    return None


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


def _quiesce_watchdog(client, on_quiesce, world_rank: int):
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


class Member:
    """This slot as a member of the job's generations. Build with :meth:`start` (active slot, generation
    0) or :meth:`join` (standby slot named in a plan)."""

    def __init__(self, env: MemberEnv):
        from phoenix_hpc.engines.styles import recovery_path_of_class
        from phoenix_hpc.engines.user_code import load_engine_class
        from phoenix_hpc.faults.trigger import FaultTrigger

        self.env = env
        self.dp0 = env.grid.dp  # the job's first dp (the entry point's grid); a shrink makes it smaller
        self.generation = 0
        self.rank_map: dict[int, int] = {}
        self.logical: int | None = None
        self.engine = None
        self.groups = None
        self.coord = None
        self.comm = None
        self.protector = None
        self.old_protector = None
        # closed protectors of earlier generations whose copies of the last recoverable step still serve a
        # recovery: kept until the current generation's first commit fence (no unprotected window)
        self.kept: list = []
        self._replay_until: tuple[int, int] | None = None  # (generation, step) to report reaching at once
        # rebuild path: (R, host copy of S(R), rolled, its host-copy and teardown seconds) of a survivor whose
        # plan was cut short at the arrival barrier after its engine ended (RestoreInterrupted); the next plan
        # loads it
        self._held_copy: tuple[int, Any, bool, dict[str, float]] | None = None
        self.phase: str | None = None
        self.recoveries: list[RecoveryRecord] = []
        self._gc_mark: float | None = None  # heap.PAUSES.total_s where the current recovery started (_mark_gc)
        self.trigger = FaultTrigger(env.client.injections, notify=fired_notice(env.client, env.run_dir, env.world_rank),
                                    on_link_down=[env.client.stop_heartbeat], lock=env.client.injections_lock,
                                    on_corrupt_replica=self._corrupt_replica)
        r = env.cfg.resilience
        self.wait_s = env.instruction_timeout_s or (
            2 * r.heartbeat_timeout_s + 2 * r.collective_timeout_s + 30.0)
        cls = load_engine_class(env.cfg.engine, env.cfg.python_path)
        try:  #: ``rebind`` or ``rebuild``: how this member takes part in every recovery (module doc)
            self.recovery_path = recovery_path_of_class(cls, r.recovery_path, env.cfg.engine)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.owns_groups = bool(cls.owns_groups)
        self.aborter = None  # launch.abort.GenerationAbort of the current generation
        self.interrupt = ComputeInterrupt()  # leaves the step's compute after the watchdog's abort
        # time.perf_counter() when the training thread left its last step, and of the interrupt in it (or None)
        self._left: tuple[float, float | None] | None = None
        self.watchdog = env.watchdog or _quiesce_watchdog(env.client, self._abort_on_quiesce, env.world_rank)
        self.watchdog.on_quiesce = self._abort_on_quiesce

    # --- generation set-up ---------------------------------------------------------------------------
    @property
    def n_ranks(self) -> int:
        return self.env.grid.world_size

    def _setup_groups(self) -> dict[str, float]:
        """Destroy the old torch groups, build this generation's groups and MPI communicator. Returns the
        seconds spent per part: ``arrive`` (waiting for the slowest member), ``torch``, ``mpi``."""
        import torch.distributed as dist

        from phoenix_hpc.launch.abort import SocketCapture
        from phoenix_hpc.launch.groups import init_generation

        e = self.env
        t = {}
        t0 = time.perf_counter()
        if dist.is_initialized():
            dist.destroy_process_group()
        if self.generation > 0:
            self._arrive_all()
        t1 = time.perf_counter()
        t["arrive"] = t1 - t0
        with SocketCapture() as cap:  # the gloo connections of this generation's groups (launch/abort.py)
            self.groups, self.coord = init_generation(
                self._store(), self.generation, self.logical, e.grid, e.backend, e.cfg.resilience.collective_timeout_s,
                device_id=e.device if e.backend == "nccl" else None, sub_groups=not self.owns_groups,
            )
        self.aborter = generation_abort(e.backend, self.generation, cap.sockets, self.groups)
        t2 = time.perf_counter()
        t["torch"] = t2 - t1
        # the old communicator may contain a dead rank: it is dropped, not freed (MPI_Comm_free is collective)
        self.comm = make_comm(e.world_comm, [self.rank_map[r] for r in range(self.n_ranks)], self.generation)
        t["mpi"] = time.perf_counter() - t2
        if self.generation > 0:  # counted for an injection in phase "restore" (:meth:`land_restore`)
            self._store().add(f"phoenix/gen{self.generation}/built", 1)
        return t

    def land_restore(self, step: int, poll_s: float = 0.01) -> None:
        """Where an injection for phase ``restore`` lands (judged at ``step``, :func:`recovery_step`): once every
        member of the generation built its groups and communicator (the store's ``built`` count, one add per
        member in :meth:`_setup_groups`). That this member's groups are built says only that every member
        started building theirs: a peer may still be inside ``MPI_Comm_create_group`` or gloo's connection
        set-up, blocking calls a fault of this member there would leave hanging (docs/design.md section 6).
        Without such an injection armed it returns at once. A newer quiesce meanwhile raises
        :class:`RestoreInterrupted` (``at="groups"``; the injection stays armed for the next plan); after
        ``wait_s`` it lands anyway, said in the log. Raises what :meth:`FaultTrigger.check` raises."""
        if not self.trigger.armed(step, "restore"):
            return
        n = self._await_count(f"phoenix/gen{self.generation}/built", "groups", poll_s)
        if n < self.n_ranks:
            self.env.log(f"[phoenix] rank {self.logical}: only {n} of {self.n_ranks} members built generation "
                         f"{self.generation}'s groups within {self.wait_s:g} s; the injected fault for phase "
                         "restore lands now")
        self.trigger.check(step, "restore")

    def release_groups(self) -> float:
        """Destroy this generation's torch process groups now, at the first sign of a recovery (an error
        in the step, or ``quiesce``), not only when the next generation is built. A member still blocked
        in a collective with this one then fails at once with a closed connection instead of waiting for
        ``resilience.collective_timeout_s``, and releases its own peers the same way, so the quiesce of
        every survivor is bounded by detection, not by the collective timeout. Every fault leads to a new
        generation (or the end of the job), so the old groups are never used again.

        gloo closes a group's connections only when the group is freed (``ProcessGroup.abort`` and
        ``shutdown`` leave them open on the gloo backend of torch 2.x), so the generation's communicators
        are first aborted (:class:`phoenix_hpc.launch.abort.GenerationAbort`: NCCL communicators are
        aborted, never destroyed; gloo connections are shut down, which fails their pending operations),
        then ``destroy_process_group`` drops torch's own references (a no-op after an NCCL abort, which
        unregisters the groups), the member and its engine drop theirs (:meth:`Engine.release_groups`) and a
        garbage collection frees cycles. Idempotent. Returns the seconds spent."""
        import gc

        import torch.distributed as dist

        t0 = time.perf_counter()
        if self.aborter is not None:  # NCCL: abort, never destroy; gloo: fail the pending operations
            self.aborter.abort("release")
        if self.groups is None and not dist.is_initialized():
            return 0.0
        if dist.is_initialized():
            dist.destroy_process_group()
        self.groups = None
        if self.engine is not None:
            self.engine.release_groups()
        gc.collect()
        return time.perf_counter() - t0

    def _arrive_all(self, poll_s: float = 0.01) -> None:
        """Wait until every member of the generation reached its rebuild (a counter on the coordinator's
        store). ``init_process_group`` would give up after ``collective_timeout_s``, which is meant to catch
        a hung peer during training, not a spare that is still reading its plan on a busy node."""
        key = f"phoenix/gen{self.generation}/arrived"
        self._store().add(key, 1)
        n = self._await_count(key, "barrier", poll_s)
        if n < self.n_ranks:
            raise RecoveryError(f"generation {self.generation}: only {n} of {self.n_ranks} members reached the "
                                f"rebuild within {self.wait_s:g} s")

    def _await_count(self, key: str, at: str, poll_s: float = 0.01) -> int:
        """Poll the store's counter ``key`` every ``poll_s`` s until it reaches :attr:`n_ranks` or ``wait_s``
        passed; returns its last value. Between polls it looks for a newer quiesce (:meth:`_restore_check`;
        raises :class:`RestoreInterrupted` with ``at``, StopRequested on a ``stop``)."""
        store, check = self._store(), self._restore_check(at)
        deadline = time.monotonic() + self.wait_s
        while (n := store.add(key, 0)) < self.n_ranks and time.monotonic() <= deadline:
            check()
            time.sleep(poll_s)
        return n

    def _restore_check(self, at: str) -> Callable[[], None]:
        """A check for the waits of the restore phase after the arrival barrier, which call it between their
        polls: at most every ARRIVE_CHECK_S it looks for a newer quiesce (:meth:`_take_newer_quiesce`) and
        raises :class:`RestoreInterrupted` (``at`` names the wait) when the coordinator queued one,
        StopRequested on a ``stop``."""
        due = [0.0]

        def check() -> None:
            now = time.monotonic()
            if now < due[0]:
                return
            due[0] = now + ARRIVE_CHECK_S
            newer = self._take_newer_quiesce()
            if newer is not None:
                raise RestoreInterrupted(newer, at)

        return check

    def _take_newer_quiesce(self) -> dict[str, Any] | None:
        """A ``quiesce`` of a generation after this member's that the coordinator queued, taken out of the
        instructions (other instructions stay, in order); None when there is none. The watchdog is disarmed
        in a recovery, so only this thread reads the instructions. Raises StopRequested on a ``stop``."""
        from phoenix_hpc.errors import ControlError

        now = time.monotonic()
        full = now >= getattr(self, "_next_full_pump", 0.0)  # every FULL_POLL_S also without a ring (one lost)
        if full:
            self._next_full_pump = now + FULL_POLL_S
        try:
            self.watchdog.pump(only_if_rung=not full)
        except ControlError:
            return None  # the coordinator watchdog ends the process if the coordinator is really gone
        c = self.env.client
        for msg in list(c.instructions):
            if msg["type"] == "stop":
                c.instructions.remove(msg)
                raise StopRequested(msg)
            if msg["type"] == "quiesce" and int(msg.get("generation", -1)) > int(self.generation):
                c.instructions.remove(msg)
                return msg
        return None

    def _store(self):
        """The coordinator's store for this generation's rendezvous: a new client when the slot rejoined a
        restarted coordinator since (:attr:`phoenix_hpc.control.client.CoordinatorClient.incarnation`; the old
        store died with the old process)."""
        e = self.env
        inc = getattr(e.client, "incarnation", 0)
        if inc != getattr(self, "_store_incarnation", 0):
            e.store = e.client.tcp_store()
            self._store_incarnation = inc
        return e.store

    def _build_protector(self, replan_ok: bool = False):
        """This generation's protector (new host buffers: the previous generation's keep the copies of the
        recoverable step until this generation's first commit fence, docs/design.md section 6). ``replan_ok``
        (a recovery that a re-plan may cut short): the wait for the last member to arrive looks for a newer
        quiesce and raises :class:`RestoreInterrupted` (``at="protector"``) before anything is allocated."""
        from phoenix_hpc.runtime.protector import Protector
        from phoenix_hpc.topology import generation_placement

        e, res = self.env, self.env.cfg.resilience
        g = e.grid
        node_of_rank = [e.nodes[self.rank_map[r]] for r in range(self.n_ranks)]
        placement = generation_placement(g, res.k, node_of_rank, e.domains, tuple(e.levels),
                                         beyond_dp=g.dp < self.dp0)  # a shrunk grid (docs/design.md section 6)
        if self.logical == 0:  # said once per generation: the allocation (or what is left of it) decides
            for w in placement.warnings:
                e.log(f"[phoenix] generation {self.generation}: replica placement: {w}")
        me = node_of_rank[self.logical]
        protector = Protector.create(
            engine=self.engine, comm=self.comm, placement=placement, logical_rank=self.logical,
            grid=g.to_json(), generation=self.generation, chunk_bytes=res.chunk_bytes,
            ranks_per_node=node_of_rank.count(me), commit_timeout_s=res.collective_timeout_s,
            on_commit=self._on_commit, log=e.log if self.logical == 0 else None, fault_hook=self._fault_hook,
            device=e.device, checksum=res.checksum, interval_cap=res.protect_every_max,
            thread_nice=res.thread_nice, checksum_threads=res.checksum_threads,
            d2h_copy_chunk_bytes=res.d2h_copy_chunk_bytes, d2h_copy_coalesce=res.d2h_copy_coalesce,
            # in a recovery every member is expected within the instruction timeout; at the start a member
            # may still load a large checkpoint
            arrive_timeout_s=self.wait_s if self.generation > 0 else None,
            arrive_check=self._restore_check("protector") if replan_ok and self.generation > 0 else None,
        )
        protector.abort_check = self._poll  # a quiesce also ends a commit wait on a peer that is gone
        return protector

    def start(self, restore: Callable[[Any], None] | None = None, start_step: int | None = None) -> None:
        """Generation 0 on an active slot (logical rank = world rank): groups, communicator, engine
        (``restore(engine)`` may load saved state), protector. Collective over the active slots.

        ``start_step``: the step the engine will hold after ``restore`` (0 for a new job), when known
        beforehand. Then the slot reads its instructions while the generation is built (the quiesce
        watchdog listens), so an ``inject`` sent as soon as the job runs is armed or refused at once,
        relative to that step, instead of after the set-up; the first training step takes over."""
        e = self.env
        if start_step is not None:
            e.client.started_step = int(start_step)
            e.client.last_step = int(e.cfg.training.steps)
            self.watchdog.listen()
        try:
            self._build_first_generation(restore)
        finally:
            self.watchdog.disarm()
        e.client.started_step = int(self.engine.step)  # also where a restore left it elsewhere than foreseen

    def _build_first_generation(self, restore: Callable[[Any], None] | None) -> None:
        e = self.env
        self.generation = 0
        self.rank_map = {r: r for r in range(self.n_ranks)}
        self.logical = e.world_rank
        self._setup_groups()
        self._construct_engine()
        if restore is not None:
            restore(self.engine)
        self.protector = self._build_protector()

    def _construct_engine(self, state_follows: bool = False) -> None:
        """Build this generation's engine on its groups (collective over the generation when the engine
        runs collectives in its constructor); take the engine's groups when it owns them. ``state_follows``:
        a recovery loads every parameter next (transfers, own S(R) or the checkpoint), so the engine may skip
        its random initialisation (:func:`phoenix_hpc.engines.factory.create_engine`)."""
        from phoenix_hpc.engines.factory import create_engine

        self.engine = create_engine(self.env.cfg, self.coord, self.groups, self.env.device,
                                    state_follows=state_follows)
        if self.owns_groups:
            self.groups = self.engine.groups

    def join(self, plan: dict[str, Any]) -> None:
        """A standby slot named in ``plan`` takes its logical rank: build the generation, restore, resume.
        When the coordinator re-plans before every member answered ``recovered`` (:class:`RestoreInterrupted`),
        the slot answers the newer quiesce with nothing to offer (its restore is redone in place: an engine it
        built meanwhile is ended, the next plan builds and loads it again) and applies the next plan."""
        self._mark_gc()
        # an injection armed on this standby slot for phase "recovery" lands here, before it reaches the new
        # generation (a spare lost while it joins); a fault it raises is reported as the plan's generation's
        self.env.progress.set(generation=plan.generation)
        self.trigger.check(plan.recovery_step(), "recovery")
        while True:
            quiesce, cut = None, None
            try:
                self._apply_plan(plan, dirty=False)
                return
            except RestoreInterrupted as ri:  # its message only: its traceback holds the cut plan's frames
                cut = RestoreInterrupted(ri.msg, ri.at)
            except QuiesceRequested as q:  # re-planned after it answered recovered: quiesce as a member
                quiesce = q.msg
            if cut is not None:  # outside the handler: the traceback's frames hold no groups then
                self.release_groups()
                if self.engine is not None:  # built after the barrier and partly loaded
                    self._teardown_engine()
                plan = self._answer_replan(cut, -1, {}, {}, False)
            if quiesce is not None:
                self.release_groups()  # outside the handler: the traceback's frames hold no groups then
                self._recover_through_replans(quiesce, failed=False)
                return

    def _host_copy_then_teardown(self, R: int, dirty: bool, copy: bool = True) -> tuple[Any, bool, dict[str, float]]:
        """Step 3' of the rebuild path and of a shrink: ``(S(R) in host memory as (optimizer shard, param shard,
        envelope), or None without ``copy``; rolled back; seconds {"host_copy", "teardown"})``, the engine
        ended. The copy is the committed local snapshot of ``R`` when the live step is past ``R`` or dirty,
        else the live state. A survivor whose engine ended already, for a plan cut short at the arrival
        barrier, takes the copy it kept then (its seconds count here), or the committed snapshot of ``R`` when
        the re-plan restores an earlier step. ``(None, False, {})`` for a member with neither (a joining
        spare). Raises ReplicationError when no copy of ``R`` is there."""
        if self.engine is None:
            kept, self._held_copy = self._held_copy, None
            if kept is None:
                return None, False, {}
            held_r, held, rolled, done = kept
            if not copy:
                return None, False, dict(done)
            if held_r != R:
                held, rolled = self._snapshot_state(R), True
            return held, rolled, dict(done)
        held, rolled, done = None, False, {}
        t0 = time.perf_counter()
        if copy:
            rolled = int(self.engine.step) != R or dirty
            held = self._snapshot_state(R) if rolled else self._live_state()
            done["host_copy"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        self._teardown_engine()
        done["teardown"] = time.perf_counter() - t1
        return held, rolled, done

    def _answer_replan(self, ri: RestoreInterrupted, live: int, shards: dict, replicas: dict, dirty: bool,
                       rejected: list | None = None, numel: dict | None = None) -> RecoveryPlan:
        """Answer the newer quiesce of ``ri`` (and any later one) with what this member offers, then return
        the plan that comes (``recover`` body's ``plan``)."""
        g = int(ri.msg["generation"])
        self.env.log(f"[phoenix] rank {self.logical}: recovery re-planned as generation {g} while "
                     f"{CUT_AT[ri.at].format(g=self.generation)}; answering its quiesce")
        while True:
            self.env.client.report_quiesced(g, live, shards, replicas, dirty, rejected=rejected, numel=numel)
            while True:
                msg = self._wait_for(("recover", "quiesce"), "recovery plan")
                if int(msg.get("generation", -1)) >= g:
                    break  # an older one (already superseded) is not answered
            if msg["type"] == "recover":
                return RecoveryPlan.from_json(msg["plan"])
            g = int(msg["generation"])

    def _mark_gc(self) -> None:
        """Where this member's part of a recovery starts, for its ``detail["gc"]``: the seconds the garbage
        collector paused this process until the resume (:class:`phoenix_hpc.launch.heap.GcPauses`). The first
        mark of a recovery counts (the fault's, not the later call in :meth:`recover`)."""
        from phoenix_hpc.launch.heap import PAUSES

        if self._gc_mark is None:
            self._gc_mark = PAUSES.total_s

    # --- hooks ---------------------------------------------------------------------------------------
    def _on_commit(self, rec) -> None:
        from phoenix_hpc.runtime.snapshot import hash_hex

        prot = self.protector
        held = dict(prot.held_steps) if prot is not None else {}
        sent = {rec.shard_id: {"holders": list(rec.holders), "step": rec.step,
                               "hash": hash_hex(rec.crc) if rec.crc is not None else None}}
        try:
            self.env.client.report_commit(self.generation, int(self.engine.step), {rec.shard_id: rec.step}, held,
                                          sent=sent, interval=rec.interval)
        except Exception:  # noqa: BLE001 -- a lost report is repaired by the next commit; never fail a step
            pass

    def _fault_hook(self, phase: str, step: int, i: int) -> None:
        # runtime phases -> injection phases of iteration step + 1 (the copy of S(step) runs in it)
        if phase == "d2h":
            self.trigger.check(step + 1, "d2h")
        elif phase == "h2h_send_chunk" and i == 0:
            self.trigger.check(step + 1, "h2h")

    def _corrupt_replica(self, inj) -> None:
        """An injected ``corrupt_replica``: flip a byte in every verified copy (committed and previous
        buffer) of the replica of ``inj.shard_id`` this holder keeps, telling nobody (only this rank's log
        says it); the copies are caught when a recovery verifies them again (:meth:`recover`)."""
        from phoenix_hpc.faults.trigger import flip_replica_bytes

        flipped = 0
        for prot in self._copy_sources(self.protector):
            pp = prot.buffers.held.get(inj.shard_id)
            for step in pp.verified_steps() if pp is not None else []:
                off = flip_replica_bytes(pp.find(step))
                flipped += 1
                self.env.log(f"[phoenix] rank {self.logical}: injected corrupt-replica: flipped the byte at offset "
                             f"{off} of the replica of {inj.shard_id} step {step} (generation {prot.generation})")
        if not flipped:
            self.env.log(f"[phoenix] rank {self.logical}: injected corrupt-replica: no replica of {inj.shard_id} "
                         "held here, nothing corrupted")

    def _held_buffer(self, shard_id: str, step: int):
        """The replica buffer of ``shard_id`` at ``step`` this slot holds: the newest generation's copy, else a
        kept one (not verified here).

        Raises:
            RecoveryError: it holds none."""
        buf = self._find_copy(lambda prot: prot.buffers.held.get(shard_id), step)
        if buf is None:
            raise RecoveryError(f"world rank {self.env.world_rank} holds no replica of {shard_id} at step {step}")
        return buf

    def _local_buffer(self, step: int):
        """The buffer of this slot's local snapshot of ``step`` (committed or the previous one; the newest
        generation's copy, else a kept one; not verified here), or None when it has none."""
        return self._find_copy(lambda prot: prot.buffers.local, step)

    def _find_copy(self, pair_of, step: int):
        """The first buffer holding ``step`` in ``pair_of(protector)`` (a ping-pong pair, or None) over
        :meth:`_copy_sources`, newest first; None when none holds it."""
        for prot in self._copy_sources():
            pp = pair_of(prot)
            buf = pp.find(step) if pp is not None else None
            if buf is not None:
                return buf
        return None

    def _copy_sources(self, current=None) -> list:
        """The protectors whose verified copies a recovery may use, newest first: ``current`` (the one being
        closed, or the old generation's during a recovery) and the kept ones of earlier generations."""
        out = [p for p in (current if current is not None else self.old_protector,) if p is not None]
        return out + [p for p in self.kept if p not in out]

    def _report_replayed(self) -> None:
        """Once this member's step is past the steps its recovery replays, say so to the coordinator with a
        heartbeat of its own: with a node board its step otherwise reaches the coordinator only with its
        node's heartbeats (the slot's record is written on its beat and pushed on the carrier's, so up to
        about two ``resilience.heartbeat_interval_s`` later), and the recovery, its ``recovery_done`` total
        and its ``replay`` phase would end only then. A failed send is left to those heartbeats: it is no
        fault of the step."""
        g, until = self._replay_until
        if g != self.generation:
            self._replay_until = None  # re-planned: the newer plan set its own target
        elif int(self.engine.step) >= until:
            self._replay_until = None
            try:
                self.env.client.heartbeat(g, int(self.engine.step))
            except Exception:  # noqa: BLE001 -- the node's heartbeat carries the step a little later
                pass

    def _phase(self, s: int, phase: str) -> None:
        if phase == "forward_backward":
            if self._replay_until is not None and self.engine is not None:
                self._report_replayed()
            self.phase = None  # a new iteration: nothing of it is applied yet
            if self.kept and self.protector is not None and self.protector.recoverable_step is not None:
                self.kept = []  # this generation's first commit fence: its own copies protect every shard
                from phoenix_hpc.launch.heap import return_free_heap

                return_free_heap()  # what the recovery replaced is freed now: its heap pages go back
            self._poll()  # an injection for step s, any phase, is still armed here
            self.env.client.started_step = s  # from now on, instructions for step s come too late
        self.trigger.check(s, phase)
        self.phase = phase
        if phase == "optimizer_step":
            self._drain_pause(s)

    def _drain_pause(self, s: int) -> None:
        """A planned drain armed for iteration ``s``: this member is at its commit fence (``S(s-1)``
        committed and acknowledged, no update of ``s`` applied), so live step == committed step. It reports
        ``drain_reached`` and waits, its groups and protector intact (peers may still need its acks), for
        the coordinator's ``quiesce`` (the hot swap, zero steps replayed) or ``stop`` (a drained slot)."""
        c = self.env.client
        d = c.take_drain(s)
        if d is None:
            return
        self.phase = "drain"
        try:
            c.send({"type": "drain_reached", "world_rank": self.env.world_rank, "pid": c.pid,
                    "request_id": d["request_id"], "step": int(self.engine.step)})
        except Exception:  # noqa: BLE001 -- the coordinator then misses the drain or a peer's fault ends it
            pass
        self.env.log(f"[phoenix] rank {self.logical} gen {self.generation}: paused at the commit fence of "
                     f"iteration {s} for drain {d['request_id']}")
        h2h = getattr(self.protector, "h2h", None)
        if h2h is None or getattr(h2h, "_thread", None) is not None:
            raise QuiesceRequested(self._wait_for(("quiesce",), "quiesce for the drain"))
        # MPI_THREAD_FUNNELED/SINGLE: no engine thread; this thread keeps the H2H engine (a peer's replica
        # and its acknowledgement, the commit fence) moving while it waits
        deadline = time.monotonic() + self.wait_s
        while time.monotonic() < deadline:
            h2h.poll()
            while c.instructions:
                msg = c.instructions.popleft()
                if msg["type"] == "stop":
                    raise StopRequested(msg)
                if msg["type"] == "quiesce":
                    raise QuiesceRequested(msg)
            msg = c.wait_instruction(("quiesce",), 0.05)
            if msg is not None:
                c.instructions.appendleft(msg)
        raise RecoveryError(f"no quiesce from the coordinator within {self.wait_s:g} s of the drain's pause")

    def _poll(self) -> None:
        from phoenix_hpc.errors import ControlError

        c = self.env.client
        try:
            self.watchdog.pump(only_if_rung=True)  # one lock with the quiesce watchdog: instructions keep their order
        except ControlError:
            return  # the coordinator watchdog ends the process if the coordinator is really gone
        while c.instructions:
            msg = c.instructions.popleft()
            if msg["type"] == "quiesce":
                raise QuiesceRequested(msg)
            if msg["type"] == "stop":
                raise StopRequested(msg)

    def _abort_on_quiesce(self, msg: dict[str, Any]) -> None:
        """Quiesce watchdog thread: the coordinator ended this generation while the training thread may be
        blocked in a collective; abort the generation's communicators so that it returns with an error."""
        aborter = self.aborter
        if aborter is None or aborter.aborted:
            return
        rec = aborter.abort(f"{msg.get('type')} for generation {msg.get('generation')}")
        self.interrupt.interrupt(aborter.generation, rec.reason)  # a rank computing leaves its step at once
        self.env.log(f"[phoenix] rank {self.logical} gen {aborter.generation}: {rec.reason} heard while "
                     f"training; communicators aborted ({rec.method}, {rec.sockets} connections) in "
                     f"{rec.duration_s:.3f} s")

    def _wait_for(self, types: tuple[str, ...], what: str) -> dict[str, Any]:
        c = self.env.client
        deadline = time.monotonic() + self.wait_s
        while True:
            while c.instructions:
                msg = c.instructions.popleft()
                if msg["type"] == "stop":
                    raise StopRequested(msg)
                if msg["type"] in types:
                    return msg
            if getattr(c, "away", False):  # the coordinator restarts: its absence is not its silence (the
                deadline = time.monotonic() + self.wait_s  # slot's watchdog bounds the absence)
            left = deadline - time.monotonic()
            if left <= 0:
                raise RecoveryError(f"no {what} from the coordinator within {self.wait_s:g} s")
            msg = c.wait_instruction(types, min(left, 1.0))
            if msg is not None:
                c.instructions.appendleft(msg)

    # --- training ------------------------------------------------------------------------------------
    def run(self, until_step: int, tokens_per_step: int, on_step=None, evaluator=None) -> None:
        """Train to ``until_step`` through any number of recoveries; ``evaluator``: the loop's (evaluations of
        a replayed step run again, :mod:`phoenix_hpc.launch.evaluate`); ``on_step`` gets every step's record
        (replayed steps again; none is kept here, so memory does not grow with the steps). Raises StopRequested when the coordinator ends the job early; on a planned end
        (``stop`` with ``checkpoint``) first writes this member's shard of the final checkpoint
        (:func:`phoenix_hpc.launch.final.final_checkpoint`) and raises with the coordinator's last ``stop``."""
        self.evaluator = evaluator
        try:
            self._train_through_recoveries(until_step, tokens_per_step, on_step)
        except StopRequested as stop:
            if not stop.msg.get("checkpoint"):
                raise
            from phoenix_hpc.launch.final import final_checkpoint

            raise StopRequested(final_checkpoint(self, stop.msg)) from None

    def _train_through_recoveries(self, until_step: int, tokens_per_step: int, on_step=None) -> None:
        from phoenix_hpc.launch.loop import train

        self.env.client.last_step = int(until_step)  # an injection past the last step is refused at once
        while True:
            quiesce: dict[str, Any] | None = None
            try:
                self.phase = None
                self.watchdog.arm()
                try:
                    self.interrupt.open(self.generation)
                    train(self.engine, until_step, tokens_per_step, protector=self.protector, on_step=on_step,
                          phase_hook=self._phase, keep=False, evaluator=getattr(self, "evaluator", None))
                finally:
                    self.watchdog.disarm()
                    asked = self.interrupt.close()
                    self._left = (time.perf_counter(), asked)  # the step is left (or the training is done)
                return
            except QuiesceRequested as q:
                self.watchdog.take_fired(remove=False)  # a later quiesce it heard stays queued
                quiesce, failed = q.msg, False
            except (StopRequested, KeyboardInterrupt):
                raise
            except Exception as exc:  # noqa: BLE001 -- an error inside the step: report, then recover
                failed = True
                heard = self.watchdog.take_fired()
                step = int(self.engine.step) + 1
                why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
                if heard is not None:  # the watchdog aborted the groups under this step: not a new fault
                    if heard["type"] == "stop":
                        raise StopRequested(heard) from None
                    quiesce = heard
                    self.env.log(f"[phoenix] rank {self.logical} gen {self.generation}: left step {step} "
                                 f"({self.phase or 'start'}) on the coordinator's quiesce: {why}")
                else:
                    self.env.log(f"[phoenix] rank {self.logical} gen {self.generation}: error in step {step} "
                                 f"({self.phase or 'start'}): {why}")
                    try:
                        self.env.client.report_fault(self.generation, step, self.phase or "forward_backward", exc,
                                                     kind=fault_kind_of(exc))
                    except Exception:  # noqa: BLE001 -- heartbeats/peers' reports still reach the coordinator
                        pass
            # outside the handler: the error's traceback (whose frames hold the groups) is gone
            self._mark_gc()
            self.release_groups()
            if quiesce is None:
                quiesce = self._wait_for(("quiesce",), "quiesce after the error")
            self._recover_through_replans(quiesce, failed)

    def _recover_through_replans(self, quiesce: dict[str, Any], failed: bool) -> RecoveryRecord:
        """:meth:`recover`, again for each re-plan that reaches this member after it answered ``recovered``
        and before ``resume`` (:meth:`_report_and_resume` raises QuiesceRequested): its new generation's
        groups and protector go as after a fault, and its copies of the recoverable step serve again."""
        while True:
            try:
                return self.recover(quiesce, failed=failed)
            except QuiesceRequested as q:
                quiesce, failed = q.msg, False
            self.release_groups()  # outside the handler: the traceback's frames hold no groups then

    def finish(self) -> None:
        """Normal end: close the protector (collective over the members)."""
        self.watchdog.close()
        if self.protector is not None:
            self.protector.close()
            self.protector = None

    # --- recovery ------------------------------------------------------------------------------------
    def recover(self, quiesce: dict[str, Any], failed: bool) -> RecoveryRecord:
        """Steps 1-7 for a survivor (see the module doc)."""
        t_quiesce = time.perf_counter()
        self._mark_gc()
        g = int(quiesce["generation"])
        with self.env.client.injections_lock:  # a drain armed before this recovery cannot pause it any more
            self.env.client.drain = None
        dirty = bool(failed and self.phase == "optimizer_step")
        live = int(self.engine.step)
        self.trigger.check(live + 1, "recovery")
        prot, self.protector = self.protector, None
        shards: dict[str, list[int]] = {}
        replicas: dict[str, list[int]] = {}
        rejected: list[list] = []
        if prot is not None:
            dead_world = {int(w) for w in quiesce.get("dead") or ()}
            dead_peers = frozenset(r for r, w in self.rank_map.items() if w in dead_world)
            # MPI requests still posted are cancelled or freed, those to a dead peer at once (runtime/mpi_faults.py)
            prot.close(abandon=True, dead_peers=dead_peers)
            if prot.wedged:
                from phoenix_hpc.errors import TransportWedged
                from phoenix_hpc.runtime.h2h import ABANDON_JOIN_S

                raise TransportWedged(
                    f"rank {self.logical} gen {self.generation}: the H2H thread did not leave MPI within "
                    f"{ABANDON_JOIN_S:g} s of the abandon (the MPI library deadlocked on a dead peer's "
                    "connection); this slot cannot take part in another generation and leaves so that a spare "
                    "replaces it")
            ab = prot.abandon_report
            if ab is not None and (ab.cancelled or ab.freed or ab.kept or ab.errors):
                self.env.log(f"[phoenix] rank {self.logical}: abandoned MPI requests of generation "
                             f"{self.generation}: {ab.cancelled} cancelled, {ab.freed} freed, {ab.kept} "
                             f"collectives kept, {ab.completed} completed, errors {ab.errors[:2]}")
        # this generation's copies, and (before its first commit fence) the kept ones of earlier generations:
        # the replicas of the recoverable step stay valid until the new generation has its own
        for p in self._copy_sources(prot):
            # a replica corrupted in memory since it arrived is never offered to the plan
            for sid, step, why in p.reverify_held()[1]:
                rejected.append([sid, step, why])
                self.env.log(f"[phoenix] rank {self.logical}: held replica of {sid} step {step} fails "
                             f"verification and is not offered: {why}")
            # both ping-pong buffers count: a copy one step behind the others is still recoverable
            local, held = p.copy_steps()
            if local:
                shards[p.shard_id] = sorted(set(shards.get(p.shard_id, [])) | set(local), reverse=True)
            for sid, v in held.items():
                if v:
                    replicas[sid] = sorted(set(replicas.get(sid, [])) | set(v), reverse=True)
        # a protector of a generation that never committed (re-planned before its first step) offers nothing:
        # not kept, so that its buffers go before the next generation allocates its own
        empty = prot is not None and prot.copy_steps() == ([], {})
        self.old_protector = None if empty else prot
        numel = None
        if getattr(self.engine, "supports_shrink", False):
            numel = {f"pp{self.coord.pp}/tp{self.coord.tp}": self.engine.optimizer_numel()}
        self.env.client.report_quiesced(g, live, shards, replicas, dirty, rejected=rejected, numel=numel)
        left_at, asked = self._left or (t_quiesce, None)
        self._left = None
        # out of the step (groups released, protector closed, copies checked) -> the answer; interrupt -> out
        quiesced = {"quiesce": time.perf_counter() - left_at, **({"leave": left_at - asked} if asked is not None else {})}
        self.env.log(f"[phoenix] rank {self.logical}: quiesced for generation {g} (live step {live}, "
                     f"committed {shards}, holding {replicas}, dirty={dirty})")
        while True:
            msg = self._wait_for(("recover", "quiesce"), "recovery plan")
            if msg["type"] == "recover":
                break
            # a re-planned recovery (a fault during this one): answer the new quiesce the same way
            g = int(msg["generation"])
            self.env.client.report_quiesced(g, int(self.engine.step), shards, replicas, dirty, rejected=rejected,
                                            numel=numel)
        plan = RecoveryPlan.from_json(msg["plan"])
        while True:
            try:
                return self._apply_plan(plan, dirty=dirty, live=live, detail=quiesced)
            except RestoreInterrupted as ri:  # its message only: its traceback holds the cut plan's frames
                cut = RestoreInterrupted(ri.msg, ri.at)
            # outside the handler, no traceback kept (its frames hold the cut-short generation's groups, a
            # protector's engine tensors, the transfers' buffers): those groups go as after a fault. What it
            # quiesced with is still here: the copies (its closed protector; a new one is built only after every
            # member arrived at it) and its engine (untouched at the barrier on the rebind path; rebound and
            # perhaps rolled back to S(R) after it; on the rebuild path ended, its host copy kept, or built and
            # loaded after the barrier). It answers the live step it quiesced with: the newest step it finished,
            # which the next plan counts as replayed, also when its engine is at S(R) already
            self.release_groups()
            plan = self._answer_replan(cut, live, shards, replicas, dirty, rejected, numel)
            cut = None

    def _apply_plan(self, plan: RecoveryPlan, dirty: bool, live: int | None = None,
                    detail: dict[str, float] | None = None) -> RecoveryRecord:
        """``detail``: what the recovery reports already (a survivor's ``leave`` and ``quiesce``)."""
        self._replay_until = plan.replay_target()  # the coordinator hears the step past them at once
        if plan.shrink:
            from phoenix_hpc.launch.shrink import apply_shrink

            return apply_shrink(self, plan, dirty, live, detail)
        e = self.env
        e.grid = plan.grid  # the grid of the plan's generation (a joining spare after a shrink: a smaller one)
        g = plan.generation
        rank_map = plan.world_of()
        R = plan.recoverable_step
        mine = plan.member_of(e.world_rank)
        if mine is None:
            raise RecoveryError(f"world rank {e.world_rank} is not a member of generation {g}'s rank map "
                                f"{[list(x) for x in plan.rank_map]}")
        if self.logical is not None and mine != self.logical:
            raise RecoveryError(f"plan moves world rank {e.world_rank} from logical rank {self.logical} to {mine}")
        self.generation, self.rank_map, self.logical = g, rank_map, mine
        # heartbeats of generation g say R from now on, not the live step this member quiesced at: a node's
        # heartbeat arriving after the resume must not put it past the steps it is about to replay
        e.progress.set(generation=g, step=R)
        from_checkpoint = plan.from_checkpoint
        rebuild = self.recovery_path == "rebuild"
        rolled = False
        held: tuple[dict, dict, dict] | None = None
        detail = dict(detail or {})
        done: dict[str, float] = {}
        t0 = time.perf_counter()
        if rebuild:  # 3': own host copy of S(R), then end the old engine
            held, rolled, done = self._host_copy_then_teardown(R, dirty, copy=not from_checkpoint)
            detail.update(done)
        try:
            detail.update(self._setup_groups())
            # every member arrived and built its groups: an injection for phase "restore" lands here
            self.land_restore(plan.recovery_step())
        except RestoreInterrupted:
            if held is not None:  # the engine is gone: the next plan loads this copy
                self._held_copy = (R, held, rolled, done)
            raise
        t_reconf = time.perf_counter() - t0  # rebuild: teardown, groups and (below) the new engine

        spent = {"reconfigure": 0.0, "rollback": 0.0}  # the engine work's seconds, by the phase they count to

        def engine_work() -> None:  # 3''/4/4': this member's engine, at S(R) unless its transfers bring it
            nonlocal rolled, held
            t1 = time.perf_counter()
            if self.engine is not None:  # rebind: keep the engine, give it the new groups
                self.engine.rebind(self.groups, self.coord)
                if not from_checkpoint and (int(self.engine.step) != R or dirty):
                    self._rollback(R)
                    rolled = True
                elif live is not None and live != R:  # rolled back in a plan cut short after its rollback
                    rolled = True
                detail["rollback"] = spent["rollback"] = time.perf_counter() - t1
                return
            # a joining spare, or every member on the rebuild path (3'')
            self._construct_engine(state_follows=True)
            detail["engine"] = time.perf_counter() - t1
            spent["reconfigure" if rebuild else "rollback"] += detail["engine"]
            if held is not None:  # 4': the survivor's own S(R)
                t2 = time.perf_counter()
                self._load_state(*held)
                held = None
                detail["rollback"] = time.perf_counter() - t2
                spent["rollback"] += detail["rollback"]

        if from_checkpoint:  # memory could not cover the loss: every member loads the persistent checkpoint
            from phoenix_hpc.launch.persist import restore_step

            engine_work()
            t3 = time.perf_counter()
            restore_step(self.engine, self.groups, e.cfg, e.run_dir, R)
            rolled = live is not None
            detail["checkpoint_load"] = time.perf_counter() - t3
            t_params, t_opt = 0.0, detail["checkpoint_load"]
        else:  # 5: the engine work runs while this member's buffers go, when none of them needs the engine
            restored = run_transfers(self, plan.transfers, R, during=engine_work,
                                     check=self._restore_check("transfers"))
            t_params, t_opt = restored.params_s, restored.optimizer_s
            detail.update({f"wire.{k}": v for k, v in restored.wire.items()})
        t_reconf += spent["reconfigure"]
        t_rollback = spent["rollback"]
        if int(self.engine.step) != R:
            raise RecoveryError(f"rank {self.logical} is at step {self.engine.step} after the restore, plan says {R}")

        return self._report_and_resume(g, rank_map, R, live, dirty, rolled, detail, self.recovery_path,
                                       t_reconf=t_reconf, t_params=t_params, t_opt=t_opt + t_rollback,
                                       at_step=plan.recovery_step())

    def _report_and_resume(self, g: int, rank_map: dict[int, int], R: int, live: int | None, dirty: bool,
                           rolled: bool, detail: dict[str, float], path: str, *, t_reconf: float, t_params: float,
                           t_opt: float, at_step: int, what: str = "", replan_ok: bool = True) -> RecoveryRecord:
        """The end of every recovery a member takes part in: its evidence, this generation's protector, the
        ``recovered`` report with the phase timings, the wait for ``resume``; returns the record. The previous
        generation's copies of ``R`` (``old_protector``, ``kept``) stay usable until this generation's first
        commit fence (a shrink has dropped them before: they name shards of the old grid).

        Raises QuiesceRequested when, instead of ``resume``, a ``quiesce`` of a later generation comes (a
        member was lost before every member answered; with ``replan_ok``, not after a shrink): this member is
        then at ``S(R)`` with the copies of ``R`` kept, as in the first step of the generation, and quiesces
        again (:meth:`_recover_through_replans`)."""
        e = self.env
        t2 = time.perf_counter()
        report = self._evidence(g, rank_map)
        detail["evidence"] = time.perf_counter() - t2
        t2 = time.perf_counter()
        self.protector = self._build_protector(replan_ok=replan_ok)
        created = self.protector.create_s
        detail.update({f"protector_{k}": v for k, v in created.items()})
        old, self.old_protector = self.old_protector, None
        # the copies of R stay usable until this generation's first commit fence (:meth:`_phase`): the old
        # protector's, and those kept before it unless the old generation had a fence of its own
        if old is not None and old.recoverable_step is not None:
            self.kept = [old]
        else:
            self.kept = ([old] if old is not None else []) + self.kept
        # every member reaches the protector's first collective only after its transfers: the wait there for
        # the slowest member (the receiving spare, usually) is measured apart ("protector_arrive") and left
        # out of "reconfigure", which then holds this member's own work; the transfers are not counted a
        # second time in it (the recovery's total is the same)
        t_repl = time.perf_counter() - t2 - created.get("arrive", 0.0)
        detail["protector"] = t_repl
        report["sent"] = {self.protector.shard_id: {"holders": list(self.protector.holders)}}
        timings = {"reconfigure": t_reconf + t_repl, "params": t_params, "optimizer": t_opt}
        self.trigger.check(at_step, "recovery")  # at_step: the plan's recovery_step
        e.client.report_recovered(g, report, timings)
        while True:  # a member lost before every member answered: the coordinator re-plans (a newer quiesce)
            msg = self._wait_for(("resume", "quiesce"), "resume")
            if msg["type"] == "resume":
                break
            if int(msg.get("generation", -1)) > g:
                if not replan_ok:
                    raise RecoveryError(f"rank {self.logical}: generation {g}{what} was re-planned as generation "
                                        f"{msg['generation']} before it resumed; it cannot be quiesced again")
                e.log(f"[phoenix] rank {self.logical}: recovery re-planned as generation {msg['generation']} "
                      f"while waiting for the resume of generation {g}; quiescing again")
                raise QuiesceRequested(msg)
        if self._gc_mark is not None:
            from phoenix_hpc.launch.heap import PAUSES

            detail["gc"] = PAUSES.total_s - self._gc_mark
            self._gc_mark = None
        e.progress.set(step=int(self.engine.step))
        rec = RecoveryRecord(g, R, live, dirty, rolled, {k: round(v, 4) for k, v in timings.items()},
                             {k: round(v, 4) for k, v in detail.items()}, path)
        self.recoveries.append(rec)
        e.log(f"[phoenix] rank {self.logical} (world {e.world_rank}): generation {g} resumed at step {R}{what} "
              f"({'rolled back from ' + str(live) if rolled else 'no rollback'}) on the {rec.path} path, "
              f"timings {rec.timings}, detail {rec.detail}")
        return rec

    def _evidence(self, g: int, rank_map: dict[int, int]) -> dict[str, Any]:
        """This member's ``recovered`` report (:class:`phoenix_hpc.recovery.invariants.MemberReport` JSON):
        the hashes of its restored optimizer and param shard (:func:`phoenix_hpc.runtime.snapshot.part_hash`)
        and every replica its previous protector holds, each verified again now (CRC-32 of every tensor)
        and listed with the shard id, step and generation its header names and the hash of its optimizer
        part. A copy that fails verification is left out (and logged): the coordinator sees it missing."""
        from phoenix_hpc.runtime.snapshot import hash_hex, part_hash

        held = []
        for prot in self._copy_sources():
            good, bad = prot.reverify_held()
            held += [[sid, step, gen, hash_hex(crc)] for sid, step, gen, crc in good]
            for sid, step, why in bad:
                self.env.log(f"[phoenix] rank {self.logical}: held replica of {sid} step {step} rejected: {why}")
        eng, c, ck = self.engine, self.coord, self.env.cfg.resilience.checksum
        return {"world_rank": self.env.world_rank, "logical_rank": self.logical, "generation": g,
                "rank_map": [[r, w] for r, w in sorted(rank_map.items())], "step": int(eng.step),
                "partial": False, "opt_shard": c.shard_prefix(), "opt_hash": part_hash(eng.optimizer_shard(), ck),
                "param_shard": c.param_shard(), "param_hash": part_hash(eng.param_shard(), ck),
                "held": held}

    def _teardown_engine(self) -> None:
        """The rebuild path: end the old engine (:meth:`Engine.teardown`, which also clears the global state
        its constructor set up) and drop every reference to it, before the next generation is built. On a GPU
        a garbage collection follows, so that device memory held in reference cycles is back before the new
        engine allocates (a full collection takes about a second in a rank's heap, so not on CPU, where
        nothing waits for that memory)."""
        engine, self.engine = self.engine, None
        engine.teardown()
        del engine
        if getattr(self.env.device, "type", "cpu") == "cuda":
            gc.collect()

    def _snapshot_state(self, step: int) -> tuple[dict, dict, dict]:
        """S(step) from the committed local snapshot of the old protector (verified; host memory):
        ``(optimizer shard, param shard, envelope)``, the tensors views of that buffer (the old protectors
        are closed when a recovery starts, and nobody writes their buffers; :meth:`_load_state` copies them).

        Raises:
            RecoveryError: there is no old protector; ReplicationError: no verified snapshot of ``step``."""
        srcs = self._copy_sources()
        if not srcs:
            raise RecoveryError(f"rank {self.logical} must roll back to step {step} but has no local snapshot")
        for prot in srcs[:-1]:  # the newest generation's snapshot of ``step`` if it has one, else an older one
            if step in prot.copy_steps()[0]:
                break
        else:
            prot = srcs[-1]
        u = prot.local_snapshot(step=step, copy=False)
        opt = {n: t for n, t in u.tensors.items() if n.startswith("opt/")}
        par = {n: t for n, t in u.tensors.items() if not n.startswith("opt/")}
        return opt, par, u.envelope

    def _live_state(self) -> tuple[dict, dict, dict]:
        """A host copy of the engine's live state (its step is the recoverable step and it is clean), taken
        before :meth:`_teardown_engine`: ``(optimizer shard, param shard, envelope)``, tensors copied to CPU,
        the envelope through JSON (nothing shared with the old engine)."""
        eng = self.engine
        opt = {n: t.detach().to("cpu", copy=True) for n, t in eng.optimizer_shard()}
        par = {n: t.detach().to("cpu", copy=True) for n, t in eng.param_shard()}
        return opt, par, json.loads(json.dumps(eng.envelope()))

    def _load_state(self, opt: dict, par: dict, envelope: dict) -> None:
        self.engine.load_optimizer_shard(opt)
        self.engine.load_param_shard(par)
        self.engine.load_envelope(envelope)

    def _rollback(self, step: int) -> None:
        """Load S(step) from the committed local snapshot (verified) into the engine (I4)."""
        self._load_state(*self._snapshot_state(step))


def import_runtime(cfg) -> None:
    """Import the code a slot runs: torch.distributed, the dataset reader (megatron-core's, with ``data.path``;
    a ``data.blend`` is also built here, once per process, before any process group exists),
    the engine of ``cfg.engine`` (a user's engine class too; the torch engine or one derived from it: also
    what torch loads on the first construction of a model on the meta device,
    :func:`~phoenix_hpc.engines.torch_gpt.load_meta_kernels`; the Megatron engine or one derived from it: the
    megatron-core modules it builds with, :func:`~phoenix_hpc.engines.megatron_engine.import_megatron_core`),
    the protection runtime and the recovery driver. Seconds on a busy node (megatron-core's import alone
    brings in about 2,900 modules). On a GPU node, call it after ``torch.cuda.set_device``: a library may
    touch CUDA when it is imported. A user's class that cannot be imported is left to the engine's
    construction to report (the rank's preflight has refused it already)."""
    import torch.distributed  # noqa: F401

    from phoenix_hpc.engines import factory
    from phoenix_hpc.errors import ConfigError
    from phoenix_hpc.launch import groups, loop  # noqa: F401
    from phoenix_hpc.runtime import protector  # noqa: F401

    if cfg.data.prefixes:
        from phoenix_hpc.data.indexed import megatron_indexed_module

        megatron_indexed_module()
    if cfg.data.blend is not None:  # megatron-core's builder synchronises over the default group if one exists:
        from phoenix_hpc.data.blend import open_blend  # build it before any (phoenix_hpc/data/blend.py)

        open_blend(cfg)
    try:
        torch_like, megatron_like = factory.engine_family(cfg)
    except ConfigError:
        return
    if torch_like:
        from phoenix_hpc.engines.torch_gpt import load_meta_kernels

        load_meta_kernels()
    if megatron_like:
        from phoenix_hpc.engines.megatron_engine import import_megatron_core

        import_megatron_core()


def warm_up(cfg) -> None:
    """What a standby slot does before it waits (a *warm* spare, docs/design.md section 7): import what it
    will run (:func:`import_runtime`) and open the dataset once, so that a recovery does not pay for it."""
    from phoenix_hpc.data.indexed import open_indexed_dataset

    import_runtime(cfg)
    for prefix in cfg.data.prefixes:
        open_indexed_dataset(prefix)


def wait_for_join(client, wait_s: float | None = None) -> RecoveryPlan | None:
    """Standby: wait for a ``recover`` instruction naming this slot in its joins. Returns the plan, or None
    when the coordinator says ``stop`` (or, with ``wait_s``, nothing came in time). Waits only inside
    ``client.wait_instruction`` (on the doorbell), so a plan is taken as soon as it is rung, never after a
    sleep of its own: the spare's start is on the hot swap's critical path.

    Raises:
        StopRequested: the ``stop`` says this slot was declared dead (``job_state`` fenced: a spare whose
            heartbeats stopped while its process lived): the slot exits with an error line naming why, as a
            fenced member does (launch/rank.py), not as a spare the job no longer needs."""
    deadline = None if wait_s is None else time.monotonic() + wait_s
    while True:
        left = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
        msg = client.wait_instruction(("recover",), left)
        if msg is not None:
            if msg["type"] == "stop":
                if msg.get("job_state") == "fenced":
                    raise StopRequested(msg)
                return None
            plan = RecoveryPlan.from_json(msg.get("plan") or {})
            if any(j.world_rank == client.world_rank for j in plan.joins):
                return plan
        if deadline is not None and time.monotonic() >= deadline:
            return None


