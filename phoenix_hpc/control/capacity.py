"""How many heartbeats the coordinator can serve, and what that allows a job: pure decisions for submit.

The measured figures live in one table, :data:`phoenix_hpc.control.capacity_table.MEASURED` (written by
``scripts/bench-control-plane --update-benchmarks``; its ``source`` names the run, BENCHMARKS.md section
"Control plane at scale"). The coordinator handles every message in one Python thread, so its process
CPU is modelled as ``cores(rate) = idle_cores + rate * cpu_s_per_message`` (a least-squares line through the
benchmark's runs: coordinator cores against slot heartbeats per second; :func:`fit_cpu_line`). The slots
of a node send their heartbeats together, one ``heartbeats`` message per node and interval that also
carries their commit reports (:mod:`phoenix_hpc.control.node_beats`), so a "message" here is one slot's
share of its node's message: the benchmark's cost per slot heartbeat at its slots per node (8; fewer slots
per node share the per-message cost among fewer). A job with ``slots`` slots (active and spare) heartbeating
every ``heartbeat_interval_s`` makes ``slots / heartbeat_interval_s`` slot heartbeats per second.

Rules (:func:`check_heartbeat_load`):

- **impossible** (submit exits 2): the heartbeats alone need one core or more -- the inbox then grows
  without bound, heartbeats wait ever longer and live slots are declared dead once the wait passes
  ``heartbeat_timeout_s``; or ``heartbeat_timeout_s`` is not longer than ``heartbeat_interval_s`` plus the
  time the coordinator needs to handle one heartbeat of every slot (the last slot's heartbeat of a round
  is then late by construction);
- **warning**: the heartbeats need more than :data:`WARN_CORES` of a core (the rest serves commit reports,
  registrations and recoveries), or the job has more slots than the benchmark simulated (the model is then
  extrapolated).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

WARN_CORES = 0.5


@dataclass(frozen=True)
class Capacity:
    """The benchmark's figures. ``cpu_s_per_message``: coordinator CPU seconds per handled message;
    ``idle_cores``: its CPU at no load (cores); ``max_ranks``: the most slots simulated; ``source``: where
    the numbers come from."""

    cpu_s_per_message: float
    idle_cores: float
    max_ranks: int
    source: str

    @property
    def max_messages_per_s(self) -> float:
        """Messages per second at which the coordinator's CPU reaches one core."""
        return max(0.0, 1.0 - self.idle_cores) / self.cpu_s_per_message


