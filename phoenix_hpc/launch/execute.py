"""The protected training driver: one :class:`Member` per active slot (and per standby slot once it joins).

It owns, for the current generation ``g``: the torch process groups (``PrefixStore(f"gen{g}")`` on the
coordinator's store, explicit ``resilience.collective_timeout_s`` on every group), the MPI communicator of the
members (``COMM_WORLD.Create_group`` over the live members in logical-rank order, so communicator rank ==
logical rank, :func:`~phoenix_hpc.launch.member_env.make_comm`), the engine, the runtime's
:class:`~phoenix_hpc.runtime.protector.Protector`, and the closed protectors whose copies still serve a
recovery (:class:`~phoenix_hpc.launch.copies.Copies`).

Training (:meth:`Member.run`) is :func:`phoenix_hpc.launch.loop.train` with a phase hook that, at the start
of every iteration, polls the coordinator (``quiesce`` / ``stop`` instructions, ``inject`` requests,
:mod:`phoenix_hpc.launch.instructions`) and at every phase fires due injections
(:class:`~phoenix_hpc.faults.trigger.FaultTrigger`). After each commit the member reports its shard's
committed step and the steps of the replicas it holds (``commit``).

A recovery starts either with an error inside the step (a gloo collective that failed or timed out because
a peer died, a commit that timed out, an injected fault: reported as ``fault``, then the member waits for
the coordinator's ``quiesce``) or with a ``quiesce`` received at a step boundary, which leaves the training
loop (:class:`~phoenix_hpc.launch.signals.QuiesceRequested`). The member's part in it, through its phases
and every re-plan until the resume, is :class:`phoenix_hpc.launch.rank_recovery.RankRecovery`; this module
gives it the generation's set-up (groups, engine, protector) and the release of the old one.
"""

from __future__ import annotations

import gc
import time
from typing import Any, Callable

from phoenix_hpc.errors import ConfigError, RecoveryError
from phoenix_hpc.launch.copies import Copies
from phoenix_hpc.launch.instructions import ARRIVE_CHECK_S, FULL_POLL_S, drain_pause, poll, take_newer_quiesce, wait_for
from phoenix_hpc.launch.interrupt import ComputeInterrupt
from phoenix_hpc.launch.member_env import (  # noqa: F401 -- MemberEnv, make_comm, generation_abort, fired_notice:
    MemberEnv, RecoveryRecord, fired_notice, generation_abort, make_comm, quiesce_watchdog)  # the entry point's
from phoenix_hpc.launch.rank_recovery import Phase, RankRecovery
from phoenix_hpc.launch.signals import (  # noqa: F401 -- StopRequested, RestoreInterrupted: the entry point's
    LeftToStandby, QuiesceRequested, RestoreInterrupted, StopRequested, fault_kind_of)
