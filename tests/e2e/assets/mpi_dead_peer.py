"""MPI ranks that had requests posted to a peer when it died, and go on: run under ``srun --mpi=pmix
--no-kill --kill-on-bad-exit=0`` with one task per node.

Usage: python mpi_dead_peer.py VICTIM_RANK SHARED_DIR

mpi4py's own default (``rc.errors = "exception"``, which sets ``ERRORS_RETURN`` on ``COMM_WORLD``) is
turned off, so MPI's default ``ERRORS_ARE_FATAL`` holds unless the runtime sets the handler
(:func:`phoenix_hpc.runtime.mpi_faults.errors_return`, as ``phoenix-rank`` does on ``COMM_WORLD`` and
:func:`phoenix_hpc.launch.execute.make_comm` on each generation's communicator).

1. ``errors_return(COMM_WORLD)``; the generation-0 communicator with ``make_comm`` over all ranks; each
   rank reports whether both return errors. A ring exchange over it connects neighbours.
2. Every survivor posts an ``Irecv`` from the victim and an ``Isend`` of 4 MiB to it (too large to be sent
   eagerly: it needs the victim's receive); then all ranks allreduce (everything is posted), and the victim
   SIGKILLs itself.
3. Survivors wait until the victim's PID is gone, test their requests for 2 s (``pending``: still active,
   ``errors``: ``MPI.Exception`` texts), post one more small ``Isend`` to the dead victim and test it for
   2 s, then abandon all of them (:func:`phoenix_hpc.runtime.mpi_faults.abandon_requests`).
4. Survivors build generation 1 without the victim (``make_comm``) and run 5 allreduce rounds and a ring.
5. Each survivor prints ``SURVIVOR {json}`` and leaves without MPI_Finalize.
"""

import json
import os
import sys
import time

import mpi4py

mpi4py.rc.finalize = False  # MPI_Finalize would synchronise with the dead rank
mpi4py.rc.errors = "default"  # MPI's default handler (fatal) unless the runtime sets one
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from phoenix_hpc.launch.execute import make_comm  # noqa: E402
from phoenix_hpc.runtime.mpi_faults import abandon_requests, errors_return, returns_errors  # noqa: E402
from victim import die, wait_gone  # noqa: E402  (this folder)


def _test_for(reqs, seconds):
    """Test each request for up to ``seconds``: returns (still active, error texts)."""
    errors, active = [], list(reqs)
    deadline = time.monotonic() + seconds
    while active and time.monotonic() < deadline:
        still = []
        for r in active:
            try:
                if not r.Test():
                    still.append(r)
            except MPI.Exception as exc:
                errors.append(exc.Get_error_string().splitlines()[0][:120])
        active = still
        time.sleep(0.01)
    return active, errors


def main() -> None:
    victim, shared = int(sys.argv[1]), sys.argv[2]
    world = errors_return(MPI.COMM_WORLD)
    rank, size = world.Get_rank(), world.Get_size()
    gen0 = make_comm(world, list(range(size)), 0)
    out = {"world_rank": rank, "world_returns_errors": returns_errors(world),
           "gen0_returns_errors": returns_errors(gen0)}
    got = gen0.sendrecv(rank, dest=(rank + 1) % size, source=(rank - 1) % size)
    assert got == (rank - 1) % size
    print(f"STARTED world_rank={rank} size={size}", flush=True)
    big = np.ones(4 << 20, dtype=np.uint8)
    inbox = np.zeros(16, dtype=np.uint8)
    reqs = []
    if rank != victim:
        reqs = [(gen0.Irecv([inbox, MPI.BYTE], source=victim, tag=5), inbox),
                (gen0.Isend([big, MPI.BYTE], dest=victim, tag=6), big)]
    gen0.allreduce(1, op=MPI.SUM)  # every request is posted
    if rank == victim:
        die(shared)
    wait_gone(shared)
    pending, errors = _test_for([r for r, _ in reqs], 2.0)
    out["posted"], out["pending_after_death"], out["errors_after_death"] = len(reqs), len(pending), errors
    small = np.ones(8, dtype=np.uint8)
    late = gen0.Isend([small, MPI.BYTE], dest=victim, tag=7)
    late_pending, late_errors = _test_for([late], 2.0)
    out["late_send_pending"], out["late_send_errors"] = len(late_pending), late_errors
    rep = abandon_requests(reqs + [(late, small)])
    out["abandon"] = {"completed": rep.completed, "cancelled": rep.cancelled, "freed": rep.freed,
                      "kept": rep.kept, "errors": [e.splitlines()[0][:120] for e in rep.errors]}
    members = [w for w in range(size) if w != victim]
    gen1 = make_comm(world, members, 1)
    out["gen1_returns_errors"] = returns_errors(gen1)
    total = 0
    for r in range(5):
        total = gen1.allreduce(rank + r, op=MPI.SUM)
    me, n = gen1.Get_rank(), gen1.Get_size()
    left = gen1.sendrecv(rank, dest=(me + 1) % n, source=(me - 1) % n)
    out["gen1_size"], out["gen1_sum"], out["ring_left"] = n, total, left
    print("SURVIVOR " + json.dumps(out, sort_keys=True), flush=True)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
