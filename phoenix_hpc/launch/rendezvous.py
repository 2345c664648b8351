"""Finding the job's control-plane store.

:func:`mpi_store_rendezvous` is the minimal rendezvous used until the coordinator process provides the
store: MPI world rank 0 hosts a ``torch.distributed.TCPStore`` on a free port and broadcasts
``(host, port)`` over MPI; the other active slots connect to it. This is the one function to swap when the
coordinator (``RUN_DIR/coordinator.json``) takes over.

The host is ``PHOENIX_STORE_HOST`` if set, else the address of this host's name
(``socket.gethostbyname(socket.gethostname())``).
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta


def store_host() -> str:
    """The address other slots use to reach a store hosted by this process."""
    return os.environ.get("PHOENIX_STORE_HOST") or socket.gethostbyname(socket.gethostname())


def mpi_store_rendezvous(comm, active: bool, timeout_s: float):
    """Collective over ``comm`` (every slot calls it). Returns the store on active slots, None on standby.

    World rank 0 must be active (it hosts the store for the whole job and must outlive the other ranks'
    use of it: callers end with a barrier over ``comm``).
    """
    from torch.distributed import TCPStore

    timeout = timedelta(seconds=timeout_s)
    store = None
    addr = None
    if comm.Get_rank() == 0:
        host = store_host()
        store = TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timeout)
        addr = (host, store.port)
    addr = comm.bcast(addr, root=0)
    if comm.Get_rank() != 0 and active:
        store = TCPStore(addr[0], addr[1], is_master=False, timeout=timeout)
    return store
