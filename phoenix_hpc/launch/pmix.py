"""Leave the PMIx server once MPI is up, so that a slot's death does not cancel the whole Slurm step.

Slurm's PMIx plugin (``--mpi=pmix``; Slurm 22.05 ``src/plugins/mpi/pmix/pmixp_client_v2.c``, ``_errhandler``,
registered for every PMIx event) answers any event of its PMIx server by ``slurm_kill_job_step(..., SIGKILL)``.
openpmix raises ``PMIX_ERR_LOST_CONNECTION`` when a client that has not called ``PMIx_Finalize`` disconnects
(openpmix v4.2 ``src/mca/ptl/base/ptl_base_sendrecv.c``, ``lost_connection``: only ``if (!peer->finalized)``).
So a slot that dies (a crash, an OOM kill, ``os._exit``) while its node's ``slurmstepd`` stays up -- another
slot of the job on the same node, or a node that relays step completion for others (Slurm's reverse tree,
9+ nodes) -- cancels every slot of the step about one second later, ``--no-kill`` notwithstanding. No Slurm
22.05 setting turns the handler off, and Debian's Open MPI 4.1 has no PMI-2 component to use instead.

The slot therefore finalizes its PMIx client as soon as MPI is initialised (:func:`detach`): the server marks
it finalized and its death is no longer an event. What this costs, measured on the local cluster:

- Open MPI must learn every peer's address during ``MPI_Init`` (it otherwise asks PMIx lazily, at the first
  message to a peer): ``OMPI_MCA_mpi_add_procs_cutoff`` is raised above any job size before ``MPI_Init``
  (:func:`prepare_env`). Communicators made later (``Comm.Create_group``) and point-to-point work as before.
- ``MPI_Finalize`` needs PMIx (its fence): a detached slot never calls it; it ends after a barrier (runs
  without a coordinator) or the coordinator's ``stop``. ``MPI_Abort`` no longer ends the step (the project
  does not call it; a job is ended by its coordinator or ``scancel``).

Only a process in which Open MPI loaded ``libpmix`` (``/proc/self/maps``) is detached; with another MPI or
launcher nothing happens. ``PHOENIX_PMIX_DETACH=0`` turns it off (then a slot's death cancels the step on
nodes that run several slots, as Slurm does); a value other than 0 or 1 is refused (exit code 2).
"""

from __future__ import annotations

import ctypes
import os
from typing import MutableMapping

from phoenix_hpc.errors import ConfigError

ADD_PROCS_CUTOFF = "1000000"  # above any job size: every peer is added (its address fetched) in MPI_Init


def enabled(environ: MutableMapping[str, str] | None = None) -> bool:
    """Whether slots detach from PMIx (``PHOENIX_PMIX_DETACH``: ``1``, the default, or ``0``).

    Raises:
        ConfigError: any other value (named, with the allowed ones)."""
    env = os.environ if environ is None else environ
    value = env.get("PHOENIX_PMIX_DETACH", "1")
    if value not in ("0", "1"):
        raise ConfigError(f"PHOENIX_PMIX_DETACH: value {value!r} is not allowed (allowed: 1, the default: slots "
                          "leave PMIx after MPI_Init; 0: they stay)")
    return value == "1"


def prepare_env(environ: MutableMapping[str, str] | None = None) -> None:
    """Before ``MPI_Init``: make Open MPI add every peer at init (``OMPI_MCA_mpi_add_procs_cutoff``), which a
    detached slot needs; a value the user set is kept. No effect when detaching is off."""
    env = os.environ if environ is None else environ
    if enabled(env):
        env.setdefault("OMPI_MCA_mpi_add_procs_cutoff", ADD_PROCS_CUTOFF)


def loaded_libpmix(maps_path: str = "/proc/self/maps") -> str | None:
    """The path of the ``libpmix`` this process has loaded, or None."""
    try:
        with open(maps_path) as f:
            paths = sorted({line.split()[-1] for line in f if "libpmix" in line and "/" in line})
    except OSError:
        return None
    return paths[0] if paths else None


def detach() -> str | None:
    """After ``MPI_Init``: ``PMIx_Finalize`` this process's PMIx client (module doc). Returns the library's
    path when the slot detached, None when there was nothing to do (detaching off, no libpmix, PMIx not
    initialised). Never raises: a failure leaves the slot as it was (and returns None)."""
    if not enabled():
        return None
    path = loaded_libpmix()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(path)
        lib.PMIx_Initialized.restype = ctypes.c_int
        lib.PMIx_Finalize.restype = ctypes.c_int
        lib.PMIx_Finalize.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        if not lib.PMIx_Initialized():
            return None
        return path if lib.PMIx_Finalize(None, 0) == 0 else None
    except (OSError, AttributeError):
        return None
