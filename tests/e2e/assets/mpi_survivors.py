"""MPI ranks that lose one member and keep working: run under ``srun --mpi=pmix --no-kill
--kill-on-bad-exit=0`` with one task per node.

Usage: python mpi_survivors.py VICTIM_RANK ROUNDS SHARED_DIR

1. All ranks allreduce their rank over COMM_WORLD (proves the full step started).
2. The victim writes its PID to SHARED_DIR/victim.pid and kills itself with SIGKILL (a crash: no
   MPI_Finalize, no goodbye).
3. The survivors wait until that PID is gone (all "nodes" of the local cluster share one machine, so
   /proc shows it), build a communicator of the survivors with ``Comm.Create_group`` (collective over
   the group only, so the dead rank is not needed), then run ROUNDS rounds of allreduce and a ring
   sendrecv over it, checking every value.
   With ``SURVIVORS_HOLD_S`` they first wait that long (whether the step outlives Slurm's reaction to the
   death); with ``SURVIVORS_DETACH=1`` every rank leaves PMIx after ``MPI_Init`` (phoenix_hpc/launch/pmix.py).
4. Each survivor prints one line ``SURVIVOR world_rank=R new_rank=K size=S rounds=N sum=X ring_ok=1``
   and leaves without MPI_Finalize (which would wait for the dead rank).
"""

import os
import sys

import time

import mpi4py

mpi4py.rc.finalize = False  # MPI_Finalize would synchronise with the dead rank
# SURVIVORS_DETACH=1: leave PMIx after MPI_Init as the project's slots do (phoenix_hpc/launch/pmix.py)
DETACH = os.environ.get("SURVIVORS_DETACH") == "1"
if DETACH:
    from phoenix_hpc.launch import pmix

    pmix.prepare_env()
from mpi4py import MPI  # noqa: E402
from victim import die, wait_gone  # noqa: E402  (this folder)

if DETACH:
    DETACHED = pmix.detach()
    print(f"DETACHED {DETACHED}", flush=True)


def main() -> None:
    victim, rounds, shared = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    total = world.allreduce(rank, op=MPI.SUM)
    if total != size * (size - 1) // 2:
        print(f"BAD world_rank={rank} world_sum={total}", flush=True)
        os._exit(3)
    print(f"STARTED world_rank={rank} size={size} node={os.environ.get('SLURMD_NODENAME')}", flush=True)
    if rank == victim:
        die(shared)
    wait_gone(shared)
    time.sleep(float(os.environ.get("SURVIVORS_HOLD_S", "0")))  # still alive after Slurm's reaction time?
    survivors = world.Get_group().Excl([victim])
    comm = world.Create_group(survivors, tag=7)
    me, n = comm.Get_rank(), comm.Get_size()
    ring_ok = True
    total = 0
    for r in range(rounds):
        total = comm.allreduce(rank + r, op=MPI.SUM)
        expected = sum(w + r for w in range(size) if w != victim)
        if total != expected:
            print(f"BAD world_rank={rank} round={r} sum={total} expected={expected}", flush=True)
            os._exit(4)
        got = comm.sendrecv(rank * 1000 + r, dest=(me + 1) % n, source=(me - 1) % n)
        left_world = survivors.Translate_ranks([(me - 1) % n], world.Get_group())[0]
        ring_ok = ring_ok and got == left_world * 1000 + r
    print(f"SURVIVOR world_rank={rank} new_rank={me} size={n} rounds={rounds} sum={total} "
          f"ring_ok={int(ring_ok)}", flush=True)
    sys.stdout.flush()
    os._exit(0 if ring_ok else 5)


if __name__ == "__main__":
    main()
