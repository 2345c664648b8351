"""The liveness connection both ways, on real local sockets: the coordinator's doorbell and its exit."""

import threading
import time

import pytest

from phoenix_hpc.control import protocol as P
from phoenix_hpc.control.liveness import AliveConnection, LivenessServer, connect_alive

from test_quiesce_watch import _until  # the same bounded wait

SECRET = b"s" * 64


@pytest.fixture
def server():
    s = LivenessServer(SECRET)
    s.start("127.0.0.1")
    yield s
    s.close()


def test_a_ring_before_the_hello_is_delivered_with_it_and_later_rings_at_once(server):
    server.ring([3])  # queued for world rank 3 before its connection exists
    conn = AliveConnection(connect_alive("127.0.0.1", server.port, 3, 1234, SECRET))
    try:
        _until(lambda: conn.rings == 1)
        server.ring([3, 9])  # 9 never connects: kept, harmless
        assert conn.wait_ring(1, 5.0) == 2
        assert conn.closed is None
    finally:
        conn.close()
    _until(lambda: server.poll_exits() == [(3, 1234)])


def test_the_coordinator_s_exit_closes_the_connection_and_is_reported_once(server):
    seen = []
    conn = AliveConnection(connect_alive("127.0.0.1", server.port, 1, 77, SECRET), on_closed=seen.append)
    server.ring([1])
    _until(lambda: conn.rings == 1)
    server.close()  # what the kernel does when the coordinator's process ends
    _until(lambda: seen)
    assert conn.closed and "end of file" in conn.closed and seen == [conn.closed]
    assert conn.wait_ring(conn.rings, 5.0) == conn.rings  # a closed connection never blocks a waiter
    conn.close()


def test_closing_the_slot_end_is_quiet(server):
    seen = []
    conn = AliveConnection(connect_alive("127.0.0.1", server.port, 2, 5, SECRET), name="reader-2",
                           on_closed=seen.append)
    conn.close()
    time.sleep(0.1)
    assert seen == [] and conn.closed is None
    assert not any(t.name == "reader-2" and t.is_alive() for t in threading.enumerate())


def test_an_unverified_hello_gets_no_ring(server):
    import socket

    raw = socket.create_connection(("127.0.0.1", server.port))
    raw.sendall(P.encode({"type": "alive", "world_rank": 4, "pid": 1}, b"other-secret") + b"\n")
    time.sleep(0.2)
    server.ring([4])
    raw.settimeout(0.3)
    with pytest.raises((socket.timeout, ConnectionResetError)):
        data = raw.recv(10)
        assert data == b""  # dropped: end of file, never a ring
        raise socket.timeout
    raw.close()


def test_a_message_in_an_older_protocol_version_is_refused_naming_its_sender():
    raw = P.encode({"type": "register", "world_rank": 5, "pid": 9}, SECRET, version=1)
    with pytest.raises(P.ProtocolError, match=r"'register' message from world rank 5 speaks control protocol "
                                              rf"version 1, the receiver speaks {P.PROTOCOL_VERSION}") as e:
        P.decode(raw, SECRET)
    assert e.value.key == ("version", 1, 5)
    # a foreign sender is refused for its MAC, whatever version it claims
    with pytest.raises(P.ProtocolError, match="does not verify"):
        P.decode(P.encode({"type": "register"}, b"other", version=1), SECRET)