from phoenix_hpc.launch.standby import import_runtime, wait_for_join, warm_up  # noqa: F401 -- the entry point's
from phoenix_hpc.recovery.plan import RecoveryPlan


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
        # the closed protectors whose copies of the last recoverable step still serve a recovery, until the
        # current generation's first commit fence (no unprotected window)
        self.copies = Copies(env.log)
        self._replay_until: tuple[int, int] | None = None  # (generation, step) to report reaching at once
        self.phase: str | None = None
        self.recoveries: list[RecoveryRecord] = []
        self.recovery: RankRecovery | None = None  # the last recovery this member took part in
        self._gc_mark: float | None = None  # heap.PAUSES.total_s where the current recovery started (_mark_gc)
        self.trigger = FaultTrigger(env.client.injections, notify=fired_notice(env.client, env.run_dir, env.world_rank),
                                    on_link_down=[env.client.stop_heartbeat], lock=env.client.injections_lock,
                                    on_corrupt_replica=self._corrupt_replica, on_bitflip=self._bitflip)
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
        self.watchdog = env.watchdog or quiesce_watchdog(env.client, self._abort_on_quiesce, env.world_rank)
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
        instructions (:func:`~phoenix_hpc.launch.instructions.take_newer_quiesce`; every FULL_POLL_S also
        without a ring: one may be lost). Raises StopRequested on a ``stop``."""
        now = time.monotonic()
        full = now >= getattr(self, "_next_full_pump", 0.0)
        if full:
            self._next_full_pump = now + FULL_POLL_S
        return take_newer_quiesce(self.env.client, self.watchdog, self.generation, full)

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
            replica_agreement=res.replica_agreement,
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

    # --- recovery (launch/rank_recovery.py) ----------------------------------------------------------
    def join(self, plan: RecoveryPlan) -> None:
        """A standby slot named in ``plan`` takes its logical rank: build the generation, restore, resume
        (:class:`~phoenix_hpc.launch.rank_recovery.RankRecovery` from TRANSFERRING).

        Raises:
            LeftToStandby: a re-plan shrank the job and removed this slot's DP replica again."""
        self._mark_gc()
        # an injection armed on this standby slot for phase "recovery" lands here, before it reaches the new
        # generation (a spare lost while it joins); a fault it raises is reported as the plan's generation's
        self.env.progress.set(generation=plan.generation)
        self.trigger.check(plan.recovery_step(), "recovery")
        self.recovery = RankRecovery.of_joiner(self, plan)
        if self.recovery.run() is Phase.STANDBY:
            raise LeftToStandby(f"world rank {self.env.world_rank} left its DP replica in the shrink to "
                                f"generation {self.generation}")

    def recover(self, quiesce: dict[str, Any], failed: bool) -> RecoveryRecord | None:
        """This member's part in the recovery that ``quiesce`` starts (``failed``: it left its step on an
        error), through every re-plan until the resume: the record, or None when a shrink sent the slot back
        to standby (:class:`~phoenix_hpc.launch.rank_recovery.RankRecovery`)."""
        self.recovery = RankRecovery.of_member(self, quiesce, failed)
        return self.recovery.record if self.recovery.run() is Phase.TRAINING else None

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
                                          sent=sent, interval=rec.interval,
                                          params=[[s, f"{d:016x}"] for s, d in rec.param_digests])
        except Exception:  # noqa: BLE001 -- a lost report is repaired by the next commit; never fail a step
            pass

    def _fault_hook(self, phase: str, step: int, i: int) -> None:
        # runtime phases -> injection phases of iteration step + 1 (the copy of S(step) runs in it)
        if phase == "d2h":
            self.trigger.check(step + 1, "d2h")
        elif phase == "h2h_send_chunk" and i == 0:
            self.trigger.check(step + 1, "h2h")

    def _corrupt_replica(self, inj) -> None:
        """An injected ``corrupt_replica`` (:meth:`Copies.corrupt`): caught when a recovery verifies the
        held copies again."""
        self.copies.corrupt(inj.shard_id, self.protector, self.logical)

    def _bitflip(self, inj) -> None:
        """An injected ``bitflip`` (:func:`~phoenix_hpc.faults.trigger.flip_param_bit`): one bit of one live
        parameter, before the snapshot of the previous step starts; replica agreement finds it at that
        commit (control/agreement.py)."""
        from phoenix_hpc.faults.trigger import flip_param_bit

        name, i, _ = flip_param_bit(self.engine.param_shard())
        self.env.log(f"[phoenix] rank {self.logical}: injected bitflip: flipped the lowest bit of element {i} "
                     f"of {name}")

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
            if self.copies.kept and self.protector is not None and self.protector.recoverable_step is not None:
                self.copies.kept = []  # this generation's first commit fence: its own copies protect every shard
                from phoenix_hpc.launch.heap import return_free_heap

                return_free_heap()  # what the recovery replaced is freed now: its heap pages go back
            self._poll()  # an injection for step s, any phase, is still armed here
            self.env.client.started_step = s  # from now on, instructions for step s come too late
        self.trigger.check(s, phase)
        self.phase = phase
        if phase == "optimizer_step":
            self._drain_pause(s)

    def _drain_pause(self, s: int) -> None:
        """A planned drain armed for iteration ``s`` (:func:`~phoenix_hpc.launch.instructions.drain_pause`):
        the ``quiesce`` that ends the pause leaves the step."""
        msg = drain_pause(self, s)
        if msg is not None:
            raise QuiesceRequested(msg)

    def _poll(self) -> None:
        """At a step boundary: a queued ``quiesce`` leaves the training loop (a ``stop`` ends the slot)."""
        msg = poll(self.env.client, self.watchdog)
        if msg is not None:
            raise QuiesceRequested(msg)

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
        return wait_for(self.env.client, types, what, self.wait_s)

    # --- training ------------------------------------------------------------------------------------
    def run(self, until_step: int, tokens_per_step: int, on_step=None, evaluator=None) -> None:
        """Train to ``until_step`` through any number of recoveries; ``evaluator``: the loop's (evaluations of
        a replayed step run again, :mod:`phoenix_hpc.launch.evaluate`); ``on_step`` gets every step's record
        (replayed steps again; none is kept here, so memory does not grow with the steps). Raises StopRequested when the coordinator ends the job early; on a planned end
        (``stop`` with ``checkpoint``) first writes this member's shard of the final checkpoint
        (:func:`phoenix_hpc.launch.final.final_checkpoint`) and raises with the coordinator's last ``stop``."""
        try:
            self._train_through_recoveries(until_step, tokens_per_step, on_step, evaluator)
        except StopRequested as stop:
            if not stop.msg.get("checkpoint"):
                raise
            from phoenix_hpc.launch.final import final_checkpoint

            raise StopRequested(final_checkpoint(self, stop.msg)) from None

    def _train_through_recoveries(self, until_step: int, tokens_per_step: int, on_step=None,
                                  evaluator=None) -> None:
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
                          phase_hook=self._phase, keep=False, evaluator=evaluator)
                    if self.protector is not None:
                        # the last fence is read by no later snapshot: replicas that differ in the final
                        # state are a fault too (ReplicaDisagreement), not the job's result
                        self.phase = "wait_commit"
                        self.protector.check_fences()
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
                                                     kind=fault_kind_of(exc),
                                                     detail=getattr(exc, "fault_detail", None))
                    except Exception:  # noqa: BLE001 -- heartbeats/peers' reports still reach the coordinator
                        pass
            # outside the handler: the error's traceback (whose frames hold the groups) is gone
            self._mark_gc()
            self.release_groups()
            if quiesce is None:
                quiesce = self._wait_for(("quiesce",), "quiesce after the error")
            if self.recover(quiesce, failed) is None:  # a shrink removed its DP replica: the entry point waits
                raise LeftToStandby(f"world rank {self.env.world_rank} left its DP replica in the shrink to "
                                    f"generation {self.generation}")

    def finish(self) -> None:
        """Normal end: close the protector (collective over the members)."""
        self.watchdog.close()
        if self.protector is not None:
            self.protector.close()
            self.protector = None

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

    def _load_state(self, opt: dict, par: dict, envelope: dict) -> None:
        self.engine.load_optimizer_shard(opt)
        self.engine.load_param_shard(par)
        self.engine.load_envelope(envelope)
