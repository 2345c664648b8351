"""The operator channel: one plain TCP socket beside the coordinator's TCPStore, for commands people run.

``phoenix inject-fault`` talks to a running job's coordinator. Through the TCPStore that would need
``torch.distributed`` in the command, and importing torch takes seconds (tens of seconds from a shared
file system on a login node), during which a small job runs past the step the fault was meant for. This
channel needs only the standard library.

Wire format: the client connects to ``coordinator.json``'s ``host`` and ``operator_port``, sends ONE
message (:func:`phoenix_hpc.control.protocol.encode`: signed with the job secret, like every store message)
followed by ``\\n``, and reads ONE signed reply line; then both sides close. The coordinator handles the
message in its main loop exactly as if it had come through the store (same authentication, same
handlers, same journal); only the reply travels back over the socket.

Threads: :class:`OperatorServer` accepts and reads in one daemon thread and hands complete requests to the
coordinator's loop through a queue; replies are written by the loop. Nothing here touches coordinator state.
"""

from __future__ import annotations

import itertools
import queue
import socket
import threading
from typing import Any

from phoenix_hpc.control import protocol as P
from phoenix_hpc.errors import ControlError

MAX_REQUEST_BYTES = 1 << 20  # one request line at most (an inject request is ~300 bytes)
READ_TIMEOUT_S = 5.0  # a client that connects and does not send a full line within this is dropped
REPLY_PREFIX = "operator:"  # ``reply_to`` of requests that came through this channel


def _read_line(conn: socket.socket, limit: int) -> bytes | None:
    """Bytes up to the first newline (excluded); None at EOF before one, or past ``limit`` bytes."""
    buf = bytearray()
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        buf += chunk
        i = buf.find(b"\n")
        if i >= 0:
            return bytes(buf[:i])
        if len(buf) > limit:
            return None


class OperatorServer:
    """Accepts operator requests for the coordinator (see the module docstring).

    Use: :meth:`start` once (returns the port), :meth:`poll` from the coordinator's loop, :meth:`reply` /
    :meth:`finish` per request, :meth:`close` at the end.
    """

    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._ready: queue.Queue[tuple[int, bytes]] = queue.Queue()
        self._conns: dict[int, socket.socket] = {}
        self._ids = itertools.count(1)
        self._closed = threading.Event()
        self.port: int | None = None

    def start(self, host: str = "0.0.0.0", port: int = 0) -> int:
        """Listen on ``host:port`` (0: any free port); return the port.

        Raises:
            OSError: the socket cannot be bound.
        """
        self._sock = socket.create_server((host, port), reuse_port=False)
        self._sock.settimeout(0.2)
        self.port = int(self._sock.getsockname()[1])
        self._thread = threading.Thread(target=self._accept_loop, name="phoenix-operator", daemon=True)
        self._thread.start()
        return self.port

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return  # closed
            try:
                conn.settimeout(READ_TIMEOUT_S)
                raw = _read_line(conn, MAX_REQUEST_BYTES)
            except OSError:
                raw = None
            if raw is None:
                conn.close()
                continue
            cid = next(self._ids)
            self._conns[cid] = conn
            self._ready.put((cid, raw))

    def poll(self) -> list[tuple[int, bytes]]:
        """The requests read since the last call: ``[(request id, raw message)]``."""
        out = []
        while True:
            try:
                out.append(self._ready.get_nowait())
            except queue.Empty:
                return out

    def reply(self, cid: int, raw: bytes) -> None:
        """Send ``raw`` (one signed message) as the reply to request ``cid`` and close it. A client that went
        away is ignored."""
        conn = self._conns.pop(cid, None)
        if conn is None:
            return
        try:
            conn.sendall(raw + b"\n")
        except OSError:
            pass
        finally:
            conn.close()

    def finish(self, cid: int) -> None:
        """Close request ``cid`` if it got no reply (the client sees the connection close)."""
        conn = self._conns.pop(cid, None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        """Stop accepting and close every open request."""
        self._closed.set()
        if self._sock is not None:
            self._sock.close()
        for cid in list(self._conns):
            self.finish(cid)


def operator_request(host: str, port: int, body: dict[str, Any], secret: bytes,
                     timeout_s: float = 30.0) -> dict[str, Any]:
    """Send one request ``body`` to a coordinator's operator channel and return its (authenticated) reply.

    Raises:
        ControlError: the coordinator cannot be reached, closes without a reply, answers with a message that
            does not verify with ``secret`` or does not answer this request (``in_reply_to`` is not its
            nonce), or does not answer within ``timeout_s`` seconds.
    """
    body = P.stamp(body)
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as conn:
            conn.settimeout(timeout_s)
            conn.sendall(P.encode(body, secret) + b"\n")
            raw = _read_line(conn, MAX_REQUEST_BYTES)
    except socket.timeout:
        raise ControlError(f"no reply from the coordinator at {host}:{port} to {body.get('type')} "
                           f"within {timeout_s:g}s") from None
    except OSError as exc:
        raise ControlError(f"cannot reach the coordinator at {host}:{port}: {exc.strerror or exc}") from None
    if raw is None:
        raise ControlError(f"the coordinator at {host}:{port} closed the connection without replying to "
                           f"{body.get('type')}")
    try:
        reply = P.decode(raw, secret)
    except P.ProtocolError as exc:
        raise ControlError(f"the coordinator's reply does not verify: {exc}") from None
    if reply.get("in_reply_to") != body["nonce"]:
        raise ControlError(f"the coordinator's reply answers another request (in_reply_to "
                           f"{reply.get('in_reply_to')!r}, this request's nonce {body['nonce']!r}): a replayed reply")
    return reply
