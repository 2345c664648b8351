"""How long a killed process takes to close its sockets, by its resident memory, with and without torch's
transparent huge pages: what the coordinator's process-exit detection waits for (docs/design.md section 6,
"process exit"). Prints numbers; it is not a test.

``python -m phoenix_hpc.bench.exit_time [--mib 100,600,2000] [--repeat 3]``

For each size and each value of ``THP_MEM_ALLOC_ENABLE`` (0, 1; what ``launcher.torch_huge_pages`` exports),
a child Python process connects to a local TCP socket, allocates that many MiB of torch CPU tensors (16 MiB
each, written once), says it is ready, and sleeps; this process reads the child's resident memory and the
part of it in huge pages (``/proc/PID/smaps_rollup``), sends SIGKILL and times the kill until its end of the
socket reads end-of-file (Linux closes a dying process's files only after it freed its memory: ``do_exit``
runs ``exit_mm`` before ``exit_files``). Medians over ``--repeat`` children, in milliseconds of wall time.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import time

TENSOR_MIB = 16

_CHILD = """
import socket, sys, time, torch
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
left, keep = int(sys.argv[2]), []
while left > 0:
    n = min(left, int(sys.argv[3]))
    keep.append(torch.ones(n << 18))  # n MiB of float32, written
    left -= n
s.sendall(b"r")
time.sleep(600)
"""


def kill_to_eof_ms(mib: int, thp: str, python: str = sys.executable) -> tuple[float, float | None, float | None]:
    """One child of ``mib`` MiB of tensors under ``THP_MEM_ALLOC_ENABLE=thp``: ``(kill -> EOF ms, resident MiB,
    of it in huge pages MiB)`` (the MiB are None where ``/proc/PID/smaps_rollup`` cannot be read). Raises
    RuntimeError when the child ends before it is ready (its stderr in the message)."""
    from phoenix_hpc.bench.recovery import resident_mib

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(120)
    env = dict(os.environ, THP_MEM_ALLOC_ENABLE=thp)
    child = subprocess.Popen([python, "-c", _CHILD, str(srv.getsockname()[1]), str(mib), str(TENSOR_MIB)],
                             env=env, stderr=subprocess.PIPE)
    try:
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(120)
            if conn.recv(1) != b"r":
                raise RuntimeError(f"the {mib} MiB child ended before it was ready: "
                                   f"{child.communicate()[1].decode(errors='replace')[-400:]}")
            rss, huge = resident_mib(child.pid)
            t0 = time.perf_counter()
            os.kill(child.pid, signal.SIGKILL)
            conn.recv(1)  # b"": end-of-file once the kernel closed the child's socket
            ms = (time.perf_counter() - t0) * 1e3
    finally:
        srv.close()
        if child.poll() is None:
            child.kill()
        child.wait()
        if child.stderr is not None:
            child.stderr.close()
    return ms, rss, huge


def parse_sizes(text: str) -> list[int]:
    """``--mib``: comma-separated whole numbers of MiB, each >= 1. Raises ValueError naming what is allowed."""
    parts = [p.strip() for p in text.split(",")]
    if not parts or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(f"--mib: {text!r} is not allowed (allowed: comma-separated whole numbers of MiB, each >= 1)")
    return [int(p) for p in parts]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m phoenix_hpc.bench.exit_time", description=__doc__.splitlines()[0])
    ap.add_argument("--mib", default="100,600,2000", help="resident sizes to try, MiB, comma-separated")
    ap.add_argument("--repeat", default="3", help="children per size and setting (>= 1)")
    a = ap.parse_args(argv)
    try:
        sizes = parse_sizes(a.mib)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not (a.repeat.isdigit() and int(a.repeat) >= 1):
        print(f"error: --repeat: {a.repeat!r} is not allowed (allowed: a whole number >= 1)", file=sys.stderr)
        return 2
    repeat = int(a.repeat)
    print(f"{'MiB':>6} {'THP':>4} {'resident MiB':>13} {'huge MiB':>9} {'kill -> EOF ms (median)':>24}  trials")
    for mib in sizes:
        for thp in ("0", "1"):  # alternating the settings per size keeps a drift of the host off one of them
            got = [kill_to_eof_ms(mib, thp) for _ in range(repeat)]
            ms = [g[0] for g in got]
            rss, huge = got[-1][1], got[-1][2]
            fmt = (lambda v: "-" if v is None else f"{v:.0f}")
            print(f"{mib:>6} {thp:>4} {fmt(rss):>13} {fmt(huge):>9} {statistics.median(ms):>24.1f}  "
                  + ", ".join(f"{x:.1f}" for x in ms), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
