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


def make_protector(engine, comm, device, commit_timeout_s: float = 600.0, **options):
    """``Protector.create`` for logical rank 0 of a 1x1x1 grid with :func:`local_placement`; ``options``:
    more of its keyword arguments (``interval_cap``, ``checksum``, ``d2h_copy_chunk_bytes``...)."""
    from phoenix_hpc.runtime.protector import Protector

    return Protector.create(engine=engine, comm=comm, placement=local_placement(), logical_rank=0,
                            grid={"tp": 1, "pp": 1, "dp": 1}, generation=0, chunk_bytes=64 << 20, log=None,
                            device=device, commit_timeout_s=commit_timeout_s, **options)


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


def steps_ratio(on: list[float], off: list[float]) -> dict[str, Any]:
    """``ratio`` (median of ``on`` over median of ``off``, step milliseconds) and ``ratio_ci95`` (95 %
    bootstrap interval, :func:`phoenix_hpc.bench.stats.median_ratio`; pure)."""
    r = S.median_ratio(on, off)
    return {"ratio": round(r.value, 4), "ratio_ci95": [round(r.lo, 4), round(r.hi, 4)]}


def contention(engine, protector, buf, tokens: int, steps: int, one_copy_bytes: int | None = None,
               kinds: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Where protection slows a step besides the exposed wait: ``steps`` unprotected steps train while a
    background thread repeats one kind of work back to back (:data:`PASS_GAP_S` between passes), each kind in
    turn:

    - ``copy``: the runtime's D2H of the live state into ``buf`` (:meth:`~phoenix_hpc.runtime.d2h.D2H.copy`:
      side stream, pinned buffer; no checksum), which keeps the GPU's device-to-host copy engine busy (on
      an H200 the step slowed the same with the whole snapshot queued at once or two 64 MiB groups at a
      time, so the training's own small copies do not just wait behind the queue: BENCHMARKS.md, the GPU
      run's note);
    - ``copy_chunked``: the same copy with every tensor split into commands of :data:`CHUNKED_COPY_BYTES`
      (``resilience.d2h_copy_chunk_bytes``; a second :class:`~phoenix_hpc.runtime.d2h.D2H`): the remedy for
      the training's own work waiting behind long copy commands;
    - ``copy_coalesced``: the same copy with runs of tensors of one device storage in one command each
      (``resilience.d2h_copy_coalesce``): the remedy for a thousand copies issued from a Python thread;
    - ``checksum``: the protector's checksums of ``buf`` on its checksum threads
      (:func:`~phoenix_hpc.runtime.checksum_pool.checksum_groups`), host work only, which takes cores and the
      GIL between tensors from the training thread that launches the kernels;
    - ``one_copy``: one contiguous device tensor of ``one_copy_bytes`` (default :data:`ONE_COPY_BYTES`)
      copied into a pinned host tensor by a single call per pass (on CUDA on a side stream, then that
      stream synchronised; on CPU a plain copy into unpinned memory): the same copy engine and
      link as ``copy`` with almost no host work. If the step slows beside ``copy`` but not beside this one,
      issuing the snapshot tensor by tensor (Python, the GIL, the driver) is what slows it; if beside both,
      the transfer itself does;
    - ``chunked_copy``: the same bytes as ``one_copy`` in commands of :data:`CHUNKED_COPY_BYTES` (4 MiB; the
      same side stream, one synchronisation per pass). If the step slows beside ``one_copy`` but much less
      beside this one, the training's own copies wait for a long command on the copy engine to end (then
      splitting the snapshot's large tensors would help); if beside both alike, the link's bandwidth is shared;
    - ``registered_copy``: ``one_copy`` into page-locked memory of the protector's own kind
      (:func:`phoenix_hpc.runtime.pinned.pinned_empty`, ``cudaHostRegister`` of an anonymous mapping) instead
      of torch's ``cudaHostAlloc``: if the step slows beside this one but not beside ``one_copy``, the
      registration of the buffers is what costs;
    - ``gil``: pure Python work (no CUDA, no copy) that holds the GIL between its bytecodes, as a Python copy
      loop does: if the step slows beside this one, the training thread waits for the interpreter;
    - ``host_copy``: a host-to-host copy of ``one_copy_bytes`` (torch releases the GIL), which loads the host
      memory's bandwidth as the D2H's landing bytes do: if the step slows beside this one, host memory
      bandwidth is shared.

    ``kinds``: the kinds to run, in this order (default all of them).

    Call after ``protector.close()``, with ``buf`` a host buffer of ``protector.layout`` nothing else uses.
    Returns, per kind, the median step time (``{kind}_only_ms_median``, ms; the first step of each block
    dropped), the passes the thread made per step and the median time of each phase of the step on the
    training thread (``{kind}_phase_ms``, :func:`phase_times`); first the same for ``steps`` steps with no
    thread (``alone_ms_median``, ``alone_phase_ms``), the reference measured beside them. Raises what the
    thread raised."""
    import threading

    from phoenix_hpc.runtime.checksum import checksum_function
    from phoenix_hpc.runtime.checksum_pool import checksum_groups
    from phoenix_hpc.runtime.h2h import chunk_ranges

    import torch

    opt, par = engine.optimizer_shard(), engine.param_shard()
    slots, fn = protector.layout.slots, checksum_function(protector.checksum)
    device = (opt or par)[0][1].device
    n = ONE_COPY_BYTES if one_copy_bytes is None else one_copy_bytes
    cuda = device.type == "cuda"
    src = torch.ones(n, dtype=torch.uint8, device=device)
    dst = torch.empty(n, dtype=torch.uint8, pin_memory=cuda)
    side = torch.cuda.Stream(device=device) if cuda else None
    if side is not None:
        side.wait_stream(torch.cuda.current_stream(device))  # src is filled before the first pass reads it

    def copy_into(target: torch.Tensor) -> None:  # one command on the side stream, one synchronisation
        if side is None:
            target.copy_(src)
            return
        with torch.cuda.stream(side):
            target.copy_(src, non_blocking=True)
        side.synchronize()

    def one_copy() -> None:
        copy_into(dst)

    pieces = chunk_ranges(n, CHUNKED_COPY_BYTES)  # the H2H engine's chunking: [start, end) byte ranges

    def chunked_copy() -> None:
        if side is None:
            for a, b in pieces:
                dst[a:b].copy_(src[a:b])
            return
        with torch.cuda.stream(side):
            for a, b in pieces:
                dst[a:b].copy_(src[a:b], non_blocking=True)
        side.synchronize()

    def registered_copy() -> None:
        copy_into(reg)

    def gil() -> None:  # about a millisecond of bytecodes, no call that releases the GIL
        x = 0
        for i in range(20000):
            x += i * i

    host_src = torch.ones(n, dtype=torch.uint8)
    host_dst = torch.empty(n, dtype=torch.uint8)

    chosen = tuple(KINDS if kinds is None else kinds)
    unknown = [k for k in chosen if k not in KINDS]
    if unknown:
        raise ValueError(f"contention kinds {unknown}: allowed {KINDS}")
    reg = None
    if "registered_copy" in chosen:
        from phoenix_hpc.runtime.pinned import pinned_empty

        reg = pinned_empty(n) if cuda else torch.empty(n, dtype=torch.uint8)
    from phoenix_hpc.runtime.d2h import D2H

    chunked_d2h = D2H(device, copy_chunk_bytes=CHUNKED_COPY_BYTES) if "copy_chunked" in chosen else None
    coalesced_d2h = D2H(device, copy_coalesce=True) if "copy_coalesced" in chosen else None
    work_all = {
        "copy": lambda: protector.d2h.copy(protector.d2h.mark(), buf, protector.layout, opt, par),
        "copy_chunked": lambda: chunked_d2h.copy(chunked_d2h.mark(), buf, protector.layout, opt, par),
        "copy_coalesced": lambda: coalesced_d2h.copy(coalesced_d2h.mark(), buf, protector.layout, opt, par),
        "checksum": lambda: checksum_groups(memoryview(buf.numpy()), slots, [len(slots)], lambda i: None, fn,
                                            protector.d2h.checksums),
        "one_copy": one_copy,
        "chunked_copy": chunked_copy,
        "registered_copy": registered_copy,
        "gil": gil,
        "host_copy": lambda: host_dst.copy_(host_src),
    }
    work = {k: work_all[k] for k in chosen}
    out: dict[str, Any] = {}
    recs, phases = timed_train(engine, steps, tokens)
    out["alone_ms_median"], out["alone_phase_ms"] = step_medians(recs, phases)
    out["alone_steps_ms"] = kept_steps(recs)
    for name, one in work.items():
        stop, passes, errors = threading.Event(), [0], []

        def loop(one=one, stop=stop, passes=passes, errors=errors) -> None:
            try:
                while not stop.is_set():
                    one()
                    passes[0] += 1
                    # a pause of PASS_GAP_S between passes: a pass of a few microseconds (a small model on
                    # CPU) would otherwise keep the GIL from the training thread for whole switch intervals
                    stop.wait(PASS_GAP_S)
            except BaseException as e:  # noqa: BLE001 -- raised below, in the caller
                errors.append(e)

        th = threading.Thread(target=loop, name=f"phoenix-contention-{name}", daemon=True)
        th.start()
        try:
            recs, phases = timed_train(engine, steps, tokens)
        finally:
            stop.set()
            th.join()
        if errors:
            raise errors[0]
        out[f"{name}_only_ms_median"], out[f"{name}_phase_ms"] = step_medians(recs, phases)
        out[f"{name}_steps_ms"] = kept_steps(recs)
        out[f"{name}_passes_per_step"] = round(passes[0] / max(1, len(recs)), 2)
    protector.d2h.checksums.close()
    for extra in (chunked_d2h, coalesced_d2h):
        if extra is not None:
            extra.forget()
    return out


def timed_train(engine, steps: int, tokens: int) -> tuple[list, list[dict[str, float]]]:
    """Train ``steps`` unprotected steps; returns their records and :func:`phase_times` of them."""
    import time

    from phoenix_hpc.launch.loop import train

    marks: list[tuple[str, float]] = []
    recs = train(engine, engine.step + steps, tokens, on_step=lambda rec: marks.append(("end", time.perf_counter())),
                 phase_hook=lambda s, phase: marks.append((phase, time.perf_counter())))
    return recs, phase_times(marks)


def kept_steps(recs: list) -> list[float]:
    """Step milliseconds of :func:`timed_train`'s records, the first dropped when there are more (pure)."""
    return [round(r.step_time_ms, 3) for r in (recs[1:] if len(recs) > 1 else recs)]


