"""Process-exit detection: every registered slot holds one idle TCP connection to the coordinator.

When a slot's process ends in any way (exit, crash, ``os._exit``, SIGKILL, OOM kill), its kernel closes the
connection, and the coordinator reads end-of-file at once, long before a heartbeat timeout. A process that
hangs (SIGSTOP, a deadlock) keeps its connection open, and a node that loses power or its network sends
nothing at all: those two are still found by heartbeat timeouts (:mod:`phoenix_hpc.control.detect`).

Wire format: after its registration is accepted, a slot connects to ``coordinator.json``'s ``host`` and
``liveness_port`` and sends one signed line (:func:`phoenix_hpc.control.protocol.encode`) with body
``{"type": "alive", "world_rank", "pid"}``; then it never sends again. The coordinator trusts only a line
that verifies with the job secret and is neither replayed nor stale (:class:`~phoenix_hpc.control.protocol.ReplayGuard`),
and reports an end-of-file only for such a connection.

Threads: :class:`LivenessServer` runs one daemon thread (a :mod:`selectors` loop over every connection, so
thousands of slots cost one thread); the coordinator's loop collects the exits with :meth:`poll_exits`.
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

    def _drop(self, conn: socket.socket) -> None:
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
            self._drop(conn)
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
        state["buf"] = bytearray()

    def poll_exits(self) -> list[tuple[int, int]]:
        """``[(world_rank, pid)]`` of the verified connections closed since the last call."""
        out = []
        while True:
            try:
                out.append(self._exits.get_nowait())
            except queue.Empty:
                return out

    def close(self) -> None:
        """Stop watching (connections are closed; no more exits are reported)."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join(2.0)
        for key in list(self._sel.get_map().values()):
            key.fileobj.close()
        self._sel.close()


def connect_alive(host: str, port: int, world_rank: int, pid: int, secret: bytes,
                  timeout_s: float = 10.0) -> socket.socket:
    """Open a slot's liveness connection and send its signed hello. Keep the returned socket open for the
    life of the process (closing it reads as the process's exit).

    Raises:
        ControlError: the coordinator's liveness port cannot be reached.
    """
    try:
        conn = socket.create_connection((host, port), timeout=timeout_s)
        conn.sendall(P.encode({"type": "alive", "world_rank": int(world_rank), "pid": int(pid)}, secret) + b"\n")
    except OSError as exc:
        raise ControlError(f"cannot open the liveness connection to {host}:{port}: {exc.strerror or exc}") from None
    return conn
