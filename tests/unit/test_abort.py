"""Aborting a generation's communicators (phoenix_hpc.launch.abort): gloo for real, NCCL's choice of API
with a fake torch module."""

import os
import re
import socket
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from phoenix_hpc.launch.abort import (
    GenerationAbort,
    SocketCapture,
    abort_nccl_groups,
    choose_nccl_abort,
    new_sockets,
    shutdown_sockets,
)


def test_new_sockets_are_those_with_a_new_fd_or_inode():
    before = {3: "socket:[1]", 4: "socket:[2]"}
    after = {3: "socket:[1]", 4: "socket:[9]", 7: "socket:[5]"}
    assert new_sockets(before, after) == {4: "socket:[9]", 7: "socket:[5]"}


def test_shutdown_fails_a_connection_skips_listeners_and_reused_fds():
    with SocketCapture() as cap:
        a, b = socket.socketpair()
        lst = socket.socket()
        lst.bind(("127.0.0.1", 0))
        lst.listen()
    try:
        assert set(cap.sockets) == {a.fileno(), b.fileno(), lst.fileno()}
        stale = {b.fileno(): "socket:[0]"}  # the fd now names another socket: left alone
        assert shutdown_sockets(stale) == 0
        assert shutdown_sockets({a.fileno(): cap.sockets[a.fileno()], lst.fileno(): cap.sockets[lst.fileno()]}) == 1
        assert b.recv(1) == b""  # the peer sees the connection closed
        lst.getsockname()  # the listener is untouched and its fd still open
        assert a.fileno() >= 0  # the fd stays open: its owner closes it
    finally:
        for s in (a, b, lst):
            s.close()


PEER = textwrap.dedent("""
    import datetime, os, sys, threading, time
    import torch, torch.distributed as dist
    from phoenix_hpc.launch.abort import GenerationAbort, SocketCapture
    rank, port = int(sys.argv[1]), int(sys.argv[2])
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=datetime.timedelta(seconds=30))
    with SocketCapture() as cap:
        dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
        sub = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=60))
    t = torch.ones(8)
    dist.all_reduce(t, group=sub)
    ab = GenerationAbort("gloo", 0, cap.sockets)
    def say(line):  # one write per line: the two threads' lines must not interleave
        sys.stdout.write(line + "\\n")
        sys.stdout.flush()
    timer = threading.Timer(0.5, lambda: say(f"ABORTED {ab.abort('test').sockets}"))
    if rank == 0:  # the survivor: blocked in a collective its peer never joins, aborted from another thread
        timer.start()
    else:  # the hung peer: joins late, after rank 0 aborted
        time.sleep(3.0)
    t0 = time.monotonic()
    try:
        dist.all_reduce(t, group=sub)
        say("RETURNED")
    except Exception as exc:
        say(f"RAISED after {time.monotonic() - t0:.1f} s: {str(exc).splitlines()[0]}")
    if rank == 0:  # the collective fails as soon as the sockets are shut, before abort() returned and printed
        timer.join(10)
    os._exit(0)
""")


def test_gloo_abort_fails_the_blocked_collective_and_the_peers_instead_of_the_timeout(tmp_path):
    prog = tmp_path / "peer.py"
    prog.write_text(PEER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, str(prog), str(r), str(port)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    # without the abort both would wait out the 60 s timeout ("Timed out waiting"); with it, the
    # connection of the generation fails on both sides
    assert "ABORTED" in outs[0] and "Connection closed" in outs[0] and "RETURNED" not in outs[0], outs[0]
    assert "Timed out" not in outs[0] + outs[1], outs
    assert "RAISED" in outs[1] and "RETURNED" not in outs[1], outs[1]
    n = int(re.search(r"ABORTED (\d+)", outs[0]).group(1))
    assert n >= 1


class FakePG:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def abort(self):
        self.log.append(("abort", self.name))

    def _get_backend(self, device):
        return SimpleNamespace(abort=lambda: self.log.append(("backend_abort", self.name)))


def _c10d(log, with_abort_pg=True, with_pg_abort=True, initialized=True):
    a, b = FakePG("a", log), FakePG("b", log)
    ns = SimpleNamespace(_world=SimpleNamespace(pg_names={a: "0", b: "1"}), is_initialized=lambda: initialized)
    if with_abort_pg:
        ns._abort_process_group = lambda group=None: log.append(("abort_process_group", group))
    ns.ProcessGroup = SimpleNamespace(abort=FakePG.abort) if with_pg_abort else SimpleNamespace()
    return ns, (a, b)


def test_nccl_uses_the_group_abort_of_every_group_when_torch_has_it():
    log = []
    c10d, (a, _) = _c10d(log)
    gone = FakePG("gone", log)  # a group torch no longer lists
    assert choose_nccl_abort(c10d) == "abort_process_group"
    assert abort_nccl_groups((a, gone), c10d=c10d) == "abort_process_group"
    assert log == [("abort_process_group", None), ("abort", "gone")]  # a registered group is not aborted twice


@pytest.mark.parametrize("pg_abort,expected", [(True, "abort"), (False, "backend_abort")])
def test_nccl_falls_back_to_each_group_newest_first(pg_abort, expected):
    pytest.importorskip("torch")
    log = []
    c10d, (a, b) = _c10d(log, with_abort_pg=False, with_pg_abort=pg_abort)
    method = abort_nccl_groups((a,), c10d=c10d)
    assert method == ("group_abort" if pg_abort else "backend_abort")
    assert log == [(expected, "b"), (expected, "a")]  # each once, newest first


def test_generation_abort_is_idempotent():
    log = []
    ab = GenerationAbort("gloo", 3, {})
    r1 = ab.abort("quiesce")
    r2 = ab.abort("release")
    assert r1 is r2 and r1.reason == "quiesce" and r1.method == "gloo:shutdown" and ab.aborted
    assert log == [] and os.getpid() > 0
