"""The per-step protector: what the training loop calls when resilience is enabled (docs/design.md section 4).

::

    protector.start_snapshot(engine)   # before forward_backward of step k: D2H + H2H of S(k-1) start
    loss = engine.forward_backward()
    engine.reduce_gradients()
    protector.wait_commit()            # before optimizer_step: local D2H done + k verified acks -> flip
    engine.optimizer_step()            # -> S(k)

With resilience disabled the loop calls none of this (no wrapper, no extra layer).

Threads of a rank while a Protector runs:

- the training thread: only ``start_snapshot`` (records a CUDA event, captures the tensor list and the
  envelope, enqueues) and ``wait_commit`` (waits, checks acks, flips). It makes no MPI call, except that
  under ``MPI_THREAD_FUNNELED``/``SINGLE`` it drives the H2H engine while waiting (then ``wait_commit``
  also waits until the replicas this rank holds for the same step are verified and acknowledged, and the
  copies no longer overlap compute).
- ``phoenix-copy``: D2H copy, the checksum (``resilience.checksum``) of every tensor, the index;
  verification of replicas received for others. No MPI.
- ``phoenix-h2h`` (``h2h.H2HEngine``): every MPI call of the runtime, non-blocking.

While a Protector runs, no other thread may call MPI unless the provided level is ``MPI_THREAD_MULTIPLE``;
call :meth:`Protector.close` first (recovery does).

Why a fault during a copy can only damage the buffer being written, and the newest *recoverable* step R
(the minimum over shards of the committed step) is always restorable everywhere:

- every pair of buffers is ping-pong: a D2H writes only the local *staging* buffer, a receive only the
  holder's *receiving* buffer; the committed buffer is never written while committed, and it verified
  before it became committed (locally: its CRCs were computed from it; at a holder: every CRC matched
  before the flip and the ack);
- the owner flips staging -> committed only after its own D2H and k acks with the CRC it computed; the
  holder flips receiving -> committed on its side as soon as its copy verified (before it acks), so a
  holder always has the owner's newest acknowledged step, and keeps the step before it in the other buffer;
- *commit fence*: every commit starts a non-blocking MIN all-reduce of the committed step over all ranks;
  a buffer holding step j-2 is overwritten (by the D2H of step j, or by the owner's send of step j at its
  holders) only after the fence showed every shard committed j-1. Hence every rank and holder keeps S(R)
  (committed or previous buffer) for the job-wide R, even if one rank dies mid-copy while others run ahead.
  Lost work on a fault is therefore at most the steps since R: the current partial step plus at most one.
"""

from __future__ import annotations

import collections
import json
import math
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch

from phoenix_hpc.errors import ReplicaDisagreement, ReplicationError
from phoenix_hpc.runtime import polled
from phoenix_hpc.runtime.buffers import (
    BufferSet,
    MemoryPlan,
    allocate_buffers,
    check_host_memory,
    read_mem_available,
)
from phoenix_hpc.runtime.checksum import DEFAULT_CHECKSUM, checksum_function, digest64
from phoenix_hpc.runtime.checksum_pool import available_cpus, resolve_threads
from phoenix_hpc.runtime.d2h_chunks import copy_chunk_problem
from phoenix_hpc.runtime.cpu_account import CpuAccount, Span, delta
from phoenix_hpc.runtime.d2h import D2H
from phoenix_hpc.runtime.mpi_faults import errors_return
from phoenix_hpc.runtime.interval import SAMPLES as INTERVAL_SAMPLES
from phoenix_hpc.test_env import REPLICATION_DELAY_ENV, parse_replication_delay
from phoenix_hpc.runtime.interval import Sample as IntervalSample
from phoenix_hpc.runtime.interval import choose_interval
from phoenix_hpc.runtime.h2h import (ACK_BAD_CHECKSUM, ACK_OK, FenceResult, H2HEngine, HeldSpec, chunk_ranges,
                                     make_tag_plan)
from phoenix_hpc.runtime.snapshot import (OPT, PARAM, SnapshotLayout, Unpacked, plan_layout, seal, unpack,
                                          verify)
from phoenix_hpc.topology import Placement


ABORT_CHECK_S = 0.1  # how often a blocked wait_commit calls Protector.abort_check, seconds
#: Protected steps whose :class:`StepTiming` a protector keeps (the benchmark's blocks are far shorter); the
#: means in :meth:`Protector.stats` cover every step.
STEP_HISTORY = 256


#: commits whose parameter digests every commit report repeats (control/agreement.py)
PARAM_DIGESTS_KEPT = 64


