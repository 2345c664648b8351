"""This machine's memcpy and checksum throughput, measured in CPU time of the calling thread: the physical
limit against which the protection path's CPU cost per byte is compared (docs/design.md section 4, "Cost").

``python -m phoenix_hpc.bench.throughput [--mib 64] [--repeat 5]`` prints one line per operation.
"""

from __future__ import annotations

import argparse
import time


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
