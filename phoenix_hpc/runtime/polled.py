"""MPI waits that sleep between tests instead of spinning a core (docs/design.md section 6, step 6).

Open MPI's blocking calls (``MPI_Barrier``, ``MPI_Allgather``, ``MPI_Wait``) poll their transports in a busy
loop: a rank that arrives early at a collective takes a whole core until the last one arrives. In a
recovery the survivors arrive long before the spare they wait for, and on a node whose cores also run that
spare (or the data loaders and the launcher), their spinning slows down exactly the work they wait for.
These waits post the non-blocking form and test it every ``poll_s`` seconds, sleeping in between.
"""

from __future__ import annotations

import time
from typing import Callable

from phoenix_hpc.errors import RecoveryError


def wait(req, timeout_s: float, what: str, poll_s: float = 0.001, check: Callable[[], None] | None = None) -> float:
    """Wait for MPI request ``req`` (``Test`` every ``poll_s`` s, sleeping between); returns the seconds waited.
    ``check`` (optional) is called after every unsuccessful test; what it raises ends the wait, the request
    left as it is (a collective's request cannot be cancelled or freed: its communicator is dropped unused).

    Raises:
        RecoveryError: not complete within ``timeout_s`` (``what`` names the wait); an MPI error of the
            request propagates as mpi4py raises it (``MPI.Exception`` on a communicator with
            ``MPI_ERRORS_RETURN``); what ``check`` raises."""
    t0 = time.monotonic()
    while not req.Test():
        if time.monotonic() - t0 > timeout_s:
            raise RecoveryError(f"{what}: not complete within {timeout_s:g} s")
        if check is not None:
            check()
        time.sleep(poll_s)
    return time.monotonic() - t0


def barrier(comm, timeout_s: float, what: str, poll_s: float = 0.001, check: Callable[[], None] | None = None) -> float:
    """``MPI_Ibarrier`` on ``comm``, waited for with :func:`wait`: returns the seconds this rank waited for
    the last one to arrive. Raises as :func:`wait`."""
    return wait(comm.Ibarrier(), timeout_s, what, poll_s, check)