def hold_for_disagreement(differ: FenceResult | None, agreed_step: int | None, tp_size: int,
                          params=(), held_step: int | None = None) -> ReplicaDisagreement | None:
    """The error that holds a snapshot instead of letting it write, or None when it may write. Pure.

    ``differ``: the first completed commit fence of this generation whose DP replicas differed
    (:attr:`phoenix_hpc.runtime.h2h.H2HEngine.fence_differ`); ``agreed_step``: the newest fence step at which
    every stage agreed; ``tp_size``: the grid's tp (a fence stage index is ``pp * tp_size + tp``);
    ``params``: this rank's ``(step, digest)`` history; ``held_step``: the step the snapshot would overwrite.
    Every rank reads the same fence results, so every rank decides the same (docs/design.md section 6)."""
    if differ is None or not differ.differ:
        return None
    stages = [(i // tp_size, i % tp_size, lo, hi) for i, lo, hi in differ.differ]
    return ReplicaDisagreement(differ.step, agreed_step, stages, params, held_step)


@dataclass(frozen=True)
class CommitRecord:
    """Reported after every commit: shard ``shard_id`` has a verified local copy and k verified replicas
    of ``step`` (the state after ``step`` optimizer steps). ``recoverable_step`` is the job-wide minimum
    committed step known to this rank (from the last completed commit fence; None before the first)."""

    shard_id: str
    step: int
    generation: int
    holders: tuple[int, ...]
    exposed_wait_s: float
    recoverable_step: int | None
    crc: int | None = None  # combined CRC-32 of the optimizer part (what every holder acknowledged)
    interval: int = 1  # protection interval m of this snapshot: the next one is of step + interval
    param_digest: int | None = None  # digest64 of the parameter tensors' checksums (control/agreement.py)
    #: ``(step, param_digest)`` of this generation's newest :data:`PARAM_DIGESTS_KEPT` commits, oldest first
    param_digests: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class StepTiming:
    """Per protected step, in seconds: ``start_s`` spent in ``start_snapshot``; ``wait_s`` blocked in
    ``wait_commit``; ``exposed_s`` = both (what training lost); ``d2h_s`` copy + checksums (background);
    ``h2h_s`` first post to last ack (background). ``cpu_ns``: CPU nanoseconds of every runtime thread of
    this rank since the previous commit, per category of :mod:`phoenix_hpc.runtime.cpu_account`;
    ``wakeups``: rounds of the H2H engine thread's loop since the previous commit (each one after a sleep,
    unless a command was already queued; :attr:`~phoenix_hpc.runtime.h2h.H2HEngine.wakeups`), None when the
    training thread drives the engine (no engine thread)."""

    step: int
    start_s: float
    wait_s: float
    exposed_s: float
    d2h_s: float
    h2h_s: float
    cpu_ns: dict = field(default_factory=dict)
    wakeups: int | None = None


@dataclass
class _TimingTotals:
    """Sums over every :class:`StepTiming` added: step count, seconds of exposed wait (and its maximum),
    of background D2H and of H2H."""

    steps: int = 0
    exposed_s: float = 0.0
    exposed_max_s: float = 0.0
    d2h_s: float = 0.0
    h2h_s: float = 0.0

    def add(self, t: StepTiming) -> None:
        self.steps += 1
        self.exposed_s += t.exposed_s
        self.exposed_max_s = max(self.exposed_max_s, t.exposed_s)
        self.d2h_s += t.d2h_s
        self.h2h_s += t.h2h_s


@dataclass
class _Pending:
    step: int
    idx: int | None = None
    crc: int | None = None
    param_digest: int | None = None
    d2h_done: bool = False
    error: BaseException | None = None
    start_s: float = 0.0
    d2h_s: float = 0.0
    interval: int = 1  # protection interval m: committed before the optimizer step of step + interval
    t0: float = 0.0  # perf_counter when start_snapshot was called
    local_wait_s: float = 0.0  # blocked in wait_local (the live state's copy) before earlier optimizer steps


@dataclass
class _Setup:
    layout: SnapshotLayout
    plan: MemoryPlan
    buffers: BufferSet
    comm: Any
    holders_logical: tuple[int, ...]
    holders_comm: tuple[int, ...]
    held: list[HeldSpec]
    tag_plan: Any
    thread_level: int
    threaded: bool


def _received_after_close(spec, idx: int, step: int) -> None:
    """The H2H engine's ``on_received`` once its protector is closed: nothing is verified any more (the
    protector's copies are read only as they were at the close)."""


class Protector:
    """PHOENIX protection of one rank for one generation. Build with :meth:`create` (collective over
    ``comm``); never shared across generations (recovery closes it and creates a new one)."""

    def __init__(self, *, engine_coord, shard_id: str, grid: Mapping[str, int], generation: int, setup: _Setup,
                 chunk_bytes: int, commit_timeout_s: float | None, on_commit, log, fault_hook, device,
                 checksum: str = DEFAULT_CHECKSUM, interval_cap: int = 1, thread_nice: int = 0,
                 checksum_threads: int = 1, d2h_copy_chunk_bytes: int = 0, d2h_copy_coalesce: bool = False,
                 replica_agreement: bool = True):
        # test-only (phoenix_hpc/test_env.py, tests/e2e/test_hotswap.py's adaptive interval): seconds the copy
        # thread waits after a snapshot's local copy before handing its replica to the H2H engine, as a slow
        # replication path would; raises TestEnvError (a ValueError) naming the variable
        self._test_delay_s = parse_replication_delay(os.environ.get(REPLICATION_DELAY_ENV))
        if self._test_delay_s and log is not None:
            log(f"test-only {REPLICATION_DELAY_ENV}={self._test_delay_s:g}: every replica is handed to "
                "the H2H engine that many seconds late")
        self.shard_id = shard_id
        self.grid = dict(grid)
        self.coord = engine_coord.to_json()
        self.generation = generation
        self.layout = setup.layout
        # the layout's slots of the parameter tensors, whose checksums each commit's digest covers (in order);
        # with replica agreement off no digest is computed and the fence carries no stage pairs
        self.replica_agreement = bool(replica_agreement)
        self._param_slots = [i for i, sl in enumerate(self.layout.slots) if sl.part == PARAM]
        self.memory_plan = setup.plan
        self.buffers = setup.buffers
        self.holders = setup.holders_logical
        self.thread_level = setup.thread_level
        self.commit_timeout_s = commit_timeout_s
        self.on_commit = on_commit
        self.log = log
        self.fault_hook = fault_hook
        # called about every ABORT_CHECK_S while wait_commit blocks; it may raise to leave the wait (the
        # recovery driver polls the coordinator, so a quiesce ends a wait on a peer that will never ack)
        self.abort_check: Callable[[], None] | None = None
        self.d2h = D2H(device, checksum_threads, thread_nice, d2h_copy_chunk_bytes, d2h_copy_coalesce)
        self.checksum = checksum
        self.interval_cap = int(interval_cap)
        self.thread_nice = int(thread_nice)
        self.create_s: dict[str, float] = {}  # seconds per part of create() (recovery timings)
        self.interval = 1  # protection interval of the newest snapshot (runtime/interval.py)
        self.next_snapshot_step: int | None = None  # the state step the next snapshot must be of
        self._commits = 0  # commits (= fences started) in this generation
        # (step, parameter digest) of the newest commits: each commit report carries them all, so that the
        # DP peers' digests of one step meet at the coordinator although a node's heartbeats carry only each
        # slot's newest report (control/agreement.py)
        self.param_digests: collections.deque[tuple[int, int]] = collections.deque(maxlen=PARAM_DIGESTS_KEPT)
        self._proposal = 1  # the interval this rank proposes with its next fence
        self._samples: list[IntervalSample] = []
        self.cpu = CpuAccount()
        self._cpu_at_commit = self.cpu.totals()
        self._wakeups_at_commit = 0
        self.committed_step: int | None = None
        # the newest STEP_HISTORY steps' timings, and sums over every protected step of this generation (a
        # list of every step would grow for the whole job, by about 1 KiB a step)
        self.timings: collections.deque[StepTiming] = collections.deque(maxlen=STEP_HISTORY)
        self._totals = _TimingTotals()
        self.held_steps: dict[str, int] = {}
        self._pending: _Pending | None = None
        self._lock = threading.Lock()
        self._jobs: queue.Queue = queue.Queue()
        self._comm = setup.comm
        self._closed = False
        # the fence compares the DP replicas' parameter digests per (pp, tp) stage (runtime/h2h.py fence_vector)
        self._tp_size = int(self.grid.get("tp", 1))
        stage = int(self.coord.get("pp", 0)) * self._tp_size + int(self.coord.get("tp", 0))
        self.h2h = H2HEngine(setup.comm, list(setup.holders_comm), setup.held, generation, chunk_bytes,
                             setup.tag_plan, self._on_received, fault_hook=fault_hook, cpu=self.cpu,
                             thread_nice=self.thread_nice, stage=stage,
                             stages=self._tp_size * int(self.grid.get("pp", 1)) if self.replica_agreement else 0)
        self._worker = threading.Thread(target=self._work, name="phoenix-copy", daemon=True)
        self._worker.start()
        self.h2h.start(threaded=setup.threaded)

    # --- construction (collective) ---------------------------------------------------------------------
    @classmethod
    def create(
        cls,
        *,
        engine,
        comm,
        placement: Placement,
        logical_rank: int,
        grid: Mapping[str, int],
        generation: int,
        chunk_bytes: int,
        comm_rank_of: Mapping[int, int] | None = None,
        ranks_per_node: int = 1,
        commit_timeout_s: float | None = 30.0,
        on_commit: Callable[[CommitRecord], None] | None = None,
        log: Callable[[str], None] | None = print,
        mem_available_bytes: int | None = None,
        threaded: bool | None = None,
        fault_hook: Callable[[str, int, int], None] | None = None,
        device: torch.device | str | None = None,
        checksum: str = DEFAULT_CHECKSUM,
        interval_cap: int = 1,
        thread_nice: int = 0,
        arrive_timeout_s: float | None = None,
        checksum_threads: int | str = "auto",
        arrive_check: Callable[[], None] | None = None,
        d2h_copy_chunk_bytes: int = 0,
        d2h_copy_coalesce: bool = False,
        replica_agreement: bool = True,
    ) -> "Protector":
        """Set up protection for ``engine`` (collective: every active rank of the generation calls it).

        Args:
            engine: an ``engines.base.Engine``; its ``optimizer_shard``/``param_shard``/``envelope`` size
                the buffers.
            comm: the generation's MPI communicator (mpi4py), spanning exactly the active ranks. It is
                ``Dup``-ed; the runtime uses only its duplicate.
            placement: from ``topology.generation_placement`` for this generation (logical ranks). A placement
                with ``k == 0`` and no replicas protects the local snapshot only (no H2H; what the one-GPU
                check measures -- a job config always has k >= 1).
            logical_rank: this rank's logical rank; ``comm_rank_of`` maps logical ranks to ranks of
                ``comm`` (identity when None, as at generation 0).
            grid: ``{"tp", "pp", "dp"}`` sizes (written into every snapshot).
            chunk_bytes: H2H chunk size (``resilience.chunk_bytes``).
            ranks_per_node: ranks sharing this host's memory (for the memory check).
            commit_timeout_s: ``wait_commit`` gives up after this (None: never).
            on_commit: called in the training thread with a :class:`CommitRecord` after each commit.
            log: where the start-up memory line goes (None: nowhere).
            mem_available_bytes: override of ``/proc/meminfo`` MemAvailable (tests).
            threaded: force the H2H engine's mode; default: threaded iff ``MPI.Query_thread()`` >=
                ``MPI_THREAD_SERIALIZED``.
            fault_hook: drill hook, called as ``hook(phase, step, i)`` with phase ``d2h`` (copy thread,
                before the copy of step) and ``h2h_send_chunk`` (H2H engine, before chunk i of step).
            device: where the engine's tensors live (default: the first optimizer tensor's device).
            checksum: the checksum algorithm (``resilience.checksum``; :mod:`phoenix_hpc.runtime.checksum`).
            thread_nice: added to the nice value of the copy, H2H and checksum threads when they start
                (``resilience.thread_nice``; :func:`~phoenix_hpc.runtime.thread_priority.lower_thread_priority`).
            checksum_threads: threads that checksum the tensors a CUDA D2H copy landed
                (``resilience.checksum_threads``: an integer or ``"auto"``,
                :func:`~phoenix_hpc.runtime.checksum_pool.resolve_threads` over this process's CPUs; a CPU
                rank checksums in its copy thread).
            interval_cap: the largest protection interval the ranks may choose
                (``resilience.protect_every_max``; :mod:`phoenix_hpc.runtime.interval`); 1: every step.
            arrive_timeout_s: how long a rank waits for the last one to arrive (None: no bound). The wait is a
                sleeping one (:func:`phoenix_hpc.runtime.polled.barrier`): in a recovery the survivors
                arrive long before the spare they wait for, and the blocking collectives that follow
                would spin a core each meanwhile.
            arrive_check: called between the tests of that wait (``runtime/polled.wait``); what it raises (a
                recovery re-planned because a member was lost before it arrived) ends the construction before
                anything is allocated or duplicated.
            d2h_copy_chunk_bytes: a GPU rank's D2H copy commands of at most this many bytes
                (``resilience.d2h_copy_chunk_bytes``, :mod:`phoenix_hpc.runtime.d2h_chunks`); 0: one per tensor.
            d2h_copy_coalesce: a GPU rank's D2H copies runs of tensors of one device storage with one command
                (``resilience.d2h_copy_coalesce``).
            replica_agreement: ``resilience.replica_agreement`` (docs/design.md section 6); False: no parameter
                digest is computed, the commit fence carries only ``[step, -interval]`` (no stage pairs) and
                every :class:`CommitRecord` has ``param_digest`` None and no ``param_digests``. Must be the same
                on every rank (the fence's all-reduce length depends on it).

        Raises:
            RecoveryError: not every rank arrived within ``arrive_timeout_s``; what ``arrive_check`` raises.
            ReplicationError (on every rank, before anything is allocated): ``chunk_bytes <= 0``; ``d2h_copy_chunk_bytes`` not 0 or a positive multiple of 16;
                ``thread_nice`` outside 0..19; ``checksum_threads`` neither ``"auto"`` nor 1..64; this rank
                missing from the placement; a replica too large for the MPI tag space; any rank lacking host
                memory for its buffers (MemAvailable check); an allocation failure on any rank.
        """
        from mpi4py import MPI

        from phoenix_hpc.runtime.thread_priority import thread_nice_problem

        chunk_ranges(0, chunk_bytes)  # validates chunk_bytes before any collective call
        checksum_function(checksum)  # validates the checksum name before any collective call
        problem = copy_chunk_problem(d2h_copy_chunk_bytes)  # "" when allowed
        if problem:
            raise ReplicationError(problem)
        problem = thread_nice_problem(thread_nice)
        if problem is not None:
            raise ReplicationError(problem)
        opt, params, env = engine.optimizer_shard(), engine.param_shard(), engine.envelope()
        if device is None:
            device = (opt or params)[0][1].device if (opt or params) else torch.device("cpu")
        try:  # before any collective call
            n_checksum = resolve_threads(checksum_threads, torch.device(device).type == "cuda", available_cpus())
        except ValueError as exc:
            raise ReplicationError(str(exc)) from None
        coord = engine.coord
        shard_id = coord.shard_prefix()
        mine = placement.holders_of(logical_rank)
        if placement.k > 0 and (not mine or mine[0].shard_id != shard_id):
            raise ReplicationError(
                f"logical rank {logical_rank} ({shard_id}) has no replicas in the placement "
                f"(placement covers ranks {sorted({r.owner_rank for r in placement.replicas})})"
            )
        held_pl = placement.held_by(logical_rank)
        c_of = (lambda r: r) if comm_rank_of is None else (lambda r: comm_rank_of[r])
        example = {"format": 1, "shard_id": shard_id, "step": 2**40, "generation": 2**20, "grid": dict(grid),
                   "coord": coord.to_json(), "envelope": env}
        tc = {"start": time.perf_counter()}
        layout = plan_layout(opt, params, example)
        tc["layout"] = time.perf_counter()
        pin = torch.device(device).type == "cuda"

        # the first collective waits for the last member to arrive, sleeping (runtime/polled.py)
        polled.barrier(comm, math.inf if arrive_timeout_s is None else arrive_timeout_s,
                       f"rank {logical_rank} gen {generation}: waiting for every member to start protection",
                       check=arrive_check)
        pcomm = errors_return(comm.Dup())  # a dead peer's errors are returned, never fatal
        tc["arrive"] = time.perf_counter()
        try:
            sizes = pcomm.allgather(layout.replica_bytes)  # by comm rank
            held_sizes = tuple((r.shard_id, sizes[c_of(r.owner_rank)]) for r in held_pl)
            plan = MemoryPlan(layout.total_bytes, held_sizes)
            problem = None
            try:
                max_chunks = max(len(chunk_ranges(s, chunk_bytes)) for s in sizes)
                tag_plan = make_tag_plan(max_chunks, int(pcomm.Get_attr(MPI.TAG_UB)))
                avail = read_mem_available() if mem_available_bytes is None else mem_available_bytes
                check_host_memory(plan, avail, ranks_per_node)
            except ReplicationError as e:
                problem = str(e)
            problems = pcomm.allgather(problem)
            bad = [(r, p) for r, p in enumerate(problems) if p]
            if bad:
                raise ReplicationError(
                    "replication cannot start: "
                    + "; ".join(f"rank {r}: {p}" for r, p in bad[:4])
                    + (f" (and {len(bad) - 4} more ranks)" if len(bad) > 4 else "")
                )
            tc["check"] = time.perf_counter()
            buffers, problem = None, None
            try:
                buffers = allocate_buffers(plan, pin)
                tc["allocate"] = time.perf_counter()
            except ReplicationError as e:
                problem = str(e)
            problems = pcomm.allgather(problem)
            bad = [(r, p) for r, p in enumerate(problems) if p]
            if bad:
                buffers = None
                raise ReplicationError("replication cannot start: " + "; ".join(f"rank {r}: {p}" for r, p in bad[:4]))
        except BaseException:
            pcomm.Free()
            raise
        level = MPI.Query_thread()
        if threaded is None:
            threaded = level >= MPI.THREAD_SERIALIZED
        held = [HeldSpec(r.shard_id, c_of(r.owner_rank), sizes[c_of(r.owner_rank)], buffers.held[r.shard_id])
                for r in held_pl]
        setup = _Setup(layout, plan, buffers, pcomm, tuple(r.holder_rank for r in mine),
                       tuple(c_of(r.holder_rank) for r in mine), held, tag_plan, level, threaded)
        if log is not None:
            names = {MPI.THREAD_SINGLE: "SINGLE", MPI.THREAD_FUNNELED: "FUNNELED",
                     MPI.THREAD_SERIALIZED: "SERIALIZED", MPI.THREAD_MULTIPLE: "MULTIPLE"}
            log(f"phoenix runtime rank {logical_rank} ({shard_id}) gen {generation}: {plan.describe()}; "
                f"replicas to ranks {list(setup.holders_logical)}, holding {[s for s, _ in held_sizes]}; "
                f"MPI thread level {names.get(level, level)}, H2H {'in a progress thread' if threaded else 'driven by the training thread'}")
        tc["agree"] = time.perf_counter()
        prot = cls(engine_coord=coord, shard_id=shard_id, grid=grid, generation=generation, setup=setup,
                   chunk_bytes=chunk_bytes, commit_timeout_s=commit_timeout_s, on_commit=on_commit, log=log,
                   fault_hook=fault_hook, device=device, checksum=checksum, interval_cap=interval_cap,
                   thread_nice=thread_nice, checksum_threads=n_checksum, d2h_copy_chunk_bytes=d2h_copy_chunk_bytes,
                   d2h_copy_coalesce=d2h_copy_coalesce, replica_agreement=replica_agreement)
        tc["threads"] = time.perf_counter()
        # seconds per part of the construction (recovery timings): layout, the memory check and its agreement
        # (two collectives), allocation, the allocation's agreement, the threads' start
        keys = list(tc)
        prot.create_s = {k: tc[k] - tc[p] for p, k in zip(keys, keys[1:])}
        return prot

    # --- the two calls of the training loop -------------------------------------------------------------
    def start_snapshot(self, engine) -> None:
        """Start protecting the engine's current state S(engine.step): D2H into staging, then H2H of its
        optimizer part to the holders, both in the background. Call before ``forward_backward``.

        Raises ReplicationError if the previous snapshot was never committed or the runtime failed."""
        t0, c0, m0 = time.perf_counter(), time.thread_time_ns(), self.cpu.totals()["mpi"]
        self._raise_if_failed()
        if self._pending is not None:
            raise ReplicationError(f"start_snapshot: step {self._pending.step} was started but never committed")
        step = int(engine.step)
        interval = self._agreed_interval()
        token = self.d2h.mark()
        job = _Pending(step, interval=interval, t0=t0)
        self.interval = interval
        self._pending = job
        if self.buffers.held:
            self.h2h.expect(step)  # the owners' replicas of this step come from now on: the engine polls for them
        self._jobs.put(("snapshot", job, token, engine.optimizer_shard(), engine.param_shard(), engine.envelope()))
        if not self.h2h.threaded:
            self.h2h.poll()
        job.start_s = time.perf_counter() - t0
        self._bookkeeping(c0, m0)

    def due(self, engine_step: int) -> bool:
        """Whether the loop starts a snapshot of ``S(engine_step)`` now: none is pending and the protection
        interval since the last one has passed (always with interval 1)."""
        return self._pending is None and (self.next_snapshot_step is None or engine_step >= self.next_snapshot_step)

    def pending(self) -> bool:
        """Whether a snapshot was started and not committed yet."""
        return self._pending is not None

    def commit_due(self, engine_step: int) -> bool:
        """Whether the pending snapshot must be committed before the optimizer step that ends step
        ``engine_step + 1`` (the last step of its interval); otherwise only :meth:`wait_local` is needed."""
        job = self._pending
        return job is not None and engine_step + 1 >= job.step + job.interval

    def wait_local(self, timeout_s: float | None = None) -> float:
        """Block until the pending snapshot's local copy is done (it reads the live state, which the next
        optimizer step changes); returns the seconds blocked. Raises ReplicationError if it failed or timed
        out, or what :attr:`abort_check` raises."""
        t0 = time.perf_counter()
        job = self._pending
        if job is None or job.d2h_done:
            return 0.0
        timeout_s = self.commit_timeout_s if timeout_s is None else timeout_s
        ok = self._wait_pending(job, lambda: job.d2h_done, timeout_s)
        if not ok:
            raise ReplicationError(f"local copy of step {job.step} of {self.shard_id} timed out after {timeout_s} s")
        waited = time.perf_counter() - t0
        job.local_wait_s += waited
        return waited

    def _wait_pending(self, job: _Pending, ready: Callable[[], bool], timeout_s: float | None) -> bool:
        """Wait (driving H2H) until ``ready()``, the snapshot ``job`` or the engine failed, or ``timeout_s``
        passed (None: no limit), calling :attr:`abort_check` about every ``ABORT_CHECK_S`` seconds. Returns
        whether ``ready()`` held. Raises what the engine or the copy thread failed with (ReplicationError),
        or what :attr:`abort_check` raises."""
        deadline = time.monotonic() + (float("inf") if timeout_s is None else timeout_s)
        while True:
            left = deadline - time.monotonic()
            ok = self.h2h.wait(ready, max(0.0, min(left, ABORT_CHECK_S)), drive=True)
            if ok or self.h2h.error is not None or job.error is not None or left <= ABORT_CHECK_S:
                break
            if self.abort_check is not None:
                self.abort_check()  # may raise (e.g. the coordinator asked this rank to quiesce)
        self._raise_if_failed()
        if job.error is not None:
            self._pending = None
            if isinstance(job.error, ReplicaDisagreement):  # held on purpose: reported as silent corruption
                raise job.error
            raise ReplicationError(f"snapshot of step {job.step} failed: {job.error}") from job.error
        return ok

    def _agreed_interval(self) -> int:
        """The interval of the snapshot about to start (the ``n``-th of this generation): 1 for the first two;
        then the largest proposal of the fence started by commit ``n - 2``, the same on every rank (waits for
        that fence, started at least one snapshot ago)."""
        n = self._commits
        if n < 2 or self.interval_cap <= 1:
            return 1
        ok = self.h2h.wait(lambda: self.h2h.fences_done >= n - 1, self.commit_timeout_s, drive=True)
        self._raise_if_failed()
        if not ok:
            raise ReplicationError(f"commit fence {n - 2} of {self.shard_id} did not complete within "
                                   f"{self.commit_timeout_s} s")
        return max(1, min(self.interval_cap, self.h2h.fenced_interval(n - 2)))

    def wait_commit(self, timeout_s: float | None = None) -> CommitRecord:
        """Wait for the local D2H and every holder's verified ack of the snapshot started last, then flip
        staging -> committed and start the commit fence. Call before ``optimizer_step``.

        Raises:
            ReplicationError: no snapshot was started; the wait exceeded ``timeout_s`` (default
                ``commit_timeout_s``), naming what is missing; a holder reported a checksum mismatch or
                acked another step/generation; the copy or H2H thread failed.
            Whatever :attr:`abort_check` raises (checked about every ``ABORT_CHECK_S`` seconds of waiting).
        """
        t0, c0, m0 = time.perf_counter(), time.thread_time_ns(), self.cpu.totals()["mpi"]
        job = self._pending
        if job is None:
            raise ReplicationError("wait_commit called without start_snapshot")
        timeout_s = self.commit_timeout_s if timeout_s is None else timeout_s
        n = len(self.holders)

        def ready() -> bool:
            if job.error is not None:
                return True
            if not (job.d2h_done and len(self.h2h.acks.get(job.step, {})) >= n):
                return False
            # Unthreaded (MPI_THREAD_FUNNELED): MPI progresses only while the training thread is in here, so
            # also stay until the replicas this rank holds are verified and acknowledged for the same step;
            # otherwise a peer could wait for an ack that sits in our queue while we block in a collective.
            return self.h2h.threaded or (
                all(self.held_steps.get(s, -1) >= job.step for s in self.buffers.held) and self.h2h.queue_empty()
            )

        ok = self._wait_pending(job, ready, timeout_s)
        if not ok:
            got = self.h2h.acks.get(job.step, {})
            missing = [h for h, c in zip(self.holders, self.h2h.holders) if c not in got]
            raise ReplicationError(
                f"commit of step {job.step} of {self.shard_id} timed out after {timeout_s} s: "
                + ("local D2H not done; " if not job.d2h_done else "")
                + (f"no ack from holder rank(s) {missing}" if missing else "")
                + f" (runtime communicator ranks; H2H: {self.h2h.describe()})"
            )
        acks = self.h2h.acks.pop(job.step, {})
        for (h, c) in zip(self.holders, self.h2h.holders):
            status, crc = acks[c]
            if status != ACK_OK or crc != job.crc:
                self._pending = None
                why = {ACK_BAD_CHECKSUM: "its copy failed the checksum", -1: "it acked another step or generation"}
                raise ReplicationError(
                    f"replica of {self.shard_id} step {job.step} at holder rank {h} is not valid: "
                    f"{why.get(status, f'ack crc {crc:#x} != {job.crc:#x}')}"
                )
        self.buffers.local.commit(job.idx, job.step)
        self.committed_step = job.step
        wait_s = time.perf_counter() - t0
        h2h_s = self.h2h.send_s.pop(job.step, 0.0)
        exposed = job.start_s + job.local_wait_s + wait_s
        if self.interval_cap > 1:
            window = max(0.0, time.perf_counter() - job.t0 - exposed) / job.interval
            self._samples = (self._samples + [IntervalSample(window, job.d2h_s + h2h_s, exposed / job.interval)])[
                -INTERVAL_SAMPLES:]
            self._proposal = choose_interval(job.interval, self._samples, self.interval_cap)
        self.h2h.fence(job.step, self._proposal, job.param_digest)
        self._commits += 1
        self.next_snapshot_step = job.step + job.interval
        self._bookkeeping(c0, m0)
        now = self.cpu.totals()
        timing = StepTiming(job.step, job.start_s, job.local_wait_s + wait_s, exposed, job.d2h_s, h2h_s,
                            delta(now, self._cpu_at_commit),
                            self.h2h.wakeups - self._wakeups_at_commit if self.h2h.threaded else None)
        self.timings.append(timing)
        self._totals.add(timing)
        self._cpu_at_commit, self._wakeups_at_commit = now, self.h2h.wakeups
        self._pending = None
        if job.param_digest is not None:
            self.param_digests.append((job.step, job.param_digest))
        rec = CommitRecord(self.shard_id, job.step, self.generation, self.holders, exposed,
                           self.h2h.fenced_step, job.crc, job.interval, job.param_digest, tuple(self.param_digests))
        if self.on_commit is not None:
            self.on_commit(rec)
        return rec

    def flush(self, engine, timeout_s: float | None = None) -> CommitRecord:
        """Protect the final state (after the last ``optimizer_step``): commits a pending snapshot first,
        then ``start_snapshot`` + ``wait_commit``."""
        if self._pending is not None:
            self.wait_commit(timeout_s)
        self.start_snapshot(engine)
        return self.wait_commit(timeout_s)

    def check_fences(self, timeout_s: float | None = None) -> None:
        """Wait until every commit fence this generation started has completed, then raise
        :class:`~phoenix_hpc.errors.ReplicaDisagreement` if one showed DP replicas whose parameters differ.
        Collective in effect (every rank's fences must complete): call it on every rank at the end of the
        training, where no later snapshot reads the last fence.

        Raises:
            ReplicaDisagreement: a fence of this generation showed replicas that differ.
            ReplicationError: the fences did not complete within ``timeout_s`` (default ``commit_timeout_s``),
                or the runtime failed.
        """
        n = self._commits
        timeout_s = self.commit_timeout_s if timeout_s is None else timeout_s
        ok = self.h2h.wait(lambda: self.h2h.fences_done >= n, timeout_s, drive=True)
        self._raise_if_failed()
        if not ok:
            raise ReplicationError(f"the commit fences of {self.shard_id} did not complete within {timeout_s} s")
        held = hold_for_disagreement(self.h2h.fence_differ, self.h2h.fence_agreed_step, self._tp_size,
                                     tuple(self.param_digests))
        if held is not None:
            raise held

    # --- reading copies (recovery, rollback, tests) -------------------------------------------------------
    @property
    def recoverable_step(self) -> int | None:
        """Job-wide minimum committed step from the newest completed commit fence (None before one)."""
        return self.h2h.fenced_step

    @property
    def wedged(self) -> bool:
        """True when :meth:`close` with ``abandon`` found the H2H thread stuck inside MPI (runtime/h2h.py,
        ``ABANDON_JOIN_S``): this process cannot take part in another generation."""
        return self.h2h.wedged

    @property
    def abandon_report(self):
        """What :meth:`close` with ``abandon`` did with the MPI requests still posted (None before it, or when
        the H2H thread was wedged and MPI was not touched)."""
        return self.h2h.abandon_report

    def copy_steps(self) -> tuple[list[int], dict[str, list[int]]]:
        """Steps this rank can still restore, committed first: its local snapshot's, and per held shard the
        replica's (both ping-pong buffers, docs/design.md section 4). Read with :meth:`local_snapshot` /
        :meth:`held_replica` ``(step=...)``, which verify the checksums."""
        return (self.buffers.local.verified_steps(),
                {sid: pp.verified_steps() for sid, pp in self.buffers.held.items()})

    def reverify_held(self) -> tuple[list[tuple[str, int, int, int]], list[tuple[str, int, str]]]:
        """Verify every held replica buffer again (header, index and the checksum of every optimizer tensor;
        its shard id and step as the buffer says) and forget each one that fails, so that a copy corrupted
        in host memory since it arrived is never offered to a recovery. Call after :meth:`close`.

        Returns ``(good, bad)``: ``good`` is ``[(shard id, step, generation, combined opt CRC-32), ...]`` of
        the copies that verify (the CRC is what the owner sealed and the holder acknowledged), ``bad`` is
        ``[(shard id, step, reason), ...]`` of the copies forgotten. Costs one CRC pass over the held
        replicas (on a GPU rank on the checksum threads, :mod:`phoenix_hpc.runtime.checksum_pool`)."""
        good, bad = [], []
        for sid, pp in self.buffers.held.items():
            for step in pp.verified_steps():
                buf = pp.find(step)
                try:  # on a GPU rank on the checksum threads (runtime/checksum_pool.py)
                    h, crc = verify(buf, (OPT,), pool=self.d2h.checksums)
                    if h.step != step or h.index.get("shard_id") != sid:
                        raise ReplicationError(f"buffer holds {h.index.get('shard_id')} step {h.step}")
                except ReplicationError as exc:
                    pp.invalidate(step)
                    bad.append((sid, step, str(exc)))
                else:
                    good.append((sid, step, int(h.generation), crc))
        self.d2h.checksums.close()  # called after close(): the threads this pass started end with it
        return good, bad

    def held_shards(self) -> list[str]:
        return list(self.buffers.held)

    def held_replica(self, shard_id: str, step: int | None = None) -> Unpacked:
        """Verified copy of the replica of ``shard_id`` this rank holds: the committed one, or the one of
        ``step`` (committed or previous buffer). Only the opt part (``opt/...`` tensors) and the envelope.

        Reading the *previous* buffer while the runtime still runs may race with a receive; recovery reads
        after :meth:`close`. Raises ReplicationError when this rank does not hold the shard, has no copy of
        that step, or the copy fails a checksum."""
        pp = self.buffers.held.get(shard_id)
        if pp is None:
            raise ReplicationError(f"this rank holds no replica of {shard_id} (holds {self.held_shards()})")
        return self._read(pp, step, (OPT,), f"replica of {shard_id}")

    def local_snapshot(self, step: int | None = None, copy: bool = True) -> Unpacked:
        """Verified local snapshot (optimizer + param shard + envelope): committed, or of ``step``.
        ``copy=False``: views of the buffer (:func:`~phoenix_hpc.runtime.snapshot.unpack`); only once this
        protector is closed (its copy thread joined, so no copy can write the buffer)."""
        if not copy and not self._closed:
            raise ReplicationError("views of the local snapshot are only safe from a closed protector")
        return self._read(self.buffers.local, step, (OPT, PARAM), "local snapshot", copy)

    def _read(self, pp, step, parts, what, copy: bool = True) -> Unpacked:
        if step is None:
            s, buf = pp.committed()
        else:
            s, buf = step, pp.find(step)
        if buf is None:
            raise ReplicationError(f"no verified {what} of step {step if step is not None else '(committed)'}")
        u = unpack(buf, parts, copy)
        if u.step != s:
            raise ReplicationError(f"{what}: buffer says step {u.step}, expected {s}")
        return u

    # --- lifecycle ----------------------------------------------------------------------------------------
    def close(self, abandon: bool = False, dead_peers: frozenset[int] = frozenset()) -> None:
        """Stop the copy and H2H threads and free the runtime communicator. Without ``abandon`` (normal end)
        outstanding transfers and fences complete first (all ranks close together); with ``abandon``
        (after a fault) nothing waits on peers and the communicator is not freed; requests to
        ``dead_peers`` (ranks of the runtime's communicator the coordinator declared dead; the launcher's
        communicator numbers members by logical rank, so these are logical ranks) are freed at once
        (:meth:`phoenix_hpc.runtime.h2h.H2HEngine.stop`). Buffers stay readable."""
        if self._closed:
            return
        self._closed = True
        # first: draining needs the copy thread to verify incoming replicas
        self.h2h.stop(abandon=abandon, dead_peers=frozenset(dead_peers))
        self._jobs.put(None)
        self._worker.join(timeout=30)
        self.d2h.forget()
        # the H2H engine called back into this protector (a bound method: a reference cycle), so a closed
        # protector was freed only by the cyclic garbage collector, which in a rank runs rarely: after a
        # recovery the previous generation's host buffers stayed until the next one. No replica arrives any
        # more; without the cycle the buffers go as soon as the last user drops the protector
        self.h2h.on_received = _received_after_close
        if not abandon:
            self._comm.Free()

    def stats(self) -> dict[str, Any]:
        """Summary of this generation's protected steps: ``steps`` (all of them), exposed wait (mean/max, s),
        background D2H/H2H (mean, s), the checksum, and for the newest :data:`STEP_HISTORY` steps the CPU
        nanoseconds per step and category (``cpu_ns_per_step``: one dict
        per step, :attr:`StepTiming.cpu_ns`) and the H2H engine's wake-ups per step (``wakeups_per_step``);
        then the bytes behind them per step: ``snapshot_bytes`` copied and checksummed locally,
        ``sent_bytes`` (replica x holders) and ``received_bytes`` (held replicas, each checksummed once)."""
        n = self._totals.steps
        if not n:
            return {"steps": 0}
        t = self.timings
        return {
            "checksum": self.checksum,
            "cpu_ns_per_step": [x.cpu_ns for x in t],
            "wakeups_per_step": [x.wakeups for x in t],
            "sent_bytes": self.layout.replica_bytes * len(self.holders),
            "received_bytes": sum(p.nbytes for p in self.buffers.held.values()),
            "steps": n,
            "exposed_wait_mean_s": self._totals.exposed_s / n,
            "exposed_wait_max_s": self._totals.exposed_max_s,
            "d2h_mean_s": self._totals.d2h_s / n,
            "h2h_mean_s": self._totals.h2h_s / n,
            "snapshot_bytes": self.layout.total_bytes,
            "replica_bytes": self.layout.replica_bytes,
            "host_buffer_bytes": self.memory_plan.total_bytes,
        }

    # --- internals ------------------------------------------------------------------------------------------
    def _bookkeeping(self, c0: int, m0: int) -> None:
        """Count this thread's CPU time since ``c0`` as bookkeeping, less what it spent driving MPI since
        the ``mpi`` total was ``m0`` (unthreaded mode; the engine counted that itself)."""
        own_mpi = 0 if self.h2h.threaded else self.cpu.totals()["mpi"] - m0
        self.cpu.add("bookkeeping", time.thread_time_ns() - c0 - own_mpi)

    def _raise_if_failed(self) -> None:
        if self.h2h.error is not None:
            raise ReplicationError(f"H2H replication failed: {self.h2h.error}") from self.h2h.error

    def _on_received(self, spec: HeldSpec, idx: int, step: int) -> None:
        self._jobs.put(("verify", spec, idx, step))

    def _work(self) -> None:
        from phoenix_hpc.runtime.thread_priority import lower_thread_priority

        lower_thread_priority(self.thread_nice)
        while True:
            item = self._jobs.get()
            if item is None:
                return
            if item[0] == "snapshot":
                self._do_snapshot(*item[1:])
            else:
                self._do_verify(*item[1:])

    def _do_snapshot(self, job: _Pending, token, opt, params, envelope) -> None:
        c0 = time.thread_time_ns()
        inner = 0  # CPU ns of this call counted as copy or checksum
        try:
            t0 = time.perf_counter()
            local = self.buffers.local
            old = local.target_content_step()
            if old is not None:
                # commit fence: overwrite step `old` only once every shard committed old+1
                fenced = self.h2h.wait(
                    lambda: self.h2h.fenced_step is not None and self.h2h.fenced_step >= old + 1, None, drive=False
                )
                self._raise_if_failed()
                if not fenced:
                    raise ReplicationError(f"stopped before every shard committed step {old + 1}")
            # replicas that differed at a fence: this copy would overwrite (or follow) the last step they
            # agreed at; held, so that a recovery can restore that step (docs/design.md section 6). Read once
            # per snapshot; the digest history is copied only when there is a disagreement to report
            differ = self.h2h.fence_differ
            if differ is not None:
                held = hold_for_disagreement(differ, self.h2h.fence_agreed_step, self._tp_size,
                                             tuple(self.param_digests), old)
                if held is not None:
                    raise held
            if self.fault_hook is not None:
                self.fault_hook("d2h", job.step, 0)
            idx = local.target_idx()
            buf = local.begin_write(idx)
            # its views and checks count as bookkeeping; its loop's CPU time as copy and checksum
            sums, copy_ns, sum_ns = self.d2h.copy_checksummed(token, buf, self.layout, opt, params, self.checksum)
            # on one thread the checksums ran in this one; on several, in the checksum threads
            inner += copy_ns + (sum_ns if self.d2h.checksums.threads == 1 else 0)
            self.cpu.add("copy", copy_ns)
            self.cpu.add("checksum", sum_ns)
            envelope = json.loads(json.dumps(envelope))
            crc = seal(buf, self.layout, shard_id=self.shard_id, step=job.step, generation=self.generation,
                       grid=self.grid, coord=self.coord, envelope=envelope, checksum=self.checksum, sums=sums)
            job.idx, job.crc, job.d2h_s = idx, crc, time.perf_counter() - t0
            # the parameters' checksums, which the DP peers' must equal (control/agreement.py): 8 bytes
            if self.replica_agreement:
                job.param_digest = digest64([sums[i] for i in self._param_slots])  # seal checked len(sums)
            job.d2h_done = True  # the live state is copied: the next optimizer step may run
            self.h2h.notify()
            if self._test_delay_s > 0:
                time.sleep(self._test_delay_s)
            if self.holders:
                self.h2h.send_replica(job.step, buf.numpy()[: self.layout.opt_end])
        except BaseException as e:  # noqa: BLE001 -- reported by wait_commit in the training thread
            job.error = e
        finally:
            job.d2h_done = True
            self.h2h.notify()
            self.cpu.add("bookkeeping", time.thread_time_ns() - c0 - inner)

    def _do_verify(self, spec: HeldSpec, idx: int, step: int) -> None:
        c0 = time.thread_time_ns()
        buf = spec.pingpong.bufs[idx]
        try:
            pool = self.d2h.checksums
            if pool.threads > 1:  # a GPU rank: on the checksum threads, whose CPU time they report
                t: dict = {}
                h, crc = verify(buf, (OPT,), pool=pool, timings=t)
                self.cpu.add("checksum", t["checksum_ns"])
                inner = 0  # this thread's own part (submitting, waiting) stays bookkeeping
            else:
                with Span(self.cpu, "checksum") as sp:
                    h, crc = verify(buf, (OPT,))
                inner = time.thread_time_ns() - sp.t0
            if h.step != step or h.generation != self.generation or h.index["shard_id"] != spec.shard_id:
                raise ReplicationError(
                    f"received {h.index['shard_id']} step {h.step} gen {h.generation}, expected "
                    f"{spec.shard_id} step {step} gen {self.generation}"
                )
        except ReplicationError as e:
            if self.log is not None:
                self.log(f"phoenix runtime: replica of {spec.shard_id} step {step} rejected: {e}")
            self.h2h.send_ack(spec, step, ACK_BAD_CHECKSUM, 0)
            return
        spec.pingpong.commit(idx, step)
        self.held_steps[spec.shard_id] = step
        self.h2h.send_ack(spec, step, ACK_OK, crc)
        self.cpu.add("bookkeeping", time.thread_time_ns() - c0 - inner)
