"""This machine's memcpy and checksum throughput, measured in CPU time of the calling thread: the physical
limit against which the protection path's CPU cost per byte is compared (docs/design.md section 4, "Cost").

``python -m phoenix_hpc.bench.throughput [--mib 64] [--repeat 5]`` prints one line per operation.
"""

from __future__ import annotations

import argparse
import time


def measure_mpi(comm, nbytes: int = 16 << 20, chunk_bytes: int = 4 << 20, repeat: int = 3,
                sleep_s: float = 50e-6) -> float | None:
    """Best-of-``repeat`` CPU nanoseconds of the calling thread per byte moved (sent + received) by a bare
    MPI ring exchange over ``comm`` (an mpi4py communicator; collective: every rank calls it): each rank
    sends ``nbytes`` to the next rank and receives as many from the previous one, in ``chunk_bytes``
    ``Isend``/``Irecv`` pairs (the runtime's chunking), testing them with a ``sleep_s`` pause between tests
    as the H2H engine does. This is the floor of the protection path's MPI category on this transport (on the
    local cluster: Open MPI over TCP loopback, whose kernel copies the bytes twice). None when ``comm`` has
    one rank."""
    rank, size = comm.Get_rank(), comm.Get_size()
    if size < 2:
        return None
    import numpy as np
    from mpi4py import MPI

    from phoenix_hpc.runtime.h2h import chunk_ranges

    src = np.random.default_rng(rank).integers(0, 256, nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    right, left = (rank + 1) % size, (rank - 1) % size
    best = float("inf")
    for _ in range(repeat):
        comm.Barrier()
        t0 = time.thread_time_ns()
        reqs = []
        for i, (a, b) in enumerate(chunk_ranges(nbytes, chunk_bytes)):
            reqs.append(comm.Irecv([dst[a:b], MPI.BYTE], source=left, tag=1000 + i))
            reqs.append(comm.Isend([src[a:b], MPI.BYTE], dest=right, tag=1000 + i))
        while not MPI.Request.Testall(reqs):
            time.sleep(sleep_s)
        best = min(best, (time.thread_time_ns() - t0) / (2 * nbytes))
    comm.Barrier()
    return best


def measure(nbytes: int = 64 << 20, repeat: int = 5) -> dict[str, float]:
    """Best-of-``repeat`` CPU nanoseconds per byte (``time.thread_time_ns``) of: ``memcpy`` (a torch
    ``copy_`` of ``nbytes`` between two written uint8 buffers, what the D2H does on CPU) and each
    checksum of :data:`phoenix_hpc.runtime.checksum.CHECKSUMS` over ``nbytes``. A checksum whose library
    is missing is left out. Best of several: other processes on a shared machine only make it slower."""
    import torch

    from phoenix_hpc.runtime.checksum import CHECKSUMS, checksum_function

    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.fill_(1)
    view = memoryview(src.numpy())

    def best(fn) -> float:
        out = float("inf")
        for _ in range(repeat):
            t0 = time.thread_time_ns()
            fn()
            out = min(out, (time.thread_time_ns() - t0) / nbytes)
        return out

    res = {"memcpy": best(lambda: dst.copy_(src))}
    for name in CHECKSUMS:
        f = checksum_function(name)
        try:
            f(view[:64])
        except ImportError:
            continue
        res[name] = best(lambda f=f: f(view))
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m phoenix_hpc.bench.throughput")
    ap.add_argument("--mib", type=int, default=64, help="buffer size, MiB")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args(argv)
    for name, ns in measure(a.mib << 20, a.repeat).items():
        print(f"{name:10s} {ns:.3f} ns/B  {1 / ns:.2f} GB/s (CPU time of one thread, best of {a.repeat})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