def capacity_of(table: Mapping[str, Any]) -> Capacity:
    """A :class:`Capacity` from a table shaped like :data:`~phoenix_hpc.control.capacity_table.MEASURED`.

    Raises:
        ValueError: a field is missing or not a positive finite number (idle_cores: >= 0 and < 1).
    """
    try:
        cost, idle, top = float(table["cpu_s_per_message"]), float(table["idle_cores"]), int(table["max_ranks"])
        source = str(table["source"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"capacity table: {exc!r}; needs cpu_s_per_message, idle_cores, max_ranks, source") from None
    if not (math.isfinite(cost) and cost > 0) or not (math.isfinite(idle) and 0 <= idle < 1) or top < 1:
        raise ValueError(f"capacity table: cpu_s_per_message={cost}, idle_cores={idle}, max_ranks={top} are not "
                         "allowed (need > 0, 0 <= idle < 1, >= 1)")
    return Capacity(cost, idle, top, source)


def load_capacity() -> Capacity:
    """The measured capacity of this package (:mod:`phoenix_hpc.control.capacity_table`)."""
    from phoenix_hpc.control.capacity_table import MEASURED

    return capacity_of(MEASURED)


def fit_cpu_line(rates: Sequence[float], cores: Sequence[float]) -> tuple[float, float]:
    """Least-squares line ``cores = idle + rate * cost`` through the benchmark's runs; returns
    ``(cost, idle)`` with ``idle`` clipped to >= 0 (then ``cost`` is the line through the origin).

    Raises:
        ValueError: fewer than 2 runs, lengths differ, or all rates are equal.
    """
    if len(rates) != len(cores) or len(rates) < 2:
        raise ValueError(f"fit_cpu_line: need 2 or more (rate, cores) pairs, got {len(rates)} and {len(cores)}")
    n = len(rates)
    mx, my = sum(rates) / n, sum(cores) / n
    sxx = sum((x - mx) ** 2 for x in rates)
    if sxx == 0:
        raise ValueError("fit_cpu_line: all runs have the same message rate")
    cost = sum((x - mx) * (y - my) for x, y in zip(rates, cores)) / sxx
    idle = my - cost * mx
    if idle < 0:
        cost = sum(x * y for x, y in zip(rates, cores)) / sum(x * x for x in rates)
        idle = 0.0
    return cost, idle


@dataclass(frozen=True)
class LoadVerdict:
    """What :func:`check_heartbeat_load` found: ``problems`` (submit exits 2) and ``warnings``, each a
    sentence naming the numbers; ``heartbeats_per_s`` and ``cores`` the job's predicted load."""

    heartbeats_per_s: float
    cores: float
    problems: tuple[str, ...]
    warnings: tuple[str, ...]


def check_heartbeat_load(slots: int, heartbeat_interval_s: float, heartbeat_timeout_s: float,
                         cap: Capacity) -> LoadVerdict:
    """Judge a job's heartbeat load against the measured capacity (rules in the module docstring). Pure.

    Args:
        slots: every slot of the job (active ranks and standby spares), each heartbeating.
        heartbeat_interval_s, heartbeat_timeout_s: ``resilience`` settings, seconds (> 0).
        cap: the measured capacity.
    """
    rate = slots / heartbeat_interval_s
    cores = cap.idle_cores + rate * cap.cpu_s_per_message
    us = cap.cpu_s_per_message * 1e6
    round_s = slots * cap.cpu_s_per_message
    problems, warnings = [], []
    where = f"(measured: {us:.1f} us of coordinator CPU per message, {cap.max_messages_per_s:,.0f} messages/s " \
            f"at one core; {cap.source})"
    if cores >= 1.0:
        need = slots * cap.cpu_s_per_message / max(1e-9, WARN_CORES - cap.idle_cores) if WARN_CORES > cap.idle_cores \
            else math.inf
        problems.append(
            f"resilience.heartbeat_interval_s: {heartbeat_interval_s:g} s with {slots} slots is {rate:,.0f} "
            f"heartbeats/s, which needs {cores:.2f} cores of the coordinator's single message loop; it can serve "
            f"{cap.max_messages_per_s:,.0f}/s, so heartbeats would queue without bound and live slots be declared "
            f"dead {where}; allowed: heartbeat_interval_s >= {need:.2g} s for this job")
    elif heartbeat_timeout_s <= heartbeat_interval_s + round_s:
        problems.append(
            f"resilience.heartbeat_timeout_s: {heartbeat_timeout_s:g} s is not longer than heartbeat_interval_s "
            f"({heartbeat_interval_s:g} s) plus the {round_s:.2f} s the coordinator needs to handle one heartbeat "
            f"of each of the {slots} slots {where}; allowed: heartbeat_timeout_s > {heartbeat_interval_s + round_s:.3g} s")
    elif cores > WARN_CORES:
        warnings.append(
            f"{slots} slots heartbeating every {heartbeat_interval_s:g} s ({rate:,.0f}/s) keep the coordinator "
            f"{cores:.2f} cores busy, more than {WARN_CORES:g} {where}; commit reports and recoveries need the "
            "rest: a longer resilience.heartbeat_interval_s lowers it")
    if slots > cap.max_ranks and not problems:
        warnings.append(f"{slots} slots is more than the {cap.max_ranks} the control-plane benchmark simulated; "
                        f"the coordinator's load ({cores:.2f} cores for heartbeats) is extrapolated {where}")
    return LoadVerdict(rate, cores, tuple(problems), tuple(warnings))
