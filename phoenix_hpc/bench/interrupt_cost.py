"""What the idle backward hooks of :mod:`phoenix_hpc.launch.interrupt` cost a fault-free step. A whole
forward + backward with and without the hooks differs by less than this host's noise, so the cost is taken
apart: the thread CPU time of one idle hook call (a backward over ``--calls`` one-element parameters, each
hooked, against the same backward unhooked), times the hooks the launcher puts on the benchmark's GPT
(:func:`phoenix_hpc.launch.interrupt.spaced`), against that model's forward + backward thread CPU time (one
micro-batch, one torch thread). Prints numbers; it is not a test.

Usage: ``python -m phoenix_hpc.bench.interrupt_cost [--size S|M|L] [--calls 20000]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def hook_ns(calls: int) -> float:
    """Thread CPU nanoseconds of one idle backward-hook call (no interrupt requested): a backward over 64
    one-element parameters, all hooked, against the same backward without hooks; the median over 9 pairs
    of rounds of ``calls`` calls each (may come out below 0 where the cost is under the noise)."""
    import torch

    from phoenix_hpc.launch.interrupt import ComputeInterrupt

    ws = [torch.nn.Parameter(torch.ones(1)) for _ in range(64)]
    rounds = max(1, calls // len(ws))

    def cpu_ns() -> int:
        t0 = time.thread_time_ns()
        for _ in range(rounds):
            torch.stack(ws).sum().backward()
        return time.thread_time_ns() - t0

    ci = ComputeInterrupt()
    diffs = []
    for _ in range(9):
        bare = cpu_ns()
        handles = [w.register_post_accumulate_grad_hook(ci._grad_hook) for w in ws]
        hooked = cpu_ns()
        for h in handles:
            h.remove()
        diffs.append((hooked - bare) / (rounds * len(ws)))
    return statistics.median(diffs)


def step_ms(size: str, steps: int = 10) -> tuple[float, int]:
    """Median thread CPU milliseconds of one forward + backward of the benchmark's GPT ``size`` (one
    micro-batch of 2 sequences, one torch thread), and the number of parameters the launcher hooks in it."""
    import torch

    from phoenix_hpc.bench.jobs import MODEL_SIZES
    from phoenix_hpc.engines.torch_gpt import GPTShape, GPTStage, lm_loss
    from phoenix_hpc.launch.interrupt import BACKWARD_CHECKS, spaced

    torch.set_num_threads(1)
    m = MODEL_SIZES[size]
    shape = GPTShape(m["layers"], m["hidden_size"], m["heads"], 256, m["seq_length"])
    model = GPTStage(shape, 1, 0, seed=1)
    params = list(model.parameters())
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (2, shape.seq_length), generator=gen)
    y = torch.randint(0, 256, (2, shape.seq_length), generator=gen)
    out = []
    for i in range(steps + 2):
        for p in params:
            p.grad = None
        t0 = time.thread_time_ns()
        lm_loss(model(x), y).backward()
        if i >= 2:
            out.append((time.thread_time_ns() - t0) / 1e6)
    return statistics.median(out), len(spaced([p.numel() for p in params], BACKWARD_CHECKS))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="S")
    ap.add_argument("--calls", default="20000")
    a = ap.parse_args(argv)
    from phoenix_hpc.bench.jobs import MODEL_SIZES

    if a.size not in MODEL_SIZES:
        print(f"error: --size: {a.size!r} is not allowed (allowed: {', '.join(sorted(MODEL_SIZES))})", file=sys.stderr)
        return 2
    if not a.calls.isdigit() or int(a.calls) < 64:
        print(f"error: --calls: {a.calls!r} is not allowed (allowed: a whole number >= 64)", file=sys.stderr)
        return 2
    ns = hook_ns(int(a.calls))
    ms, hooks = step_ms(a.size)
    print(f"idle backward hook: {ns:.0f} ns thread CPU per call (median of 9 x {int(a.calls)} calls); model {a.size}: "
          f"{hooks} hooked parameters, forward + backward {ms:.2f} ms thread CPU (one micro-batch, median of 10); "
          f"hooks per step {hooks * ns / 1e3:.1f} us = {hooks * ns / 1e4 / ms:.3f} % of it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
