"""The liveness connection: every registered slot holds one TCP connection to the coordinator.

Process exit, both ways. When a slot's process ends in any way (exit, crash, ``os._exit``, SIGKILL, OOM
kill), its kernel closes the connection, and the coordinator reads end-of-file at once, long before a
heartbeat timeout. A process that hangs (SIGSTOP, a deadlock) keeps its connection open, and a node that
loses power or its network sends nothing at all: those two are still found by heartbeat timeouts
(:mod:`phoenix_hpc.control.detect`). The same holds the other way: when the coordinator's process ends, the
slot reads end-of-file (:class:`AliveConnection`), which is the evidence a slot needs to decide that the
coordinator is gone (:func:`phoenix_hpc.control.detect.coordinator_verdict`); a coordinator that is only
slow or stopped keeps it open.

Doorbell. The coordinator writes one byte (:data:`DOORBELL`) on a slot's connection after it queued an
instruction for that slot (``ctl/out/{world_rank}`` in its store). The slot pops its instruction queue only
when its doorbell rang (:meth:`AliveConnection.rung`), so no slot polls the store while nothing is waiting
for it: the cost of hearing instructions does not grow with ranks x polling rate, and a slot blocked in a
collective hears a ``quiesce`` as soon as it is queued (:mod:`phoenix_hpc.launch.quiesce_watch`). A ring
carries no data: a forged one only makes the slot look at its (signed) queue.

Wire format: after its registration is accepted, a slot connects to ``coordinator.json``'s ``host`` and
``liveness_port`` and sends one signed line (:func:`phoenix_hpc.control.protocol.encode`) with body
``{"type": "alive", "world_rank", "pid"}``; then it never sends again. The coordinator trusts only a line
that verifies with the job secret and is neither replayed nor stale (:class:`~phoenix_hpc.control.protocol.ReplayGuard`),
and reports an end-of-file only for such a connection. From then on it may send :data:`DOORBELL` bytes; a
ring for a slot whose hello has not arrived yet is kept and sent with the hello's acceptance.

Threads: :class:`LivenessServer` runs one daemon thread (a :mod:`selectors` loop over every connection, so
thousands of slots cost one thread); the coordinator's loop collects the exits with :meth:`poll_exits` and
rings with :meth:`ring` (from its own thread, under a lock). A slot runs one reader thread per process.
"""

from __future__ import annotations

import queue
import selectors
import socket
import threading
from typing import Any

from phoenix_hpc.control import protocol as P
from phoenix_hpc.errors import ControlError

MAX_HELLO_BYTES = 4096
DOORBELL = b"!"


class LivenessServer:
    """Watches the slots' liveness connections (see the module docstring). ``secret``: the job secret."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret
        self._guard = P.ReplayGuard()
        self._sel = selectors.DefaultSelector()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._exits: queue.Queue[tuple[int, int]] = queue.Queue()
        self._closed = threading.Event()
        self._lock = threading.Lock()  # guards _conns and _owed (selector thread and coordinator loop)
        self._conns: dict[int, socket.socket] = {}  # world rank -> its verified connection
        self._owed: set[int] = set()  # world ranks rung before their hello was verified
        self.port: int | None = None

    def start(self, host: str = "0.0.0.0", port: int = 0) -> int:
        """Listen on ``host:port`` (0: any free port); return the port.

        Raises:
            OSError: the socket cannot be bound.
        """
        self._sock = socket.create_server((host, port), backlog=1024)
        self._sock.setblocking(False)
        self._sel.register(self._sock, selectors.EVENT_READ, None)
        self.port = int(self._sock.getsockname()[1])
        self._thread = threading.Thread(target=self._loop, name="phoenix-liveness", daemon=True)
        self._thread.start()
        return self.port

    def _loop(self) -> None:
        while not self._closed.is_set():
            try:
                events = self._sel.select(timeout=0.2)
            except OSError:
                return
            for key, _ in events:
                if key.data is None:
                    self._accept()
                else:
                    self._read(key.fileobj, key.data)

    def _accept(self) -> None:
        try:
            conn, _ = self._sock.accept()
        except OSError:
            return
        conn.setblocking(False)
        self._sel.register(conn, selectors.EVENT_READ, {"buf": bytearray(), "who": None})

    def _drop(self, conn: socket.socket, state: dict[str, Any] | None = None) -> None:
        """Forget ``conn`` (O(1): its verified world rank is in ``state``) and close it."""
        who = (state or {}).get("who")
        with self._lock:
            if who is not None and self._conns.get(who[0]) is conn:
                del self._conns[who[0]]
        try:
            self._sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()

    def _read(self, conn: socket.socket, state: dict[str, Any]) -> None:
        try:
            chunk = conn.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:  # end of file: the process (or its connection) is gone
            if state["who"] is not None:
                self._exits.put(state["who"])
            self._drop(conn, state)
            return
        if state["who"] is not None:
            return  # a verified slot never sends more; ignore
        state["buf"] += chunk
        i = state["buf"].find(b"\n")
        if i < 0:
            if len(state["buf"]) > MAX_HELLO_BYTES:
                self._drop(conn)
            return
        try:
            body = P.decode(bytes(state["buf"][:i]), self._secret)
            if body.get("type") != "alive":
                raise P.ProtocolError("not an alive message")
            self._guard.check(body)  # a replayed hello, closed later, would fake the slot's exit
            state["who"] = (int(body["world_rank"]), int(body["pid"]))
        except (P.ProtocolError, KeyError, TypeError, ValueError):
            self._drop(conn)  # not a slot of this job: forget it
            return
        state["buf"] = bytearray()
        w = state["who"][0]
        with self._lock:
            self._conns[w] = conn
            owed = w in self._owed
            self._owed.discard(w)
        if owed:
            self._send_ring(conn)

    @staticmethod
    def _send_ring(conn: socket.socket) -> bool:
        try:
            return conn.send(DOORBELL) == 1
        except OSError:  # a full buffer (the slot does not read: hung) or a closed connection: nothing to ring
            return False

    def ring(self, world_ranks) -> None:
        """Ring the doorbell of each of ``world_ranks`` (their instruction queues hold something new).
        A slot whose hello has not been verified yet is rung as soon as it is. Never blocks."""
        with self._lock:
            conns = []
            for w in world_ranks:
                c = self._conns.get(int(w))
                if c is None:
                    self._owed.add(int(w))
                else:
                    conns.append(c)
        for c in conns:
            self._send_ring(c)

    def poll_exits(self) -> list[tuple[int, int]]:
        """``[(world_rank, pid)]`` of the verified connections closed since the last call."""
        out = []
        while True:
            try:
                out.append(self._exits.get_nowait())
            except queue.Empty:
                return out

    def close(self) -> None:
        """Stop watching (connections are closed; no more exits are reported). Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        if self._thread is not None:
            self._thread.join(2.0)
        for key in list(self._sel.get_map().values()):
            key.fileobj.close()
        self._sel.close()


