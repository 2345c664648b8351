"""A slot joining its job's coordinator: the rank entry point's one call into the control plane.

:func:`attach` is used when ``RUN_DIR/coordinator.json`` exists (the batch script starts the coordinator
before the srun step and waits for that file, so under ``phoenix submit`` it always does); without it
(development runs under plain ``mpirun``/``srun``) the entry point keeps its MPI rendezvous.

It registers the slot (active: logical rank = MPI world rank at generation 0, with the grid; standby: no
rank), starts the heartbeat thread (per node: :mod:`phoenix_hpc.control.node_beats`) and the coordinator watchdog (a slot exits with
:data:`phoenix_hpc.control.heartbeat.EXIT_COORDINATOR_LOST` when the coordinator's connection closed, or it has
not answered for ``resilience.coordinator_timeout_s`` after the start-up grace ``resilience.coordinator_grace_s``;
with ``resilience.coordinator_restarts`` > 0 a closed connection first waits
``resilience.coordinator_restart_timeout_s`` for a restarted coordinator while training goes on), and returns the client plus, on active slots, a TCPStore client to the
coordinator's store for ``torch.distributed`` rendezvous (``PrefixStore(f"gen{g}", store)``).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from phoenix_hpc.control.client import CoordinatorClient
from phoenix_hpc.control.protocol import read_coordinator_file


@dataclass
class Progress:
    """What the heartbeat reports: the slot's generation (None on standby) and completed steps."""

    generation: int | None = 0
    step: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def get(self) -> tuple[int | None, int]:
        with self.lock:
            return self.generation, self.step

    def set(self, generation: int | None = None, step: int | None = None) -> None:
        with self.lock:
            if generation is not None:
                self.generation = generation
            if step is not None:
                self.step = step


@dataclass
class Attachment:
    client: CoordinatorClient
    progress: Progress
    store: object | None  # TCPStore client on active slots


def coordinator_present(run_dir: str | os.PathLike) -> bool:
    """Whether the job runs under a coordinator (``RUN_DIR/coordinator.json`` exists)."""
    return read_coordinator_file(run_dir) is not None


def attach(run_dir: str | os.PathLike, world_rank: int, world_size: int, node: str, active: bool,
           grid: tuple[int, int, int] | None, resilience,
           placement_inputs: dict | None = None) -> Attachment:
    """Register with the coordinator and start heartbeats. ``resilience`` is ``JobConfig.resilience``;
    ``placement_inputs`` (``{"k", "levels", "domain"}``, see :meth:`CoordinatorClient.register`) lets the
    coordinator recompute the replica placement of every generation.

    Raises:
        ControlError: the coordinator is unreachable or rejected the registration (the reason says why).
    """
    client = CoordinatorClient(Path(run_dir), world_rank, wait_s=max(60.0, resilience.collective_timeout_s),
                               store_timeout_s=resilience.collective_timeout_s)
    client.register(node=node, role="active" if active else "standby", logical_rank=world_rank if active else None,
                    grid=grid if active else None, world_size=world_size, placement_inputs=placement_inputs)
    progress = Progress(generation=0 if active else None)
    client.start_heartbeat(resilience.heartbeat_interval_s, resilience.heartbeat_timeout_s, progress.get,
                           lost_after_s=resilience.coordinator_timeout_s, grace_s=resilience.coordinator_grace_s,
                           node=node,
                           restart_timeout_s=(resilience.coordinator_restart_timeout_s
                                              if resilience.coordinator_restarts > 0 else 0.0))
    return Attachment(client, progress, client.tcp_store() if active else None)
