"""A slot's identity from its launcher's environment (pure: the environment is passed in).

Sources, first match wins:

* Slurm (``srun``, any ``--mpi`` plugin): ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``,
  ``SLURM_NODEID``, ``SLURM_NNODES``, ``SLURM_JOB_ID``, ``SLURM_STEP_ID``, ``SLURMD_NODENAME``,
  ``SLURM_TOPOLOGY_ADDR`` (set when topology/tree is configured; see srun(1), "OUTPUT ENVIRONMENT
  VARIABLES").
* Open MPI's ``mpirun``: ``OMPI_COMM_WORLD_RANK``, ``OMPI_COMM_WORLD_SIZE``, ``OMPI_COMM_WORLD_LOCAL_RANK``,
  ``OMPI_COMM_WORLD_LOCAL_SIZE`` (Open MPI mpirun(1), "Exported Environment Variables"). mpirun exports
  no node index, so ``node_id`` is 0: every slot counts as being on the first node (development only).
* PMIx direct launch without Slurm variables: ``PMIX_RANK`` only; the world size then comes from MPI.

The MPI world (``MPI.COMM_WORLD``) stays the authority for rank and size; :func:`check_against_mpi`
compares the two.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from phoenix_hpc.errors import EngineError


@dataclass(frozen=True)
class SlotInfo:
    """One process of the job. ``world_size`` is None when the launcher does not export it (PMIx only)."""

    launcher: str  # "slurm" | "openmpi" | "pmix" | "none"
    world_rank: int
    world_size: int | None
    local_rank: int
    node_id: int
    num_nodes: int | None
    hostname: str | None
    job_id: str | None = None
    step_id: str | None = None
    topology_addr: str | None = None

    def is_active(self, active_nodes: int) -> bool:
        """Active at generation 0: the slot is on one of the first ``active_nodes`` nodes of the job
        (``resources.nodes``); slots on the remaining (spare) nodes are standby."""
        return self.node_id < active_nodes


def _int(env: Mapping[str, str], key: str) -> int:
    try:
        return int(env[key])
    except ValueError:
        raise EngineError(f"environment variable {key}={env[key]!r} is not an integer") from None


def slot_from_env(env: Mapping[str, str]) -> SlotInfo:
    """Build the :class:`SlotInfo` of this process from ``env`` (e.g. ``os.environ``).

    Raises:
        EngineError: a variable that should be an integer is not.
    """
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        return SlotInfo(
            launcher="slurm",
            world_rank=_int(env, "SLURM_PROCID"),
            world_size=_int(env, "SLURM_NTASKS"),
            local_rank=_int(env, "SLURM_LOCALID") if "SLURM_LOCALID" in env else 0,
            node_id=_int(env, "SLURM_NODEID") if "SLURM_NODEID" in env else 0,
            num_nodes=_int(env, "SLURM_NNODES") if "SLURM_NNODES" in env else None,
            hostname=env.get("SLURMD_NODENAME") or env.get("HOSTNAME"),
            job_id=env.get("SLURM_JOB_ID"),
            step_id=env.get("SLURM_STEP_ID"),
            topology_addr=env.get("SLURM_TOPOLOGY_ADDR"),
        )
    if "OMPI_COMM_WORLD_RANK" in env:
        return SlotInfo(
            launcher="openmpi",
            world_rank=_int(env, "OMPI_COMM_WORLD_RANK"),
            world_size=_int(env, "OMPI_COMM_WORLD_SIZE") if "OMPI_COMM_WORLD_SIZE" in env else None,
            local_rank=_int(env, "OMPI_COMM_WORLD_LOCAL_RANK") if "OMPI_COMM_WORLD_LOCAL_RANK" in env else 0,
            node_id=0,
            num_nodes=None,
            hostname=env.get("HOSTNAME"),
        )
    if "PMIX_RANK" in env:
        return SlotInfo("pmix", _int(env, "PMIX_RANK"), None, 0, 0, None, env.get("HOSTNAME"))
    return SlotInfo("none", 0, 1, 0, 0, 1, env.get("HOSTNAME"))


def check_against_mpi(slot: SlotInfo, mpi_rank: int, mpi_size: int) -> SlotInfo:
    """Return ``slot`` with the MPI world size filled in.

    Raises:
        EngineError: the launcher's rank/size differ from MPI's (e.g. ``srun --mpi=none`` starting
            singleton MPI processes: every process would be rank 0 of 1).
    """
    if slot.world_rank != mpi_rank or (slot.world_size is not None and slot.world_size != mpi_size):
        raise EngineError(
            f"launcher says rank {slot.world_rank} of {slot.world_size} ({slot.launcher}), MPI says rank "
            f"{mpi_rank} of {mpi_size}: start the ranks with an MPI-aware launcher (srun --mpi=pmix, mpirun)"
        )
    return replace(slot, world_size=mpi_size)