def phase_times(marks: list[tuple[str, float]]) -> list[dict[str, float]]:
    """Per step, milliseconds from each phase's start to the next mark (pure): ``marks`` are ``(phase,
    perf_counter seconds)`` in order, as :func:`~phoenix_hpc.launch.loop.train`'s ``phase_hook`` gives them
    (``forward_backward``, ``reduce_gradients``, ``optimizer_step``; ``wait_commit`` with a protector), each
    step closed by an ``("end", t)`` mark from its ``on_step``. On CUDA these are the training thread's
    times: kernels run asynchronously, so a phase's time includes the waits of the synchronising calls in
    it (the loss and the gradient norm read as Python floats) for everything queued before."""
    out, cur = [], []
    for phase, t in marks:
        cur.append((phase, t))
        if phase == "end":
            out.append({a: round((tb - ta) * 1e3, 3) for (a, ta), (_, tb) in zip(cur, cur[1:])})
            cur = []
    return out


def median_phases(steps: list[dict[str, float]]) -> dict[str, float]:
    """The median of each phase's milliseconds over ``steps`` (:func:`phase_times`; pure)."""
    return {k: round(statistics.median(s[k] for s in steps if k in s), 2) for k in (steps[0] if steps else {})}


def step_medians(recs: list, phases: list[dict[str, float]]) -> tuple[float, dict[str, float]]:
    """The median step time (ms) of :func:`timed_train`'s records and :func:`median_phases` of its phases,
    the first step dropped when there are more (it pays for the switch of background work; pure)."""
    kept = slice(1, None) if len(recs) > 1 else slice(None)
    return round(statistics.median(r.step_time_ms for r in recs[kept]), 2), median_phases(phases[kept])


