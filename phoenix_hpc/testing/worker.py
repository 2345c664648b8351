"""One rank of a conformance run: ``python -m phoenix_hpc.testing.worker SPEC.json RANK``.

Started by :func:`phoenix_hpc.testing.harness.run_conformance` once per rank on this machine (over a
``FileStore``: gloo on CPU, or NCCL on CUDA device ``rank % device_count`` with the spec's ``"device":
"cuda"``). Runs the rules of :mod:`.rules` in a fixed order, in lockstep with the other ranks, and
writes ``OUT/rank{RANK}.json`` after each rule: ``{"rules": {rule: [violation, ...]}, "layout": ...,
"coord": ..., "completed": [rule, ...], "skipped": [rule, ...], "seconds": {rule: wall seconds},
"done": bool, "aborted_in": rule | null}``. A rule that raises records the exception and ends
the run (a peer may be stuck in a collective; the harness's timeout ends it).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path


def _new_generation(store, generation: int, rank: int, grid, owns_groups: bool, timeout_s: float,
                    backend: str = "gloo"):
    """Init torch.distributed for ``generation`` (over ``PrefixStore(f"gen{g}")``) as the launcher does;
    for an engine that owns its groups only the world group is built. ``backend``: gloo on CPU, nccl on
    CUDA."""
    import torch.distributed as dist

    from phoenix_hpc.engines.base import ProcessGroups
    from phoenix_hpc.launch.groups import init_generation
    from phoenix_hpc.topology import coord_of

    if not owns_groups:
        return init_generation(store, generation, rank, grid, backend, timeout_s)
    dist.init_process_group(backend, store=dist.PrefixStore(f"gen{generation}", store), rank=rank,
                            world_size=grid.world_size, timeout=timedelta(seconds=timeout_s))
    return ProcessGroups(dist.group.WORLD, None, None, None, generation), coord_of(rank, grid.tp, grid.pp, grid.dp)


def main(spec_path: str, rank: int) -> int:
    t_start = time.monotonic()
    import torch
    import torch.distributed as dist

    from phoenix_hpc.config.schema import JobConfig
    from phoenix_hpc.engines.factory import create_engine
    from phoenix_hpc.engines.user_code import load_engine_class
    from phoenix_hpc.errors import EngineError
    from phoenix_hpc.launch.groups import Grid
    from phoenix_hpc.testing import rules as R

    spec = json.loads(Path(spec_path).read_text())
    torch.set_num_threads(1)
    cuda = spec.get("device", "cpu") == "cuda"
    if cuda:  # as the launcher: deterministic cuBLAS needs this before the first cuBLAS call
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=cuda)
    cfg = JobConfig.model_validate(spec["config"])
    p = cfg.parallelism
    grid = Grid(p.tp, p.pp, p.dp)
    k, m, timeout_s = int(spec["steps"]), int(spec["steps"]), float(spec["timeout_s"])
    out_path = Path(spec["out"]) / f"rank{rank}.json"
    store = dist.FileStore(spec["store"], grid.world_size)
    cls = load_engine_class(cfg.engine, cfg.python_path)
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    backend = "nccl" if cuda else "gloo"
    res: dict = {"rules": {r: [] for r in R.RULES}, "layout": None, "coord": None, "done": False,
                 "aborted_in": None, "skipped": [], "completed": [], "seconds": {}}

    def write() -> None:
        tmp = out_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(res))
        os.replace(tmp, out_path)

    gen = 0
    groups, coord = _new_generation(store, gen, rank, grid, cls.owns_groups, timeout_s, backend)
    res["coord"] = {"pp": coord.pp, "dp": coord.dp, "tp": coord.tp}
    is_last = coord.pp == grid.pp - 1
    ctx: dict = {}

    def make():
        return create_engine(cfg, coord, groups, device)

    def next_generation(engine) -> None:
        nonlocal gen, groups, coord
        engine.release_groups()
        dist.destroy_process_group()
        gen += 1
        groups, coord = _new_generation(store, gen, rank, grid, cls.owns_groups, timeout_s, backend)

    def names(engine) -> list[str]:
        return sorted(n for n, _ in engine.param_shard() + engine.optimizer_shard())

    def renamed(before: list[str], after: list[str]) -> str:
        a, b = sorted(set(before) - set(after)), sorted(set(after) - set(before))
        return f"{len(a)} names gone (e.g. {a[:1]}), {len(b)} new (e.g. {b[:1]})"

    def rule_recovery_style() -> list[str]:
        return R.check_recovery_style(cls)

    def rule_ordering() -> list[str]:
        e = make()
        v = R.check_ordering(e, is_last)
        e.teardown()
        return v

    def rule_determinism() -> list[str]:
        a = make()
        R.run_steps(a, k + m)
        h_a = a.state_hash()
        a.teardown()
        b = make()
        R.run_steps(b, k)
        ctx["saved"] = R.save_state(b)
        ctx["names"] = names(b)
        R.run_steps(b, m)
        ctx["hash"] = b.state_hash()
        ctx["final"] = b
        if h_a != ctx["hash"]:
            return [f"two runs of {k + m} steps from a fresh engine gave different state hashes ({h_a[:12]} vs "
                    f"{ctx['hash'][:12]}): parameters, optimizer state and data order must be a pure function of the "
                    "config (seed, step, data position), not of the wall clock, the process or the run"]
        return []

    def rule_shard_names() -> list[str]:
        v, res["layout"] = R.shard_layout(ctx["final"])
        ctx.pop("final").teardown()
        return v

    def rule_save_restore() -> list[str]:
        v = []
        f = make()
        try:
            f.load_optimizer_shard({})
            v.append("load_optimizer_shard of an empty dict must raise EngineError (names missing), it returned")
        except EngineError:
            pass
        R.load_state(f, ctx["saved"])
        if f.step != k:
            v.append(f"after load_envelope of a step-{k} envelope, step is {f.step}")
        R.run_steps(f, m)
        if f.state_hash() != ctx["hash"]:
            v.append(f"an engine restored from the param shard, optimizer shard and envelope of step {k} did not "
                     f"continue bitwise: state hash after {m} more steps differs from the uninterrupted run's")
        f.teardown()
        return v

    def recovery_rule(style: str, transition) -> list[str]:
        """``rebind`` / ``rebuild``: skipped when the class does not support ``style``; else K steps, then
        ``transition(engine) -> (engine that continues, violations)`` into a new generation, M more steps,
        and the state must be the uninterrupted run's."""
        if style not in cls.supported_recovery_styles:
            res["skipped"].append(style)
            return []
        e = make()
        R.run_steps(e, k)
        e, v = transition(e)
        R.run_steps(e, m)
        if e.state_hash() != ctx["hash"]:
            v.append(f"after {style} to generation {gen} at step {k}, {m} more steps did not continue bitwise: "
                     "the state hash differs from the uninterrupted run's")
        e.teardown()
        return v

    def rebind(e):
        before = names(e)
        next_generation(e)
        e.rebind(groups, coord)
        after = names(e)
        if after != before:
            return e, [f"shard names changed on rebind to generation {gen}: {renamed(before, after)}; a shard's "
                       "logical name must stay the same across generations (its replicas are found by it)"]
        return e, []

    def rebuild(e):
        st = R.save_state(e)
        e.teardown()
        e.teardown()  # idempotent
        next_generation(e)
        n = make()
        R.load_state(n, st)
        if names(n) != ctx["names"]:
            return n, [f"shard names of the engine rebuilt in generation {gen} differ: "
                       f"{renamed(ctx['names'], names(n))}"]
        return n, []

    fns = {"recovery_style": rule_recovery_style, "ordering": rule_ordering, "determinism": rule_determinism,
           "shard_names": rule_shard_names, "save_restore": rule_save_restore,
           "rebind": lambda: recovery_rule("rebind", rebind), "rebuild": lambda: recovery_rule("rebuild", rebuild)}
    res["seconds"]["setup"] = round(time.monotonic() - t_start, 3)
    for rule in R.RULES:
        t0 = time.monotonic()
        try:
            res["rules"][rule] = fns[rule]()
        except Exception as exc:  # noqa: BLE001 - the engine under test failed: report it against the rule
            tb = traceback.extract_tb(exc.__traceback__)[-1]
            res["rules"][rule] = [f"raised {type(exc).__name__}: {exc} (at {Path(tb.filename).name}:{tb.lineno})"]
            res["aborted_in"] = rule
            write()
            return 1
        res["completed"].append(rule)
        res["seconds"][rule] = round(time.monotonic() - t0, 3)
        write()
    res["done"] = True
    write()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
