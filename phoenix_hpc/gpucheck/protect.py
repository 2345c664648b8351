"""The runtime's protector on one rank, as the GPU checks drive it (device-agnostic: CPU or CUDA).

One rank has no peer to hold a replica, so the protector runs with a placement of ``k = 0``: every step's
D2H into the pinned ping-pong buffers, the CRC-32 of every tensor, the commit and the commit fence run as
in a job; H2H does not. :func:`abba` interleaves protected and unprotected blocks in one process
(docs/design.md section 1's method, :func:`phoenix_hpc.bench.stats.interleaved_order`);
:func:`summarize_abba` is its pure analysis.
"""

from __future__ import annotations

import statistics
from typing import Any

from phoenix_hpc.bench import stats as S

#: Limit shared by the checks that protect one rank.
NO_PEER = ("one rank has no DP peer, so k=0: no H2H, no replica held for a peer (the 2k x shard term is 0); "
           "H2H and held replicas are measured on CPU nodes (BENCHMARKS.md sections 1 and 4)")


def local_placement():
    """A placement with ``k = 0`` and no replicas (local snapshot only)."""
    from phoenix_hpc.topology import Placement

    return Placement(k=0, levels=("node",), replicas=(), warnings=())


def make_protector(engine, comm, device, commit_timeout_s: float = 600.0):
    """``Protector.create`` for logical rank 0 of a 1x1x1 grid with :func:`local_placement`."""
    from phoenix_hpc.runtime.protector import Protector

    return Protector.create(engine=engine, comm=comm, placement=local_placement(), logical_rank=0,
                            grid={"tp": 1, "pp": 1, "dp": 1}, generation=0, chunk_bytes=64 << 20, log=None,
                            device=device, commit_timeout_s=commit_timeout_s)


def abba(engine, protector, tokens: int, rounds: int, block_steps: int) -> list[dict]:
    """Train ``rounds`` ABBA pairs of ``block_steps``-step blocks, protected (``on``) and not (``off``).
    Returns one ``{"mode", "block", "step", "step_ms", "wait_ms"}`` per step (``wait_ms``: the time blocked
    in ``wait_commit`` before ``optimizer_step``, 0 when off)."""
    from phoenix_hpc.launch.loop import train

    out: list[dict] = []
    for b, on in enumerate(S.interleaved_order(rounds)):
        recs = train(engine, engine.step + block_steps, tokens, protector=protector if on else None)
        out += [{"mode": "on" if on else "off", "block": b, "step": r.step, "step_ms": r.step_time_ms,
                 "wait_ms": r.exposed_wait_ms} for r in recs]
    return out


def summarize_abba(steps: list[dict], drop_first: int = 1, trim: float = 0.05) -> dict[str, Any]:
    """Per-step overhead from :func:`abba`'s steps (pure): the first ``drop_first`` steps of every block are
    dropped (the step after a switch pays for it), the slowest ``trim`` of each mode trimmed; the ratio of
    medians on/off with a 95 % bootstrap interval; the exposed wait (median, p75, max, ms) of on steps.

    Raises:
        BenchError: a mode without steps left.
    """
    first: dict[int, int] = {}
    for s in steps:
        first[s["block"]] = min(first.get(s["block"], s["step"]), s["step"])
    kept = [s for s in steps if s["step"] >= first[s["block"]] + drop_first]
    on = S.trim_slowest([s["step_ms"] for s in kept if s["mode"] == "on"], trim)
    off = S.trim_slowest([s["step_ms"] for s in kept if s["mode"] == "off"], trim)
    wait = [s["wait_ms"] for s in kept if s["mode"] == "on"]
    r = S.median_ratio(on, off)
    return {"ratio": round(r.value, 4), "ratio_ci95": [round(r.lo, 4), round(r.hi, 4)],
            "steps_on": len(on), "steps_off": len(off),
            "on_ms_median": round(statistics.median(on), 2), "off_ms_median": round(statistics.median(off), 2),
            "exposed_wait_ms_median": round(statistics.median(wait), 3),
            "exposed_wait_ms_p75": round(S.quantile(wait, 0.75), 3), "exposed_wait_ms_max": round(max(wait), 3)}


def snapshot_matches(protector, engine) -> list[str]:
    """Names of the tensors whose committed local snapshot differs from the engine's live state (call right
    after ``protector.flush(engine)``); compared on the engine's device."""
    u = protector.local_snapshot()
    bad = []
    for n, t in engine.optimizer_shard() + engine.param_shard():
        got = u.tensors.get(n)
        if got is None or got.dtype != t.dtype or not bool((got.to(t.device).reshape(t.shape) == t).all()):
            bad.append(n)
    return bad


