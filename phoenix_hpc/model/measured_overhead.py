"""Which measured per-step overhead ratio the cost model charges by default, by the hardware it models.

The ratio ``r`` (step time with protection over without) depends on the hardware: on a CPU host the copy and
H2H threads take cores from the ranks' compute, on a GPU the D2H copy runs beside the kernels. A ratio
measured on one kind of hardware says little about another, so ``phoenix model efficiency`` and ``simulate``
charge by default only a ratio measured on the kind the user models (:data:`HARDWARE`), and otherwise none
(``r = 1``, the paper's zero overhead), listing the ratios that exist with their hardware.

Kinds of measurement found in ``BENCHMARKS.json`` (:func:`read_measured`):

- ``cpu-host``: ``overhead_ratio`` of a ``scripts/bench.sh`` run whose ranks ran on CPUs (``machine.gpu``
  begins with "none"): the local Slurm cluster on one host, D2H and H2H complete;
- ``gpu-cluster``: the same figure of a run whose ranks ran on GPUs (``machine.gpu`` names one);
- ``one-gpu``: ``d2h.overhead`` of the newest kept ``scripts/gpu-check.sh`` report that has it passed and is
  not withdrawn (one process on one GPU, the D2H snapshot only, no H2H replica, no network): listed, never
  charged by default.

:func:`choose` is pure; :func:`read_measured` reads the file and raises
:class:`phoenix_hpc.errors.ModelError` naming it when its ``overhead_ratio`` is not a number > 0.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from phoenix_hpc.errors import ModelError

#: The kinds of hardware a user can model (``--hardware``); the first is the default.
HARDWARE = ("gpu-cluster", "cpu-host")
#: What each kind of measurement ran on, as printed.
KIND_NAMES = {"gpu-cluster": "a GPU cluster", "cpu-host": "a CPU host", "one-gpu": "one GPU"}


@dataclass(frozen=True)
class MeasuredRatio:
    """One measured per-step overhead ratio: ``ratio`` (dimensionless, > 0), the ``kind`` of hardware it was
    measured on (a key of :data:`KIND_NAMES`), that hardware in words, and the run it comes from."""

    ratio: float
    kind: str
    hardware: str
    source: str

    def describe(self) -> str:
        return f"{self.ratio:.4g} on {KIND_NAMES[self.kind]} ({self.hardware}; {self.source})"

    def to_dict(self) -> dict:
        return asdict(self)


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def from_benchmarks(d: dict, name: str = "BENCHMARKS.json") -> list[MeasuredRatio]:
    """The measured ratios in a ``BENCHMARKS.json`` content ``d`` (pure): the run's ``overhead_ratio`` (absent
    or ``null``: none) and the newest GPU report's ``d2h.overhead`` ratio.

    Raises:
        ModelError: ``overhead_ratio`` is present but not a number > 0 (the message names ``name``)."""
    out: list[MeasuredRatio] = []
    r = d.get("overhead_ratio")
    if r is not None:
        if not _number(r) or r <= 0:
            raise ModelError(f"{name}: overhead_ratio {json.dumps(r)} is not allowed; expected a number > 0 (step "
                             "time with protection over without); give --overhead-ratio")
        m = d.get("machine") if isinstance(d.get("machine"), dict) else {}
        gpu = str(m.get("gpu") or "none")
        kind = "cpu-host" if gpu.lower().startswith("none") else "gpu-cluster"
        ov = d.get("overhead") if isinstance(d.get("overhead"), dict) else {}
        cases = [c["ratio"]["value"] for c in ov.get("cases") or []
                 if isinstance(c, dict) and _number((c.get("ratio") or {}).get("value"))]
        spread = (f", median of {len(cases)} cases from {min(cases):.3f} to {max(cases):.3f}" if len(cases) > 1 else "")
        where = (f"{m.get('cpu', '?')}, {m.get('logical_cpus', '?')} logical CPUs, " if kind == "cpu-host" else f"{gpu}, ")
        hw = where + f"local Slurm cluster of {m.get('cluster_nodes', '?')} nodes on one host"
        run = ov.get("kept_from") or f"{d.get('date', '?')}, commit {d.get('commit', '?')}"
        out.append(MeasuredRatio(float(r), kind, hw, f"{name} overhead_ratio of the run of {run}{spread}"))
    for rep in d.get("gpu_reports") or []:  # newest first, as report.load_gpu_reports keeps them
        if rep.get("withdrawn"):  # a run of code that is no longer the project's
            continue
        item = next((it for c in rep.get("checks") or [] for it in c.get("items") or []
                     if it.get("name") == "d2h.overhead" and it.get("status") == "passed"
                     and _number((it.get("numbers") or {}).get("ratio"))), None)
        if item is not None:
            dev = (rep.get("device") or {}).get("name", "?")
            out.append(MeasuredRatio(float(item["numbers"]["ratio"]), "one-gpu",
                                     f"{dev}, one process, the D2H snapshot only: no H2H replica, no network",
                                     f"{name} GPU check d2h.overhead of {rep.get('started', '?')}"))
            break
    return out


def read_measured(path: Path) -> list[MeasuredRatio]:
    """:func:`from_benchmarks` of the file at ``path``; empty when it does not exist.

    Raises:
        ModelError: the file cannot be read as JSON, or its ``overhead_ratio`` is not a number > 0 (the
            message names the file and asks for ``--overhead-ratio``)."""
    p = Path(path)
    try:
        d = json.loads(p.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as e:
        raise ModelError(f"{p}: cannot be read as JSON ({e}); give --overhead-ratio") from None
    if not isinstance(d, dict):
        raise ModelError(f"{p}: not a JSON object; give --overhead-ratio")
    return from_benchmarks(d, p.name)


def choose(measured: list[MeasuredRatio], hardware: str) -> tuple[float, str]:
    """The ratio charged by default when modelling ``hardware`` (one of :data:`HARDWARE`) and why (pure): the
    first measurement of that kind (a value below 1, noise around 1, is charged as 1 and the reason says so),
    else 1, the reason naming the hardware no ratio was measured on (the measured ones are
    :func:`not_charged`).

    Raises:
        ModelError: ``hardware`` is not one of :data:`HARDWARE`."""
    if hardware not in HARDWARE:
        raise ModelError(f"--hardware: {hardware!r} is not allowed; expected one of {', '.join(HARDWARE)}")
    mine = next((m for m in measured if m.kind == hardware), None)
    if mine is None:
        return 1.0, (f"no ratio measured on {KIND_NAMES[hardware]}, so none charged (the paper's zero overhead); "
                     "give --overhead-ratio to charge one")
    src = f"measured on {KIND_NAMES[mine.kind]}: {mine.hardware}; {mine.source}"
    if mine.ratio < 1:  # measured, so noise around 1 (a protected step is not faster): said, and charged as 1
        return 1.0, f"{src}: measured {mine.ratio:.4g}, below 1 (noise), charged as 1"
    return mine.ratio, src


def not_charged(measured: list[MeasuredRatio], hardware: str) -> list[MeasuredRatio]:
    """The measurements :func:`choose` does not charge when modelling ``hardware`` (pure): every one of another
    kind, and any further one of that kind."""
    mine = next((m for m in measured if m.kind == hardware), None)
    return [m for m in measured if m is not mine]
