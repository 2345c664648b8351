"""H2H: replicate optimizer shards between hosts over MPI point-to-point (docs/design.md sections 3-4).

One :class:`H2HEngine` per rank owns *every* MPI call the runtime makes after start-up. Other threads only
enqueue commands (send a replica, send an acknowledgement, start a commit fence) and wait on results. This
is what MPI's ``MPI_THREAD_SERIALIZED`` level allows (one thread in MPI at a time), and it is also correct
under ``MPI_THREAD_MULTIPLE``. Under ``MPI_THREAD_FUNNELED`` or ``SINGLE`` only the main thread may call
MPI, so the engine runs without a thread and the training thread drives it (:meth:`H2HEngine.poll`) while
it waits in ``wait_commit``; copies then no longer overlap compute. Measured with this project's stack
(Open MPI 4.1.4 + mpi4py 4.1, ``mpirun`` and ``srun --mpi=pmix``): ``MPI.Query_thread()`` returns
``MPI_THREAD_MULTIPLE`` (mpi4py requests it by default).

Wire protocol, on the runtime's private communicator (a ``Dup`` of the generation's communicator), for
the replica of step s from owner O to holder H:

1. O -> H, tag ``ANNOUNCE_TAG``: int64[3] = (step, generation, nbytes).
2. O -> H, tags ``data_tag(step, i)``: chunk i of the replica (``buf[:opt_end]``), ``chunk_bytes`` each
   (the last may be shorter). The step is part of the tag, so a stale chunk can never match.
3. H verifies every optimizer tensor's CRC-32 against the index it received, flips its receiving buffer to
   committed if all match, then H -> O, tag ``ACK_TAG``: int64[4] = (step, generation, status, combined
   CRC) with status 0 = verified, 1 = checksum mismatch.

Besides, each commit starts a non-blocking ``MIN`` all-reduce of the committed step over the communicator
(the *commit fence*): its result is the job-wide recoverable step, and a buffer holding step j-2 is only
overwritten once the fence shows every shard committed j-1 (see ``protector``). The same all-reduce carries
each rank's parameter digest in the slot pair of its (pp, tp) stage (:func:`fence_vector`), so its result
also says, per stage, whether the data-parallel replicas' parameters of that step are equal
(:func:`read_fence`; docs/design.md section 6, Replica agreement).

Chunks go through :class:`ChunkWindow`, at most ``window`` in flight per message; it is the one windowed
chunk transfer of the package: :class:`H2HEngine` drives one per replica in flight, and a recovery's
transfers (:class:`BufferTransfer`, the same wire protocol, driven together by a :class:`TransferSet`) one
each.

All operations are non-blocking (``Isend``/``Irecv``/``Iallreduce`` + ``Test``): Open MPI's blocking waits
spin a core, which on a busy node steals it from compute. The engine thread sleeps between polls: after a
round in which something completed (a command posted, a request done) for ``busy_sleep_s``, then twice as
long after every round in which nothing did, up to ``idle_sleep_s``, while a message of this rank is in
flight or a replica is expected: a held shard has not yet received the replica of the newest step this
rank started to protect (:meth:`H2HEngine.expect`, called when its own snapshot starts; every rank protects
the same steps, so its owners' announces come from then on). When nothing is in flight and nothing is
expected (the *quiet* state: from the last acknowledgement or fence result of a step until the next
snapshot starts), it sleeps until a command arrives (the next snapshot's ``expect`` wakes it), or
``quiet_sleep_s`` at most: a replica announced before this rank started that step's snapshot is then seen
at most ``quiet_sleep_s`` late. A command from another thread always wakes it at once. Every wake-up costs
CPU time whether or not anything moved (a timed sleep and wake-up of a thread: 35-150 us of its CPU time on
the 2-core benchmark host, more the longer it slept; ``scripts/bench-h2h-engine`` prints it), which is why
the engine does not poll while quiet. Its CPU time goes to the ``mpi`` category of the protector's
:class:`~phoenix_hpc.runtime.cpu_account.CpuAccount`.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from phoenix_hpc.errors import ReplicationError

ANNOUNCE_TAG = 1
ACK_TAG = 2
DATA_TAG_BASE = 16
ACK_OK, ACK_BAD_CHECKSUM = 0, 1
DEFAULT_WINDOW = 4  # chunks in flight per peer and direction
#: the engine thread's sleeps (module doc): after a round that moved something, the longest while a message is in
#: flight or expected, and the longest while quiet (seconds)
BUSY_SLEEP_S, IDLE_SLEEP_S, QUIET_SLEEP_S = 50e-6, 2e-3, 20e-3
#: Completed commit fences whose interval proposals are kept. The protector reads the proposal of the fence
#: started two commits before the snapshot it starts, and fences complete in order, so at most the newest
#: two are ever read.
FENCES_KEPT = 4
INT64_MAX = (1 << 63) - 1
#: Seconds an abandoning rank waits for the engine thread to leave its poll. Every MPI call the thread makes
#: is non-blocking, so it returns within one poll round (milliseconds) -- unless the MPI library itself
#: deadlocked. Open MPI 4.1's TCP transport does when a peer dies while a large message to it is being
#: written (RDMA pipeline protocol): ``mca_btl_tcp_frag_send`` fails holding the endpoint's send lock,
#: ``mca_btl_tcp_endpoint_close`` completes the pending fragments in error, and ob1's completion sends its
#: FIN on the same endpoint, which waits for that lock for ever (stack taken with gdb on the local cluster,
#: docs/design.md section 12). Such a thread never returns, and nothing else in the process can use MPI
#: over TCP any more. The bound stays well under the coordinator's quiesce timeout, so the member leaves at
#: once instead of being declared silent later.
ABANDON_JOIN_S = 3.0


def chunk_ranges(nbytes: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """``[start, end)`` byte ranges of the chunks of an ``nbytes`` message. Raises ReplicationError when
    ``chunk_bytes <= 0``; chunks are capped at 2**31-1 bytes (MPI counts are C ints)."""
    if not isinstance(chunk_bytes, int) or chunk_bytes <= 0:
        raise ReplicationError(f"resilience.chunk_bytes must be a positive number of bytes, got {chunk_bytes!r}")
    c = min(chunk_bytes, 2**31 - 1)
    return [(s, min(s + c, nbytes)) for s in range(0, nbytes, c)] or [(0, 0)]



def _signed64(d: int) -> int:
    """An unsigned 64-bit value as the int64 with the same bits (two's complement)."""
    return d - (1 << 64) if d >= 1 << 63 else d


def fence_vector(step: int, interval: int, digest: int | None, stage: int, stages: int) -> np.ndarray:
    """What one rank contributes to the commit fence's ``MIN`` all-reduce: int64[2 + 2 stages] =
    ``[step, -interval]`` then one pair per (pp, tp) stage (index ``pp * tp_size + tp``): ``[d, ~d]`` at
    this rank's ``stage`` (``d``: its parameter digest, the 64 bits read as int64), ``INT64_MAX`` in every
    other pair and where ``digest`` is None. The minimum over ranks of ``d`` is the stage's smallest digest,
    of ``~d`` (bitwise not, ``-d - 1``: unlike ``-d`` it cannot overflow) the bitwise not of its largest.
    Pure.

    Raises:
        ValueError: ``stage`` outside ``0 .. stages - 1`` while a digest is given, or a digest outside
            ``0 .. 2**64 - 1``.
    """
    v = np.full(2 + 2 * stages, INT64_MAX, dtype=np.int64)
    v[0], v[1] = step, -interval
    if digest is not None:
        if not 0 <= stage < stages:
            raise ValueError(f"fence digest of stage {stage}: the fence has {stages} stage(s)")
        if not 0 <= int(digest) < 1 << 64:
            raise ValueError(f"fence digest {digest} is not a 64-bit unsigned value")
        d = _signed64(int(digest))
        v[2 + 2 * stage], v[3 + 2 * stage] = d, ~d
    return v


@dataclass(frozen=True)
class FenceResult:
    """One completed commit fence: ``step`` (the minimum committed step over all ranks), ``interval`` (the
    largest protection interval proposed), ``differ``: ``((stage, smallest digest, largest digest), ...)`` of
    the stages whose DP replicas reported different parameter digests (shown as unsigned 64-bit values,
    ordered as the int64 the fence compares: equality is all that is judged; empty when every stage
    agrees), and ``compared``: the stages with at least one digest."""

    step: int
    interval: int
    differ: tuple[tuple[int, int, int], ...] = ()
    compared: int = 0


def read_fence(result: np.ndarray, stages: int) -> FenceResult:
    """Read the ``MIN`` all-reduce of every rank's :func:`fence_vector` (int64[2 + 2 stages]). A stage whose
    pair is ``INT64_MAX`` twice had no digest (not compared); otherwise its replicas agree exactly when the
    smallest digest equals the largest. Pure."""
    # read every step on the engine thread: one vectorised pass over the stages, Python ints only for a difference
    lo, hi = result[2:2 + 2 * stages:2], ~result[3:3 + 2 * stages:2]
    seen = (lo != INT64_MAX) | (hi != ~INT64_MAX)
    differ = tuple((int(i), int(lo[i]) % (1 << 64), int(hi[i]) % (1 << 64)) for i in np.flatnonzero(seen & (lo != hi)))
    return FenceResult(int(result[0]), int(-result[1]), differ, int(np.count_nonzero(seen)))

@dataclass(frozen=True)
class TagPlan:
    """Data tags ``DATA_TAG_BASE + ((step mod step_mod) << chunk_bits | chunk)``, all <= the MPI tag bound."""

    chunk_bits: int
    step_mod: int

    def data_tag(self, step: int, chunk: int) -> int:
        return DATA_TAG_BASE + (((step % self.step_mod) << self.chunk_bits) | chunk)


def make_tag_plan(max_chunks: int, tag_ub: int) -> TagPlan:
    """Tag plan for messages of up to ``max_chunks`` chunks under ``MPI.TAG_UB`` = ``tag_ub``.

    Raises ReplicationError when fewer than 4 steps fit in the tag space (chunk size far too small)."""
    bits = max(1, (max(1, max_chunks) - 1).bit_length())
    step_mod = (tag_ub - DATA_TAG_BASE) >> bits
    if step_mod < 4:
        raise ReplicationError(
            f"a replica needs {max_chunks} chunks; with MPI_TAG_UB={tag_ub} that leaves no room for the step in "
            "the tag. Raise resilience.chunk_bytes"
        )
    return TagPlan(bits, step_mod)


class ChunkWindow:
    """The chunks of one message, posted at most ``window`` at a time: the one windowed chunk transfer of
    this module. :class:`H2HEngine` drives one per replica in flight (sends and receives, interleaved with
    everything else it does); a :class:`BufferTransfer` drives one for a recovery's transfer. Not
    thread-safe: one thread (the one allowed to call MPI) calls :meth:`progress`.

    Args:
        views: the chunks (numpy uint8 views), in order; chunk ``i`` goes with the data tag of index ``i``.
        post: ``post(i, view)`` posts chunk ``i`` (an ``Isend``/``Irecv``) and returns its request.
        window: chunks in flight at most (>= 1).
        before_post: called as ``before_post(i)`` just before chunk ``i`` is posted (a fault hook).
    """

    def __init__(self, views: list, post: Callable[[int, Any], Any], window: int,
                 before_post: Callable[[int], None] | None = None):
        self.views, self.post, self.window, self.before_post = views, post, max(1, window), before_post
        self.next = 0  # chunks posted so far
        self.reqs: list = []  # requests posted and not yet found complete
        self.completed = 0  # requests found complete so far (progress, for the engine's polling back-off)

    def progress(self) -> bool:
        """Test the requests in flight, post chunks up to the window; True once every chunk was posted and
        has completed."""
        n = len(self.reqs)
        self.reqs = [r for r in self.reqs if not r.Test()]
        self.completed += n - len(self.reqs)
        while len(self.reqs) < self.window and self.next < len(self.views):
            i = self.next
            if self.before_post is not None:
                self.before_post(i)
            self.reqs.append(self.post(i, self.views[i]))
            self.next += 1
        return self.next == len(self.views) and not self.reqs

    def describe(self) -> str:
        return f"{self.next}/{len(self.views)} chunks posted, {len(self.reqs)} pending"


@dataclass
class HeldSpec:
    """A shard this rank holds: its owner's rank in the runtime communicator, the expected replica size and
    the ping-pong pair to receive into."""

    shard_id: str
    owner: int
    nbytes: int
    pingpong: Any  # buffers.PingPong


@dataclass
class _Incoming:
    spec: HeldSpec
    announce: np.ndarray = field(default_factory=lambda: np.zeros(3, dtype=np.int64))
    announce_req: Any = None
    step: int | None = None
    idx: int | None = None
    chunks: ChunkWindow | None = None  # the replica's chunks, once its announce arrived
    t0: float = 0.0
    received: int | None = None  # step of the last replica fully received


@dataclass
class _Outgoing:
    step: int
    generation: int
    holder: int
    view: np.ndarray
    chunks: ChunkWindow
    announce: np.ndarray
    announce_req: Any = None
    ack: np.ndarray = field(default_factory=lambda: np.zeros(4, dtype=np.int64))
    ack_req: Any = None
    t0: float = 0.0


class H2HEngine:
    """The MPI side of replication for one rank (see the module doc for the protocol).

    Args:
        comm: the runtime's private communicator (mpi4py ``Intracomm``), used only by this engine.
        holders: runtime-communicator ranks that hold this rank's shard.
        held: the shards this rank holds for others.
        generation: generation the communicator belongs to (checked in every announce/ack).
        chunk_bytes: H2H chunk size in bytes (> 0).
        tag_plan: from :func:`make_tag_plan`.
        on_received: called (engine thread) with ``(spec, buffer_index, step)`` when a replica has fully
            arrived; the receiver verifies it elsewhere and answers with :meth:`send_ack`.
        window: chunks in flight per peer and direction.
        fault_hook: test/drill hook called as ``fault_hook("h2h_send_chunk", step, chunk_index)`` before
            each chunk is posted (may kill the process).
        thread_nice: added to the engine thread's nice value when it starts (``resilience.thread_nice``,
            :func:`~phoenix_hpc.runtime.thread_priority.lower_thread_priority`); unthreaded, the training thread
            drives the engine and keeps its priority.
    """

    def __init__(
        self,
        comm: Any,
        holders: list[int],
        held: list[HeldSpec],
        generation: int,
        chunk_bytes: int,
        tag_plan: TagPlan,
        on_received: Callable[[HeldSpec, int, int], None],
        window: int = DEFAULT_WINDOW,
        busy_sleep_s: float = BUSY_SLEEP_S,
        idle_sleep_s: float = IDLE_SLEEP_S,
        quiet_sleep_s: float = QUIET_SLEEP_S,
        fault_hook: Callable[[str, int, int], None] | None = None,
        cpu: Any = None,
        thread_nice: int = 0,
        stage: int = 0,
        stages: int = 0,
    ):
        from mpi4py import MPI

        self._MPI = MPI
        self.comm = comm
        self.holders = list(holders)
        self.generation = generation
        self.chunk_bytes = chunk_bytes
        self.tags = tag_plan
        self.on_received = on_received
        self.window = max(1, window)
        self.busy_sleep_s, self.idle_sleep_s, self.quiet_sleep_s = busy_sleep_s, idle_sleep_s, quiet_sleep_s
        self.expected_step: int | None = None  # newest step whose replicas this rank expects (expect, sends)
        self.wakeups = 0  # rounds of the engine thread's loop (each one after a sleep, unless a command waited)
        self.fault_hook = fault_hook
        self.cpu = cpu  # cpu_account.CpuAccount or None
        self.thread_nice = int(thread_nice)  # added to the engine thread's nice value when it starts
        self.events = 0  # requests completed and commands posted so far (progress, for the back-off)
        self._cmds: collections.deque = collections.deque()
        self._cv = threading.Condition()
        self._incoming = [_Incoming(s) for s in held]
        self._outgoing: list[_Outgoing] = []
        self._fences: list[tuple[int, Any, np.ndarray, np.ndarray]] = []
        self._acks_out: list[tuple[Any, np.ndarray, int]] = []  # (request, buffer, peer)
        self.acks: dict[int, dict[int, tuple[int, int]]] = {}  # step -> holder -> (status, crc)
        self.send_s: dict[int, float] = {}  # step -> seconds from first post to last ack
        self.fenced_step: int | None = None  # newest completed fence result (min committed step)
        # completed fences, and the largest protection interval any rank proposed with each of the newest
        # FENCES_KEPT of them (a per-step list would grow for the whole job): see fenced_interval()
        self.fences_done = 0
        self._fenced_intervals: collections.deque[int] = collections.deque(maxlen=FENCES_KEPT)
        # replica agreement in the fence (fence_vector): this rank's (pp, tp) stage of ``stages``; the first
        # completed fence whose replicas differed (kept: every later snapshot of the generation is held), and
        # the newest step every stage agreed at
        self.stage, self.stages = int(stage), int(stages)
        self.fence_differ: FenceResult | None = None
        self.fence_agreed_step: int | None = None
        self.error: BaseException | None = None
        self._stop = False
        self._barrier: list | None = None  # [request, done]
        self._barrier_wanted = False  # stop() asked for the barrier; posted once nothing of this rank is pending
        self._thread: threading.Thread | None = None
        self._started = False
        self.abandon_report = None  # mpi_faults.AbandonReport after stop(abandon=True)
        self.wedged = False  # stop(abandon=True) found the engine thread stuck inside MPI

    # --- lifecycle -----------------------------------------------------------------------------------
    def start(self, threaded: bool) -> None:
        """Post the first receives; with ``threaded`` run :meth:`poll` in a daemon thread."""
        for inc in self._incoming:
            self._post_announce(inc)
        self._started = True
        if threaded:
            self._thread = threading.Thread(target=self._run, name="phoenix-h2h", daemon=True)
            self._thread.start()

    @property
    def threaded(self) -> bool:
        return self._thread is not None

    def stop(self, abandon: bool = False, timeout_s: float = 30.0, abandon_join_s: float = ABANDON_JOIN_S,
             dead_peers: frozenset[int] = frozenset()) -> None:
        """Stop the engine. Unless ``abandon`` (collective then: every rank stops together), first wait for
        this rank's outstanding sends and fences, then an ``Ibarrier`` (after it, no rank has a replica in
        flight, so no holder can miss one), then cancel the receives still posted for future steps.

        With ``abandon`` the engine thread is given ``abandon_join_s`` seconds to leave its poll. A thread
        still inside MPI after that is stuck there for good (:data:`ABANDON_JOIN_S`): :attr:`wedged` is set,
        nothing more is called on MPI (a ``Wait`` would block this thread too) and the method returns.
        ``dead_peers`` (ranks of :attr:`comm` the coordinator declared dead): their requests are freed without
        the wait for completion that the others get (:meth:`_abandon_posted`)."""
        if not abandon and self.error is None:
            deadline = time.monotonic() + timeout_s
            self._enqueue(("barrier",))
            while (self._busy() or not self._barrier_done) and time.monotonic() < deadline and self.error is None:
                if self._thread is None:
                    self.poll()
                time.sleep(self.busy_sleep_s)
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=min(timeout_s, abandon_join_s) if abandon else timeout_s)
            if abandon and self._thread.is_alive():
                self.wedged = True
                return
        if abandon and (self._thread is None or not self._thread.is_alive()):
            self.abandon_report = self._abandon_posted(dead_peers)
        else:
            for inc in self._incoming:
                for r in [inc.announce_req] + (inc.chunks.reqs if inc.chunks is not None else []):
                    if r is not None and r != self._MPI.REQUEST_NULL:
                        try:
                            r.Cancel()
                            r.Wait()
                        except self._MPI.Exception:
                            pass

    def _abandon_posted(self, dead_peers: frozenset[int] = frozenset()):
        """Cancel or free every request still posted (the generation is abandoned, a peer may be dead;
        :func:`phoenix_hpc.runtime.mpi_faults.abandon_requests`). Called after the engine thread ended.
        Requests with a peer in ``dead_peers`` cannot complete any more: they get one test and are freed
        (``wait_s=0``); the others may still complete within the usual wait (a transfer to a live peer that
        is abandoning too)."""
        from phoenix_hpc.runtime.mpi_faults import abandon_requests, merge_reports, reap_lingering

        p2p: dict[bool, list] = {True: [], False: []}  # peer dead? -> (request, buffer)
        for inc in self._incoming:
            dead = inc.spec.owner in dead_peers
            p2p[dead].append((inc.announce_req, inc.announce))
            if inc.chunks is not None:
                p2p[dead] += [(r, inc.chunks.views) for r in inc.chunks.reqs]
        for out in self._outgoing:
            dead = out.holder in dead_peers
            p2p[dead].append((out.announce_req, out.announce))
            p2p[dead] += [(r, out.view) for r in out.chunks.reqs]
            p2p[dead].append((out.ack_req, out.ack))
        for r, b, peer in self._acks_out:
            p2p[peer in dead_peers].append((r, b))
        colls = [(req, (send, recv)) for _, req, send, recv in self._fences]
        if self._barrier is not None and not self._barrier[1]:
            colls.append((self._barrier[0], None))
        reap_lingering(self._MPI)  # an earlier generation's transfers with live peers that completed since
        rep = merge_reports(abandon_requests(p2p[True], MPI=self._MPI, wait_s=0.0),
                            abandon_requests(p2p[False], colls, MPI=self._MPI, linger=True))
        self._incoming, self._outgoing, self._acks_out, self._fences = [], [], [], []
        return rep

    def _in_flight(self) -> bool:
        """A command queued, or a send, acknowledgement, fence or replica receive of this rank pending (under
        the lock)."""
        return bool(self._cmds or self._outgoing or self._fences or self._acks_out) or any(
            inc.step is not None for inc in self._incoming)

    def _quiet(self) -> bool:
        """Nothing in flight and nothing expected (engine thread, under the lock): :meth:`_in_flight` is
        false, no barrier is wanted or pending, and every held shard has received the replica of
        :attr:`expected_step` (or nothing is expected yet)."""
        if self._in_flight() or self._barrier_wanted or (self._barrier is not None and not self._barrier[1]):
            return False
        want = self.expected_step
        return want is None or all(inc.received is not None and inc.received >= want for inc in self._incoming)

    def _busy(self) -> bool:
        with self._cv:
            return self._in_flight()

    def describe(self) -> str:
        """One line on what is in flight (for timeout messages)."""
        outs = [f"to {o.holder} step {o.step}: {o.chunks.describe()}" for o in list(self._outgoing)]
        ins = [f"from {i.spec.owner}: " + (f"step {i.step} {i.chunks.describe()}"
               if i.step is not None and i.chunks is not None else "waiting for announce") for i in self._incoming]
        return (f"sends [{'; '.join(outs)}], receives [{'; '.join(ins)}], fences pending {len(self._fences)}, "
                f"fenced step {self.fenced_step}, commands queued {len(self._cmds)}")

    @property
    def _barrier_done(self) -> bool:
        return self._barrier is not None and self._barrier[1]

    # --- commands (any thread) --------------------------------------------------------------------------
    def _enqueue(self, cmd: tuple) -> None:
        with self._cv:
            self._cmds.append(cmd)
            self._cv.notify_all()

    def send_replica(self, step: int, view: np.ndarray) -> None:
        """Send ``view`` (uint8, the replica of ``step``) to every holder. ``view`` must stay unchanged
        until every holder acknowledged."""
        self._enqueue(("send", step, view))

    def expect(self, step: int) -> None:
        """This rank started protecting ``step``: the replicas of ``step`` from its owners come from now on, so
        the engine polls for them instead of sleeping quietly (module doc). Any thread."""
        self._enqueue(("expect", step))

    def send_ack(self, spec: HeldSpec, step: int, status: int, crc: int) -> None:
        self._enqueue(("ack", spec.owner, np.array([step, self.generation, status, crc], dtype=np.int64)))

    def fence(self, committed_step: int, interval: int = 1, digest: int | None = None) -> None:
        """Start the commit fence for ``committed_step`` (every rank calls it once per commit, in order).
        ``interval`` is this rank's proposed protection interval (:mod:`phoenix_hpc.runtime.interval`),
        ``digest`` its parameter digest of that step (64 bits, :func:`phoenix_hpc.runtime.checksum.digest64`);
        the fence's result gives the job-wide minimum committed step (:attr:`fenced_step`), the maximum
        proposal (:meth:`fenced_interval`) and whether the DP replicas of every stage agree
        (:attr:`fence_differ`, :attr:`fence_agreed_step`), in one MIN all-reduce of :func:`fence_vector`."""
        self._enqueue(("fence", committed_step, interval, digest))

    def fenced_interval(self, i: int) -> int:
        """The largest interval proposed with fence ``i`` (0-based, in the order :meth:`fence` was called).

        Raises:
            IndexError: fence ``i`` has not completed (``i >= fences_done``), or is older than the newest
                :data:`FENCES_KEPT` completed fences.
        """
        with self._cv:
            back = self.fences_done - i
            if not 1 <= back <= len(self._fenced_intervals):
                raise IndexError(f"fence {i}: {self.fences_done} completed, the newest "
                                 f"{len(self._fenced_intervals)} kept")
            return self._fenced_intervals[-back]

    def wait(self, predicate: Callable[[], bool], timeout_s: float | None, drive: bool = False) -> bool:
        """Block until ``predicate()`` (evaluated under the engine's lock) is true, the engine failed or
        stopped, or ``timeout_s`` passed. In unthreaded mode a caller with ``drive`` (the main thread: the
        only one allowed to call MPI then) drives progress meanwhile; others just wait."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        drive = drive and self._thread is None
        while True:
            if drive:
                self.poll()
            with self._cv:
                if predicate() or self.error is not None or self._stop:
                    return predicate()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                if not drive:
                    self._cv.wait(timeout=0.05 if left is None else min(left, 0.05))
            if drive:
                time.sleep(self.busy_sleep_s)

    def queue_empty(self) -> bool:
        """No command waits to be posted (a plain read; callers in :meth:`wait` hold the engine lock)."""
        return not self._cmds

    def notify(self) -> None:
        with self._cv:
            self._cv.notify_all()

    # --- progress (engine thread, or the main thread when unthreaded) --------------------------------------
    def _run(self) -> None:
        from phoenix_hpc.runtime.thread_priority import lower_thread_priority

        lower_thread_priority(self.thread_nice)
        sleep = self.busy_sleep_s
        while True:
            t0 = time.thread_time_ns()
            with self._cv:
                if self._stop:
                    return
            try:
                before = self.events
                self._poll()
            except BaseException as e:  # noqa: BLE001 -- recorded and re-raised in the training thread
                with self._cv:
                    self.error = e
                    self._cv.notify_all()
                return
            sleep = self.busy_sleep_s if self.events != before else min(2 * sleep, self.idle_sleep_s)
            with self._cv:
                if not self._cmds and not self._stop:
                    self._cv.wait(timeout=self.quiet_sleep_s if self._quiet() else sleep)
            self.wakeups += 1
            if self.cpu is not None:
                self.cpu.add("mpi", time.thread_time_ns() - t0)

    def poll(self) -> bool:
        """One round of progress, from a thread other than the engine's (unthreaded mode: the training
        thread; its CPU time is counted as ``mpi``). Returns True when data transfers are in flight."""
        t0 = time.thread_time_ns()
        try:
            return self._poll()
        finally:
            if self.cpu is not None:
                self.cpu.add("mpi", time.thread_time_ns() - t0)

    def _poll(self) -> bool:
        MPI = self._MPI
        while True:
            with self._cv:
                if not self._cmds:
                    break
                cmd = self._cmds.popleft()
            self.events += 1
            kind = cmd[0]
            if kind == "send":
                self._start_send(cmd[1], cmd[2])
            elif kind == "ack":
                req = self.comm.Isend([cmd[2], MPI.INT64_T], dest=cmd[1], tag=ACK_TAG)
                self._acks_out.append((req, cmd[2], cmd[1]))
            elif kind == "fence":
                send = fence_vector(cmd[1], cmd[2], cmd[3], self.stage, self.stages)
                recv = np.zeros_like(send)
                req = self.comm.Iallreduce([send, MPI.INT64_T], [recv, MPI.INT64_T], op=MPI.MIN)
                self._fences.append((cmd[1], req, send, recv))
            elif kind == "expect":
                self._expect(cmd[1])
            elif kind == "barrier":
                self._barrier_wanted = True
        if self._barrier_wanted and not (self._outgoing or self._fences):
            # only once this rank's own replicas are all acknowledged
            self._barrier_wanted = False
            self._barrier = [self.comm.Ibarrier(), False]
        moving = False
        for inc in self._incoming:
            moving |= self._progress_incoming(inc)
        for out in list(self._outgoing):
            moving |= self._progress_outgoing(out)
        n_acks = len(self._acks_out)
        self._acks_out = [a for a in self._acks_out if not a[0].Test()]
        self.events += n_acks - len(self._acks_out)
        if self._barrier is not None and not self._barrier[1] and self._barrier[0].Test():
            self._barrier[1] = True
            self.events += 1
        while self._fences and self._fences[0][1].Test():
            self.events += 1
            _, _, _, recv = self._fences.pop(0)
            res = read_fence(recv, self.stages)
            with self._cv:
                self.fenced_step = res.step
                self._fenced_intervals.append(res.interval)
                if self.fence_differ is None:  # kept from the first difference on
                    if res.differ:
                        self.fence_differ = res
                    else:
                        self.fence_agreed_step = res.step
                self.fences_done += 1
                self._cv.notify_all()
        return moving

    def _post_announce(self, inc: _Incoming) -> None:
        inc.announce_req = self.comm.Irecv([inc.announce, self._MPI.INT64_T], source=inc.spec.owner, tag=ANNOUNCE_TAG)

    def _progress_incoming(self, inc: _Incoming) -> bool:
        MPI = self._MPI
        if inc.step is None:
            if not inc.announce_req.Test():
                return False
            self.events += 1
            step, gen, nbytes = (int(x) for x in inc.announce)
            if gen != self.generation or nbytes != inc.spec.nbytes:
                raise ReplicationError(
                    f"replica announce for {inc.spec.shard_id} from rank {inc.spec.owner}: generation {gen}, "
                    f"{nbytes} bytes; expected generation {self.generation}, {inc.spec.nbytes} bytes"
                )
            pp = inc.spec.pingpong
            inc.step, inc.idx = step, pp.target_idx()
            buf = pp.begin_write(inc.idx).numpy()
            # the window holds no reference to self: one still held when the engine is dropped (a wedged
            # engine's lists are not cleared) would otherwise keep the engine and its buffers in a cycle
            owner, tags, comm = inc.spec.owner, self.tags, self.comm
            inc.chunks = ChunkWindow(
                [buf[a:b] for a, b in chunk_ranges(nbytes, self.chunk_bytes)],
                lambda i, v, step=step: comm.Irecv([v, MPI.BYTE], source=owner, tag=tags.data_tag(step, i)),
                self.window)
            inc.t0 = time.monotonic()
        before = inc.chunks.completed
        done = inc.chunks.progress()  # keeps up to `window` chunk receives posted
        self.events += inc.chunks.completed - before
        if done:
            step, idx = inc.step, inc.idx
            inc.step = inc.idx = None
            inc.received = step
            inc.chunks = None
            self._post_announce(inc)
            self.on_received(inc.spec, idx, step)
            return False
        return True

    def _expect(self, step: int) -> None:
        self.expected_step = step if self.expected_step is None else max(self.expected_step, step)

    def _start_send(self, step: int, view: np.ndarray) -> None:
        MPI, tags, comm = self._MPI, self.tags, self.comm  # the windows hold no reference to self (see above)
        self._expect(step)
        views = [view[a:b] for a, b in chunk_ranges(view.size, self.chunk_bytes)]
        hook = None
        if self.fault_hook is not None:
            hook = lambda i, fh=self.fault_hook: fh("h2h_send_chunk", step, i)  # noqa: E731
        for h in self.holders:
            chunks = ChunkWindow(views, lambda i, v, h=h: comm.Isend([v, MPI.BYTE], dest=h,
                                                                     tag=tags.data_tag(step, i)),
                                 self.window, before_post=hook)
            out = _Outgoing(step, self.generation, h, view, chunks,
                            np.array([step, self.generation, view.size], dtype=np.int64), t0=time.monotonic())
            out.ack_req = self.comm.Irecv([out.ack, MPI.INT64_T], source=h, tag=ACK_TAG)
            out.announce_req = self.comm.Isend([out.announce, MPI.INT64_T], dest=h, tag=ANNOUNCE_TAG)
            self._outgoing.append(out)

    def _progress_outgoing(self, out: _Outgoing) -> bool:
        before = out.chunks.completed
        sent = out.chunks.progress()  # keeps up to `window` chunk sends posted
        self.events += out.chunks.completed - before
        if sent and out.announce_req.Test() and out.ack_req.Test():
            self.events += 1
            step, gen, status, crc = (int(x) for x in out.ack)
            self._outgoing.remove(out)
            with self._cv:
                if step != out.step or gen != out.generation:
                    self.acks.setdefault(out.step, {})[out.holder] = (-1, 0)
                else:
                    self.acks.setdefault(step, {})[out.holder] = (status, crc)
                self.send_s[out.step] = max(self.send_s.get(out.step, 0.0), time.monotonic() - out.t0)
                self._cv.notify_all()
            return False
        return not sent  # only the acknowledgement outstanding: nothing moves on this side


# --- the same wire protocol for a recovery's one-off messages: non-blocking transfers driven together ---


def tag_ub(comm) -> int:
    """``MPI_TAG_UB`` for ``comm``: its attribute, else ``MPI_COMM_WORLD``'s (the standard attaches it there;
    the bound is the same for every communicator)."""
    from mpi4py import MPI

    v = comm.Get_attr(MPI.TAG_UB)
    return int(v if v is not None else MPI.COMM_WORLD.Get_attr(MPI.TAG_UB))


class BufferTransfer:
    """One buffer sent to or received from ``peer`` with the H2H wire protocol, as a non-blocking state
    machine: an announce (int64[3] = step, head bytes, nbytes) at :data:`ANNOUNCE_TAG`, then the head (when
    not empty) as one message and the rest in ``chunk_bytes`` chunks, at the data tags of
    :func:`make_tag_plan` under the communicator's ``MPI_TAG_UB``, at most ``window`` in flight
    (:class:`ChunkWindow`). A recovery's transfers are these (:func:`drive_transfers`); the receiver verifies
    the checksums the buffer carries (:func:`phoenix_hpc.runtime.snapshot.unpack`).

    Args:
        comm: the generation's communicator; ``peer`` a rank in it.
        step: the step the buffer holds (part of every data tag; the receiver refuses another).
        chunk_bytes: bytes per chunk (``resilience.chunk_bytes``).
        what: names the transfer in errors.
        arr: what to send: a uint8 host array (a sealed snapshot buffer), or ``(head, body)``, two uint8
            arrays that the receiver gets as one buffer (:func:`phoenix_hpc.runtime.snapshot.param_part`);
            None to receive into a new host tensor (:attr:`buf`, allocated once the announce gives its size;
            not verified here).

    Raises (from the constructor or :meth:`progress`):
        ReplicationError: too many chunks for the tag space (raise ``resilience.chunk_bytes``; a sender
            raises it before posting anything), or the announce names another step, a negative size or a
            head outside the buffer.
    """

    def __init__(self, comm, peer: int, step: int, chunk_bytes: int, what: str,
                 arr: np.ndarray | tuple[np.ndarray, np.ndarray] | None = None, window: int = DEFAULT_WINDOW):
        self.comm, self.peer, self.step, self.chunk_bytes, self.what, self.window = (
            comm, peer, step, chunk_bytes, what, window)
        self.sending = arr is not None
        self.buf = None  # the received host tensor (uint8, nbytes of the announce)
        self.started_at: float | None = None  # time.monotonic() of the first progress
        self.done_at: float | None = None  # time.perf_counter() when the last chunk completed
        self._hdr = np.zeros(3, dtype=np.int64)
        self._announce = None
        self._chunks: ChunkWindow | None = None
        if self.sending:
            head, body = arr if isinstance(arr, tuple) else (arr[:0], arr)
            self._hdr[:] = (step, head.nbytes, head.nbytes + body.nbytes)
            self._views = self._plan(head, body)

    def _plan(self, head: np.ndarray, body: np.ndarray) -> list:
        ranges = chunk_ranges(int(body.nbytes), self.chunk_bytes)
        views = ([head] if head.nbytes else []) + [body[a:b] for a, b in ranges]
        self._tags = make_tag_plan(len(views), tag_ub(self.comm))
        return views

    def progress(self) -> bool:
        """Post or test what is due; True once the whole buffer went (or arrived)."""
        if self.done_at is not None:
            return True
        c, step = self.comm, self.step
        if self._announce is None:
            self.started_at = time.monotonic()
            self._announce = (c.Isend(self._hdr, dest=self.peer, tag=ANNOUNCE_TAG) if self.sending
                              else c.Irecv(self._hdr, source=self.peer, tag=ANNOUNCE_TAG))
        if self._chunks is None:
            if not self._announce.Test():
                return False
            # the posting closures hold the peer and the tag plan, never this transfer: a window that referred
            # back to it would keep it and the received buffer alive until the cycle collector's next run
            peer = self.peer
            if self.sending:
                tags = self._tags
                post = lambda i, v: c.Isend(v, dest=peer, tag=tags.data_tag(step, i))  # noqa: E731
            else:
                got_step, h, n = (int(x) for x in self._hdr)
                if got_step != step or n < 0 or not 0 <= h <= n:
                    raise ReplicationError(f"{self.what}: the sender announced step {got_step} ({n} bytes, head "
                                           f"{h}), expected step {step}")
                from phoenix_hpc.runtime.buffers import host_empty

                self.buf = host_empty(n)  # every byte is received into below
                a = self.buf.numpy()
                self._views = self._plan(a[:h], a[h:])
                tags = self._tags
                post = lambda i, v: c.Irecv(v, source=peer, tag=tags.data_tag(step, i))  # noqa: E731
            self._chunks = ChunkWindow(self._views, post, self.window)
        if self._chunks.progress():
            self.done_at = time.perf_counter()
            return True
        return False

    def describe(self) -> str:
        return ("announce pending" if self._chunks is None else self._chunks.describe())

    def pending(self) -> list[tuple[Any, Any]]:
        """``(request, buffer)`` of what this transfer still has posted (for
        :func:`phoenix_hpc.runtime.mpi_faults.abandon_requests`)."""
        if self._announce is None or self.done_at is not None:
            return []
        if self._chunks is None:
            return [(self._announce, self._hdr)]
        return [(r, self._views) for r in self._chunks.reqs]


class TransferSet:
    """Transfers driven together (:class:`BufferTransfer`): those with the same peer one after the other in
    list order (their announces and chunks then match by tag unambiguously, MPI's non-overtaking order, when
    the peer lists its side in the same order), those with different peers concurrently, so a rank restored
    from several peers receives from all of them at once. Every rank running its transfers in the one
    order of a plan cannot deadlock: the earliest unfinished transfer of each pair has both ends progressing
    it. One thread (the one allowed to call MPI) calls :meth:`poll`; others may read each transfer's
    ``done_at``."""

    def __init__(self, transfers: list[BufferTransfer], timeout_s: float):
        self.timeout_s = timeout_s
        self.queues: dict[int, collections.deque] = {}
        for t in transfers:
            self.queues.setdefault(t.peer, collections.deque()).append(t)
        #: time.monotonic() before which no timeout counts: a member that drives its transfers from a
        #: thread while it does its own engine work sets it to infinity, then to the end of that work (a
        #: peer that builds its engine first must not exhaust this member's timeout meanwhile)
        self.not_before = -math.inf
        self.stopped: str | None = None  # set (from any thread) to end the transfers: poll raises it

    def poll(self) -> bool:
        """One round: progress the head transfer of every peer; True once all are done.

        Raises:
            ReplicationError: from :class:`BufferTransfer`, a transfer not complete ``timeout_s`` after it
                started or after ``not_before`` (its ``what`` and progress named), or :attr:`stopped` set."""
        if self.stopped is not None:
            raise ReplicationError(f"transfers stopped: {self.stopped}")
        now = time.monotonic()
        for peer in list(self.queues):
            q = self.queues[peer]
            while q and q[0].progress():
                q.popleft()
            if not q:
                del self.queues[peer]
            elif now - max(q[0].started_at, self.not_before) > self.timeout_s:
                raise ReplicationError(f"{q[0].what}: no completion within the timeout ({q[0].describe()})")
        return not self.queues

    def drive(self, poll_s: float = 0.001) -> None:
        """:meth:`poll` until every transfer is done, sleeping ``poll_s`` between rounds (never spins a core).
        Raises as :meth:`poll`, after :meth:`abandon`."""
        try:
            while not self.poll():
                time.sleep(poll_s)
        except BaseException:
            self.abandon()
            raise

    def abandon(self):
        """Leave nothing posted: every request still active is cancelled or freed
        (:func:`phoenix_hpc.runtime.mpi_faults.abandon_requests`; local), so a later message on the same
        communicator cannot land in a buffer of these transfers. Returns its report."""
        from phoenix_hpc.runtime.mpi_faults import abandon_requests

        pending = [p for q in self.queues.values() for t in q for p in t.pending()]
        self.queues = {}
        return abandon_requests(pending)


def drive_transfers(transfers: list[BufferTransfer], timeout_s: float, poll_s: float = 0.001) -> None:
    """Run ``transfers`` to completion as one :class:`TransferSet`, polling with ``poll_s`` sleeps (never
    spins a core).

    Raises:
        ReplicationError: as :meth:`TransferSet.poll`.
    """
    TransferSet(transfers, timeout_s).drive(poll_s)


def send_buffer(comm, arr: np.ndarray, peer: int, step: int, chunk_bytes: int, timeout_s: float, what: str,
                window: int = DEFAULT_WINDOW, poll_s: float = 0.001) -> None:
    """Send ``arr`` (a uint8 host array holding a sealed snapshot buffer, :mod:`phoenix_hpc.runtime.snapshot`)
    to ``peer`` as one :class:`BufferTransfer`; blocking (polls with ``poll_s`` sleeps, never spins a core).

    Raises:
        ReplicationError: too many chunks for the tag space (raise ``resilience.chunk_bytes``), or no
            completion within ``timeout_s`` (``what`` names the transfer).
    """
    drive_transfers([BufferTransfer(comm, peer, step, chunk_bytes, what, arr=arr, window=window)], timeout_s, poll_s)


def recv_buffer(comm, peer: int, step: int, chunk_bytes: int, timeout_s: float, what: str,
                window: int = DEFAULT_WINDOW, poll_s: float = 0.001):
    """Receive what :func:`send_buffer` sends from ``peer`` for ``step`` into a new uint8 host tensor and
    return it (not yet verified: unpack it with :func:`phoenix_hpc.runtime.snapshot.unpack`).

    Raises:
        ReplicationError: the announce names another step or a negative size, too many chunks for the tag
            space, or no completion within ``timeout_s``.
    """
    t = BufferTransfer(comm, peer, step, chunk_bytes, what, window=window)
    drive_transfers([t], timeout_s, poll_s)
    return t.buf
