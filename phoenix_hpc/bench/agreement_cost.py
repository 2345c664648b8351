"""What replica agreement costs on its own (docs/design.md section 6, *Cost*): on a rank, the 64-bit digest
over the parameter tensors' checksums per commit; at the coordinator, one commit report's digests taken and
compared (an in-process coordinator, every rank reporting every step, all replicas in agreement).

    python -m phoenix_hpc.bench.agreement_cost [--tensors 26,212] [--pp 4] [--dp 8] [--steps 2000]

Prints one line per measurement (microseconds, best of 5 repeats for the digest; the mean over all reports
for the coordinator). No GPU, no cluster."""

from __future__ import annotations

import tempfile
import time
import timeit

import click


def digest_us(n_tensors: int) -> float:
    """Best of 5 repeats of ``digest64`` over ``n_tensors`` checksums, microseconds per call."""
    from phoenix_hpc.runtime.checksum import digest64

    values = list(range(2**40, 2**40 + n_tensors))
    t = timeit.Timer(lambda: digest64(values))
    number, _ = t.autorange()
    return min(t.repeat(5, number)) / number * 1e6


def coordinator_us(pp: int, dp: int, steps: int, history: int) -> tuple[float, int, int]:
    """``(microseconds per report, reports, steps judged)``: every rank of a ``tp=1, pp, dp`` grid reports its
    newest ``history`` digests at each of ``steps`` steps to an in-process coordinator (``check_agreement``)."""
    from phoenix_hpc.control.coordinator import Coordinator, Slot
    from phoenix_hpc.control.handlers import check_agreement
    from phoenix_hpc.control.journal import Journal
    from phoenix_hpc.control.states import SlotState, slot_machine

    tmp = tempfile.mkdtemp(prefix="phoenix-agreement-")
    c = Coordinator(tmp, grid=(1, pp, dp), clock=time.monotonic)
    c.journal = Journal(tmp)
    slots = []
    for w in range(pp * dp):
        s = Slot(w, "n", w, "active", slot_machine("s", SlotState.ACTIVE), 0.0, logical_rank=w, generation=0, step=0)
        c.slots[w], c.rank_map[w] = s, w
        slots.append(s)
    n = 0
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        report = [[x, "0123456789abcdef"] for x in range(max(1, step - history + 1), step + 1)]
        for s in slots:
            check_agreement(c, s, 0, report)
            n += 1
    dt = time.perf_counter() - t0
    return dt / n * 1e6, n, c.agreement.checked


@click.command()
@click.option("--tensors", default="26,212", show_default=True, help="parameter tensors per rank (comma list)")
@click.option("--pp", default=4, show_default=True, type=click.IntRange(1, 64))
@click.option("--dp", default=8, show_default=True, type=click.IntRange(2, 512))
@click.option("--steps", default=2000, show_default=True, type=click.IntRange(1, 10**6))
def main(tensors: str, pp: int, dp: int, steps: int) -> None:
    from phoenix_hpc.runtime.protector import PARAM_DIGESTS_KEPT

    try:
        counts = [int(x) for x in tensors.split(",")]
    except ValueError:
        raise click.BadParameter(f"{tensors!r} is not a comma-separated list of integers", param_hint="--tensors")
    if not counts or min(counts) < 1:
        raise click.BadParameter(f"{tensors!r}: every count must be 1 or more", param_hint="--tensors")
    for k in counts:
        click.echo(f"digest64 over {k} checksums: {digest_us(k):.1f} us per commit")
    us, n, judged = coordinator_us(pp, dp, steps, PARAM_DIGESTS_KEPT)
    click.echo(f"check_agreement: {us:.1f} us per report of up to {PARAM_DIGESTS_KEPT} digests (tp=1, pp={pp}, "
               f"dp={dp}; {n} reports, {judged} steps x stages judged)")


if __name__ == "__main__":
    main()
