"""Run the engine conformance kit: one local process per rank (over a ``FileStore``: gloo on CPU, or NCCL on
CUDA; no Slurm).

:func:`run_conformance` starts ``tp x pp x dp`` processes of :mod:`.worker` on this machine, waits for them
and returns a :class:`ConformanceReport`: per rule of :data:`phoenix_hpc.testing.rules.RULES`, the
violations found on every rank, plus the cross-rank rules (:func:`check_coverage`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phoenix_hpc.testing.rules import RULES


@dataclass
class ConformanceReport:
    """What a conformance run found. ``violations[rule]``: messages, each prefixed with the rank
    (``"rank 1 (pp0 dp1 tp0): ..."``); ``skipped``: rules the engine does not take part in (a recovery
    style it does not support); ``not_run``: rules not reached because an earlier one raised."""

    world_size: int
    violations: dict[str, list[str]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    not_run: list[str] = field(default_factory=list)
    logs: str = ""

    @property
    def ok(self) -> bool:
        """No violations and every rule ran."""
        return not any(self.violations.values()) and not self.not_run

    def failures(self, rule: str) -> list[str]:
        """Messages of ``rule`` (``[]`` when it passed); a rule that was not reached fails with that reason."""
        if rule in self.not_run:
            return [f"rule {rule} did not run: an earlier rule failed or a rank did not finish"]
        return list(self.violations.get(rule, []))

    def summary(self) -> str:
        """One line per rule: ``PASS``, ``FAIL`` (with its messages), ``SKIP`` or ``NOT RUN``."""
        lines = []
        for r in RULES:
            if r in self.not_run:
                lines.append(f"NOT RUN {r}")
            elif self.violations.get(r):
                lines.append(f"FAIL    {r}: " + "; ".join(self.violations[r]))
            elif r in self.skipped:
                lines.append(f"SKIP    {r} (recovery style not supported by the engine)")
            else:
                lines.append(f"PASS    {r}")
        return "\n".join(lines)


def check_coverage(results: dict[int, dict]) -> list[str]:
    """Cross-rank part of ``shard_names``: for every (pp, tp), all DP ranks have the same parameter names,
    and the optimizer shards of the DP ranks together cover every element of every parameter exactly once
    (the ``main`` sizes of a parameter add up to its numel). Pure."""
    by_pt: dict[tuple[int, int], list[tuple[int, dict]]] = {}
    for r, res in results.items():
        if res.get("layout") and res.get("coord"):
            c = res["coord"]
            by_pt.setdefault((c["pp"], c["tp"]), []).append((r, res["layout"]))
    out = []
    for (pp, tp), members in sorted(by_pt.items()):
        params = members[0][1]["params"]
        for r, lay in members[1:]:
            if lay["params"] != params:
                out.append(f"pp{pp} tp{tp}: param shard of rank {r} differs in names or sizes from rank "
                           f"{members[0][0]}'s (DP peers hold the same parameters)")
        for name, numel in sorted(params.items()):
            got = sum(lay["opt"].get(name, 0) for _, lay in members)
            if got != numel:
                out.append(f"pp{pp} tp{tp}: optimizer shards over the {len(members)} DP ranks hold {got} elements of "
                           f"parameter {name!r}, which has {numel} (each element exactly once)")
    return out


def _config_dict(config: Any, base_dir: Path | None) -> dict:
    from phoenix_hpc.config.load import load_job_config, parse_model
    from phoenix_hpc.config.schema import JobConfig

    if isinstance(config, (str, Path)):
        return load_job_config(config).model_dump(mode="json")
    cfg = parse_model(JobConfig, dict(config), source="conformance config")
    base = Path(base_dir or Path.cwd())
    upd: dict[str, Any] = {"python_path": [str((base / f).resolve()) for f in cfg.python_path]}
    upd["data"] = cfg.data.resolved(base)
    return cfg.model_copy(update=upd).model_dump(mode="json")


def run_conformance(config: Any, *, world_size: int | None = None, steps: int = 2, timeout_s: float = 300.0,
                    base_dir: str | Path | None = None, workdir: str | Path | None = None,
                    device: str = "cpu") -> ConformanceReport:
    """Run every rule against the engine of ``config`` with one local process per rank.

    Args:
        config: a job config file path, or a job-config mapping (``resources`` is not used; relative
            ``data.path`` and ``python_path`` entries are relative to ``base_dir``, default the working
            directory).
        world_size: number of ranks; default ``tp x pp x dp`` with ``parallelism.dp`` (1 when unset). With
            ``dp`` unset, ``dp = world_size / (tp x pp)``.
        steps: K, the steps before and after each save / rebind / rebuild (runs are ``2K`` steps).
        timeout_s: wall-clock limit for the whole run, seconds; also the collective timeout.
        workdir: where spec, store and results go (default a temporary folder, removed afterwards).
        device: ``cpu`` (gloo) or ``cuda`` (NCCL, rank r on CUDA device ``r % device_count``; engines that
            need CUDA, such as the Megatron engine).

    Returns:
        The report; ``report.ok`` is true when every rule passed.

    Raises:
        ConfigError: the config is invalid, the grid does not match ``world_size``, or ``device`` is neither
            ``cpu`` nor ``cuda`` (or ``cuda`` without a CUDA device).
    """
    from phoenix_hpc.errors import ConfigError

    if device not in ("cpu", "cuda"):
        raise ConfigError(f"device: {device!r} is not a conformance device (allowed: 'cpu', 'cuda')")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("device: 'cuda' needs a CUDA device, and none is available here (allowed here: 'cpu')")

    cfg = _config_dict(config, Path(base_dir) if base_dir else None)
    par = cfg["parallelism"]
    tp, pp = par["tp"], par["pp"]
    dp = par.get("dp") or (world_size // (tp * pp) if world_size else 1)
    world = tp * pp * dp
    if world_size is not None and world_size != world:
        raise ConfigError(f"parallelism: tp({tp}) x pp({pp}) x dp({dp}) = {world} does not match world_size {world_size}")
    cfg["parallelism"]["dp"] = dp
    with tempfile.TemporaryDirectory(prefix="phoenix-conformance-") as tmp:
        work = Path(workdir) if workdir else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for stale in [work / "store", *work.glob("rank*.json")]:  # a reused workdir: a FileStore is single-use
            stale.unlink(missing_ok=True)
        spec = {"config": cfg, "store": str(work / "store"), "out": str(work), "steps": steps,
                "timeout_s": timeout_s, "device": device}
        (work / "spec.json").write_text(json.dumps(spec))
        env = dict(os.environ, OMP_NUM_THREADS="1")
        procs = []
        for r in range(world):
            log = (work / f"rank{r}.log").open("w")
            procs.append((subprocess.Popen([sys.executable, "-m", "phoenix_hpc.testing.worker",
                                            str(work / "spec.json"), str(r)],
                                           stdout=log, stderr=subprocess.STDOUT, env=env), log))
        deadline = time.monotonic() + timeout_s
        for p, log in procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p, log in procs:
            if p.poll() is None:  # only the processes started here, by their handle
                p.kill()
                p.wait()
            log.close()
        results = {}
        for r in range(world):
            f = work / f"rank{r}.json"
            results[r] = json.loads(f.read_text()) if f.exists() else {}
        logs = "\n".join(f"--- rank {r} ---\n" + (work / f"rank{r}.log").read_text()[-2000:] for r in range(world))
        return _report(world, results, logs)


def _report(world: int, results: dict[int, dict], logs: str) -> ConformanceReport:
    """Merge the ranks' results (pure): violations prefixed with the rank, skipped and not-run rules."""
    rep = ConformanceReport(world_size=world, logs=logs, violations={r: [] for r in RULES})
    for r, res in sorted(results.items()):
        c = res.get("coord") or {}
        who = f"rank {r} (pp{c.get('pp')} dp{c.get('dp')} tp{c.get('tp')})"
        for rule, msgs in (res.get("rules") or {}).items():
            rep.violations[rule].extend(f"{who}: {m}" for m in msgs)
        for s in res.get("skipped", []):
            if s not in rep.skipped:
                rep.skipped.append(s)
    rep.not_run = [r for r in RULES if not rep.violations[r]
                   and any(r not in res.get("completed", []) for res in results.values())]
    rep.violations["shard_names"] += check_coverage(results)
    return rep