#: seconds :func:`contention`'s thread sleeps between two passes (on an H200 a ``copy`` pass of the 1B
#: model's 14.1 GB took 258 ms, so this is under 1 % of its time; a ``one_copy`` pass of 1 GiB at the
#: 55 GB/s measured there would take about 20 ms, computed, not measured: 5 %)
PASS_GAP_S = 1e-3

#: :func:`contention`'s kinds of background work, in run order
KINDS = ("copy", "copy_chunked", "copy_coalesced", "checksum", "one_copy", "chunked_copy", "registered_copy", "gil", "host_copy")

#: bytes of :func:`contention`'s ``one_copy`` (1 GiB: about 20 ms per pass at the 55 GB/s measured on an H200,
#: computed)
ONE_COPY_BYTES = 1 << 30

#: bytes per command of :func:`contention`'s ``chunked_copy`` (4 MiB: about 76 us on the copy engine at 55 GB/s,
#: computed, against about 20 ms for ``one_copy``'s single command)
CHUNKED_COPY_BYTES = 4 << 20


def gbs(nbytes: int, seconds: float) -> float:
    """GB/s (1e9 bytes per second), rounded to 0.01; 0 for a zero time."""
    return round(nbytes / seconds / 1e9, 2) if seconds > 0 else 0.0
