"""A slot's registration with the coordinator (:mod:`phoenix_hpc.control.attach`) under the batch script:
the slots' nodes and failure domains (collective), the registration itself, SIGTERM passed on, and for an
active slot under protection a quiesce watchdog that listens from then on."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path


def protected(cfg) -> bool:
    """Whether training runs under PHOENIX protection (runtime protector, commits, hot swap)."""
    return cfg.resilience.enabled and cfg.resilience.mode == "phoenix"


def gather_nodes(comm, slot, levels) -> tuple[list[str], dict[str, dict[str, str]], tuple[str, ...]]:
    """Collective over ``comm`` (every slot): node name of every world rank, the failure-domain model from
    each task's ``SLURM_TOPOLOGY_ADDR``/``SLURM_TOPOLOGY_ADDR_PATTERN`` (topology/tree), and the placement
    levels of ``levels`` that the model covers (``node`` always; a level no slot knows is dropped)."""
    from phoenix_hpc.errors import ReplicationError
    from phoenix_hpc.topology import DEFAULT_SWITCH_LEVELS, covered_levels, parse_topology_addr

    node = slot.hostname or f"node{slot.node_id}"
    addr, pattern = os.environ.get("SLURM_TOPOLOGY_ADDR"), os.environ.get("SLURM_TOPOLOGY_ADDR_PATTERN")
    # the site's tier names (the batch script exports them; e.g. Vista's leaf,spine)
    tiers = tuple(t for t in os.environ.get("PHOENIX_SWITCH_LEVELS", "").split(",") if t) or DEFAULT_SWITCH_LEVELS
    dom = None
    if addr and pattern:
        try:
            dom = parse_topology_addr(addr, pattern, tiers)
        except ReplicationError:
            dom = None
    infos = comm.allgather((node, dom))
    nodes = [n for n, _ in infos]
    domains = {n: d for n, d in infos if d}
    return nodes, domains, covered_levels(levels, nodes, domains)


def listen_from_registration(client, cfg, run_dir: Path, restore_dir: str | None) -> dict:
    """An active slot, right after registration: a quiesce watchdog that listens (reads instructions, arms
    or refuses injections relative to the step the slot will start from, fires on nothing) until the first
    training step arms it (:class:`phoenix_hpc.launch.quiesce_watch.QuiesceWatchdog`). Building the first
    generation takes tens of seconds on a loaded host, and an injection must be answered within its
    confirmation window. With ``--restore-dir`` the start step is known only after the restore: nothing
    listens. Returns ``{"watchdog", "start_step"}`` (both None then)."""
    from phoenix_hpc.launch import persist
    from phoenix_hpc.launch.quiesce_watch import QuiesceWatchdog

    if restore_dir:
        return {"watchdog": None, "start_step": None}
    start = persist.start_step(cfg, run_dir)
    client.started_step, client.last_step = start, int(cfg.training.steps)
    wd = QuiesceWatchdog(client, lambda msg: None, name=f"phoenix-quiesce-{client.world_rank}")
    wd.listen()
    return {"watchdog": wd, "start_step": start}


def attach_slot(comm, slot, cfg, run_dir: Path, active: bool, grid, restore_dir: str | None):
    """Under the batch script: register with the coordinator (collective: the slots' nodes and failure
    domains first). Returns ``(attachment, resilient)``: ``resilient`` is what the protected driver needs
    (None without protection).

    Raises:
        PhoenixError: the registration was refused."""
    from phoenix_hpc.control.attach import attach

    nodes, domains, levels = gather_nodes(comm, slot, cfg.resilience.placement_levels)
    node = slot.hostname or f"node{slot.node_id}"
    # what the coordinator needs to recompute every generation's replica placement
    inputs = ({"k": cfg.resilience.k, "levels": list(levels), "domain": domains.get(node)}
              if protected(cfg) else None)
    att = attach(run_dir, comm.Get_rank(), comm.Get_size(), node, active, (grid.tp, grid.pp, grid.dp),
                 cfg.resilience, placement_inputs=inputs)
    # Slurm delivers scancel's/preemption's SIGTERM to the step's tasks: pass it on to the coordinator,
    # which ends the job as planned (final checkpoint), instead of dying in the middle of a step
    signal.signal(signal.SIGTERM, lambda *_: att.client.note_signal("TERM"))
    if not protected(cfg):
        return att, None
    if comm.Get_rank() == 0 and tuple(levels) != tuple(cfg.resilience.placement_levels):
        print(f"[phoenix] failure-domain levels {sorted(set(cfg.resilience.placement_levels) - set(levels))} "
              "unknown on this allocation (no SLURM_TOPOLOGY_ADDR); replicas are spread over "
              f"{list(levels)} only", file=sys.stderr, flush=True)
    resilient = {"client": att.client, "nodes": nodes, "domains": domains, "levels": levels, "world_comm": comm}
    if active:  # the job counts as running now: answer injections from here on, not from the first step
        resilient.update(listen_from_registration(att.client, cfg, run_dir, restore_dir))
    return att, resilient