def contention(engine, protector, buf, tokens: int, steps: int, one_copy_bytes: int | None = None) -> dict[str, Any]:
    """Where protection slows a step besides the exposed wait: ``steps`` unprotected steps train while a
    background thread repeats one kind of work back to back, each kind in turn:

    - ``copy``: the runtime's D2H of the live state into ``buf`` (:meth:`~phoenix_hpc.runtime.d2h.D2H.copy`:
      side stream, pinned buffer; no checksum), which keeps the GPU's device-to-host copy engine busy (on
      an H200 the step slowed the same with the whole snapshot queued at once or two 64 MiB groups at a
      time, so the training's own small copies do not just wait behind the queue: BENCHMARKS.md, the GPU
      run's note);
    - ``checksum``: the protector's checksums of ``buf`` on its checksum threads
      (:func:`~phoenix_hpc.runtime.checksum_pool.checksum_groups`), host work only, which takes cores and the
      GIL between tensors from the training thread that launches the kernels;
    - ``one_copy``: one contiguous device tensor of ``one_copy_bytes`` (default :data:`ONE_COPY_BYTES`)
      copied into a pinned host tensor by a single call per pass (on CUDA on a side stream, then that
      stream synchronised; on CPU a plain copy into unpinned memory): the same copy engine and
      link as ``copy`` with almost no host work. If the step slows beside ``copy`` but not beside this one,
      issuing the snapshot tensor by tensor (Python, the GIL, the driver) is what slows it; if beside both,
      the transfer itself does.

    Call after ``protector.close()``, with ``buf`` a host buffer of ``protector.layout`` nothing else uses.
    Returns, per half, the median step time (ms; the first step of each block dropped) and the passes the
    thread made per step; the unprotected steps before them are the reference. Raises what the thread
    raised."""
    import threading

    from phoenix_hpc.launch.loop import train
    from phoenix_hpc.runtime.checksum import checksum_function
    from phoenix_hpc.runtime.checksum_pool import checksum_groups

    import torch

    opt, par = engine.optimizer_shard(), engine.param_shard()
    slots, fn = protector.layout.slots, checksum_function(protector.checksum)
    device = (opt or par)[0][1].device
    n = ONE_COPY_BYTES if one_copy_bytes is None else one_copy_bytes
    cuda = device.type == "cuda"
    src = torch.ones(n, dtype=torch.uint8, device=device)
    dst = torch.empty(n, dtype=torch.uint8, pin_memory=cuda)
    side = torch.cuda.Stream(device=device) if cuda else None

    def one_copy() -> None:
        if side is None:
            dst.copy_(src)
            return
        with torch.cuda.stream(side):
            dst.copy_(src, non_blocking=True)
        side.synchronize()

    work = {
        "copy": lambda: protector.d2h.copy(protector.d2h.mark(), buf, protector.layout, opt, par),
        "checksum": lambda: checksum_groups(memoryview(buf.numpy()), slots, [len(slots)], lambda i: None, fn,
                                            protector.d2h.checksums),
        "one_copy": one_copy,
    }
    out: dict[str, Any] = {}
    for name, one in work.items():
        stop, passes, errors = threading.Event(), [0], []

        def loop(one=one, stop=stop, passes=passes, errors=errors) -> None:
            try:
                while not stop.is_set():
                    one()
                    passes[0] += 1
            except BaseException as e:  # noqa: BLE001 -- raised below, in the caller
                errors.append(e)

        th = threading.Thread(target=loop, name=f"phoenix-contention-{name}", daemon=True)
        th.start()
        try:
            recs = train(engine, engine.step + steps, tokens)
        finally:
            stop.set()
            th.join()
        if errors:
            raise errors[0]
        kept = [r.step_time_ms for r in recs[1:]] or [r.step_time_ms for r in recs]
        out[f"{name}_only_ms_median"] = round(statistics.median(kept), 2)
        out[f"{name}_passes_per_step"] = round(passes[0] / max(1, len(recs)), 2)
    protector.d2h.checksums.close()
    return out


#: bytes of :func:`contention`'s ``one_copy`` (1 GiB: about 20 ms per pass at the 55 GB/s measured on an H200)
ONE_COPY_BYTES = 1 << 30


def gbs(nbytes: int, seconds: float) -> float:
    """GB/s (1e9 bytes per second), rounded to 0.01; 0 for a zero time."""
    return round(nbytes / seconds / 1e9, 2) if seconds > 0 else 0.0
