"""Whether a persistent checkpoint can be loaded by a job: pure decisions, no torch, no file access.

A checkpoint holds, for every stage ``(pp, tp)``, the stage's parameters (identical on its DP ranks) and its
flat fp32 optimizer vector cut into ``dp`` ZeRO-1 slices (:mod:`phoenix_hpc.engines.zero`). It can be
loaded by a job whose grid has the same ``tp`` and ``pp``; a job with another ``dp`` re-partitions the slices
on load as a shrink does (:func:`phoenix_hpc.recovery.shrink.overlapping`,
:meth:`phoenix_hpc.engines.zero.ShardedAdamW.load_resharded`), which only an engine that can re-partition its
optimizer does (engine ``torch``: ``TorchEngine.supports_shrink``). The parameters' shapes and dtypes follow
from ``engine`` and the ``model`` section of the config that wrote the checkpoint (:func:`model_record`): a
checkpoint of another model cannot be loaded, and a config passed with ``phoenix submit --resume`` may not
change them.
"""

from __future__ import annotations

from typing import Any, Mapping

#: Engines whose optimizer state can be re-partitioned over another dp (docs/design.md section 6, "Shrink").
RESHARDABLE_ENGINES = ("torch",)


def reshardable(engine: str) -> bool:
    """True when engine ``engine`` loads a checkpoint written at another dp (same tp and pp)."""
    return engine in RESHARDABLE_ENGINES


def model_record(cfg) -> dict[str, Any]:
    """What decides the shapes and dtypes of a run's state: ``{"engine", "model"}`` (the config's ``engine``
    and its whole ``model`` section, JSON values). Stored in a checkpoint's ``complete.json``."""
    return {"engine": cfg.engine, "model": cfg.model.model_dump(mode="json")}


def _flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def model_changes(old: Mapping[str, Any], new: Mapping[str, Any], recorded_only: bool = False) -> list[tuple[str, Any, Any]]:
    """The fields of two :func:`model_record` values that differ: ``(dotted field, old value, new value)``,
    sorted by field (``None`` where a field is absent on one side). ``recorded_only``: compare only the fields
    ``old`` has (a record written by a release that had fewer fields says nothing of the newer ones)."""
    a, b = _flat(old), _flat(new)
    keys = set(a) if recorded_only else set(a) | set(b)
    return [(k, a.get(k), b.get(k)) for k in sorted(keys) if a.get(k) != b.get(k)]


def describe_changes(changes: list[tuple[str, Any, Any]], old_name: str, new_name: str) -> str:
    """``field: V in NEW, OLD has W`` for each change, joined by ``; ``."""
    return "; ".join(f"{f}: {n!r} in {new_name}, {old_name} has {o!r}" for f, o, n in changes)


def grid_problem(step: int, ckpt_grid, job_grid, engine: str) -> str | None:
    """Why the checkpoint of ``step`` written at ``ckpt_grid`` ``(tp, pp, dp)`` cannot be loaded at
    ``job_grid`` by engine ``engine``, or None (the same grid; or, for an engine that re-partitions, the same
    tp and pp). None also when either grid is unknown."""
    if ckpt_grid is None or job_grid is None:
        return None
    c, j = tuple(int(x) for x in ckpt_grid), tuple(int(x) for x in job_grid)
    if c == j:
        return None
    if c[:2] == j[:2]:
        if reshardable(engine):
            return None
        return (f"checkpoint of step {step} was written for grid (tp, pp, dp) = {c}, the job's grid is {j}: engine "
                f"{engine!r} cannot re-partition its optimizer over another dp (engines that can: "
                f"{', '.join(RESHARDABLE_ENGINES)}); resume with parallelism.dp = {c[2]}")
    return (f"checkpoint of step {step} was written for grid (tp, pp, dp) = {c}, the job's grid is {j}: tp and pp "
            f"must be those of the checkpoint ({c[0]}, {c[1]})"
            + (" (dp may differ)" if reshardable(engine) else ""))
