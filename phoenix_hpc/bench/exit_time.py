"""How long a killed process takes to close its sockets, by the memory it holds, with and without torch's
transparent huge pages: what the coordinator's process-exit detection waits for (docs/design.md section 6,
"process exit"). Prints numbers; it is not a test.

``python -m phoenix_hpc.bench.exit_time [--mib 100,600,2000] [--repeat 3]``

For each size, ``--repeat`` rounds, each round one child with ``THP_MEM_ALLOC_ENABLE=0`` and one with ``=1``
(what ``launcher.torch_huge_pages`` exports), so a drift of the host reaches both settings alike: the child
Python process connects to a local TCP socket, allocates ``--mib`` MiB of torch CPU tensors (16 MiB each,
written once; its interpreter and torch's libraries come on top), says it is ready and blocks on the socket;
this process reads the child's resident memory and the part of it in huge pages (``/proc/PID/smaps_rollup``),
sends SIGKILL and times the kill until its end of the socket reads end-of-file (Linux closes a dying
process's files only after it freed its memory: ``do_exit`` calls ``exit_mm`` before ``exit_files``, in
kernel/exit.c). Per size and setting: medians over the rounds, milliseconds of wall time and MiB.

Exit status: 0 done; 1 a child or its socket failed (the error is printed, with the child's stderr); 2 bad
arguments (named, with what is allowed).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time

TENSOR_MIB = 16
READY_TIMEOUT_S = 120.0

# the child blocks on its socket, so it also ends when this process does (end-of-file)
_CHILD = """
import socket, sys, torch
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
left, keep = int(sys.argv[2]), []
while left > 0:
    n = min(left, int(sys.argv[3]))
    keep.append(torch.ones(n << 18))  # n MiB of float32, written
    left -= n
s.sendall(b"r")
s.recv(1)
"""


def kill_to_eof_ms(mib: int, thp: str, python: str = sys.executable) -> tuple[float, float | None, float | None]:
    """One child holding ``mib`` MiB of tensors under ``THP_MEM_ALLOC_ENABLE=thp``: ``(kill -> EOF in ms,
    resident MiB, of it in huge pages MiB)`` (the MiB are None where ``/proc/PID/smaps_rollup`` cannot be read).

    Raises RuntimeError when the child ends, or is not ready within ``READY_TIMEOUT_S``, before it is killed
    (its stderr in the message)."""
    from phoenix_hpc.profiles.model import TORCH_THP_VARIABLE
    from phoenix_hpc.slurm.procs import resident_mib

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(0.2)
    env = {**os.environ, TORCH_THP_VARIABLE: thp}
    child = subprocess.Popen([python, "-c", _CHILD, str(srv.getsockname()[1]), str(mib), str(TENSOR_MIB)],
                             env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def failed(what: str) -> RuntimeError:
        if child.poll() is None:
            child.kill()
        err = child.communicate()[1].decode(errors="replace")[-600:]
        return RuntimeError(f"the {mib} MiB child (THP_MEM_ALLOC_ENABLE={thp}) {what}; its stderr: {err or '(empty)'}")

    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        conn = None
        while conn is None:
            try:
                conn, _ = srv.accept()
            except socket.timeout:
                if child.poll() is not None:
                    raise failed(f"exited with status {child.returncode} before it connected") from None
                if time.monotonic() > deadline:
                    raise failed(f"did not connect within {READY_TIMEOUT_S:.0f} s") from None
        with conn:
            conn.settimeout(READY_TIMEOUT_S)
            try:
                ready = conn.recv(1)
            except socket.timeout:
                ready = b""
            if ready != b"r":
                raise failed("was not ready (ended, or no word within the timeout)")
            rss, huge = resident_mib(child.pid)
            t0 = time.perf_counter()
            os.kill(child.pid, signal.SIGKILL)
            end = conn.recv(1)  # b"": end-of-file once the kernel closed the child's socket
            ms = (time.perf_counter() - t0) * 1e3
            if end != b"":
                raise failed(f"sent {end!r} after it was killed instead of closing its socket")
    finally:
        srv.close()
        if child.poll() is None:
            child.kill()
        child.wait()
        if child.stderr is not None:
            child.stderr.close()
    return ms, rss, huge


def parse_sizes(text: str, available_mib: float | None = None) -> list[int]:
    """``--mib``: comma-separated whole numbers of MiB, each >= 1 and, with ``available_mib``, at most half of
    it (one child at a time holds the size, plus its interpreter). Raises ValueError naming what is allowed."""
    parts = [p.strip() for p in text.split(",")]
    if not all(re.fullmatch(r"[0-9]{1,9}", p) and int(p) >= 1 for p in parts):
        raise ValueError(f"--mib: {text!r} is not allowed (allowed: comma-separated whole numbers of MiB, each >= 1)")
    sizes = [int(p) for p in parts]
    if available_mib is not None and max(sizes) > available_mib / 2:
        raise ValueError(f"--mib: {max(sizes)} is not allowed: more than half of this host's MemAvailable "
                         f"({available_mib:.0f} MiB); allowed: 1 to {int(available_mib / 2)}")
    return sizes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m phoenix_hpc.bench.exit_time", description=__doc__.splitlines()[0])
    ap.add_argument("--mib", default="100,600,2000",
                    help="MiB of torch tensors each child holds (its interpreter and libraries come on top), comma-separated")
    ap.add_argument("--repeat", default="3", help="rounds per size, each one child per setting (>= 1)")
    a = ap.parse_args(argv)
    from phoenix_hpc.runtime.buffers import read_mem_available

    try:
        sizes = parse_sizes(a.mib, read_mem_available() / 2**20)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not (re.fullmatch(r"[0-9]{1,4}", a.repeat) and int(a.repeat) >= 1):
        print(f"error: --repeat: {a.repeat!r} is not allowed (allowed: a whole number from 1 to 9999)", file=sys.stderr)
        return 2
    repeat = int(a.repeat)
    fmt = (lambda v: "-" if v is None else f"{v:.0f}")
    med = (lambda xs: None if any(x is None for x in xs) else statistics.median(xs))
    print(f"{'MiB':>6} {'THP':>4} {'resident MiB':>13} {'huge MiB':>9} {'kill -> EOF ms (median)':>24}  rounds")
    for mib in sizes:
        got: dict[str, list] = {"0": [], "1": []}
        try:
            for _ in range(repeat):
                for thp in got:
                    got[thp].append(kill_to_eof_ms(mib, thp))
        except (RuntimeError, OSError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        for thp, rs in got.items():
            ms = [r[0] for r in rs]
            print(f"{mib:>6} {thp:>4} {fmt(med([r[1] for r in rs])):>13} {fmt(med([r[2] for r in rs])):>9} "
                  f"{statistics.median(ms):>24.1f}  " + ", ".join(f"{x:.1f}" for x in ms), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