def connect_alive(host: str, port: int, world_rank: int, pid: int, secret: bytes,
                  timeout_s: float = 10.0) -> socket.socket:
    """Open a slot's liveness connection and send its signed hello. Keep the returned socket open for the
    life of the process (closing it reads as the process's exit). The socket is returned in blocking mode.

    Raises:
        ControlError: the coordinator's liveness port cannot be reached.
    """
    try:
        conn = socket.create_connection((host, port), timeout=timeout_s)
        conn.sendall(P.encode({"type": "alive", "world_rank": int(world_rank), "pid": int(pid)}, secret) + b"\n")
        conn.settimeout(None)
    except OSError as exc:
        raise ControlError(f"cannot open the liveness connection to {host}:{port}: {exc.strerror or exc}") from None
    return conn


class AliveConnection:
    """The slot's end of its liveness connection: one reader thread counts doorbell rings and notices when
    the coordinator closes the connection (its process ended).

    Args:
        conn: the socket from :func:`connect_alive`.
        name: the reader thread's name.
        on_closed: called once from the reader thread with the reason when the coordinator's end closed
            (not after :meth:`close`).
    """

    def __init__(self, conn: socket.socket, name: str = "phoenix-liveness", on_closed=None) -> None:
        self._conn = conn
        self._cv = threading.Condition()
        self._rings = 0
        self._closing = False
        self.closed: str | None = None  # why the coordinator's end is gone; None while open
        self._on_closed = on_closed
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def rings(self) -> int:
        """How many times the doorbell rang so far (a counter: compare with the value last acted on)."""
        with self._cv:
            return self._rings

    def wait_ring(self, seen: int, timeout_s: float | None) -> int:
        """Wait until the ring count exceeds ``seen``, the connection closed, or ``timeout_s`` passed (None:
        no limit); return the ring count."""
        with self._cv:
            self._cv.wait_for(lambda: self._rings > seen or self.closed is not None or self._closing, timeout_s)
            return self._rings

    def _run(self) -> None:
        while True:
            try:
                chunk = self._conn.recv(4096)
            except OSError as exc:
                chunk, why = b"", f"connection error: {exc.strerror or exc}"
            else:
                why = "end of file: its process ended"
            with self._cv:
                if self._closing:
                    self._cv.notify_all()
                    return
                if not chunk:
                    self.closed = why
                    self._cv.notify_all()
                else:
                    self._rings += chunk.count(DOORBELL)
                    self._cv.notify_all()
                    continue
            if self._on_closed is not None:
                self._on_closed(why)
            return

    def close(self) -> None:
        """Close this end (the coordinator then reads this slot's exit); the reader thread ends quietly."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        try:
            self._conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._conn.close()
        if self._thread is not threading.current_thread():
            self._thread.join(2.0)
