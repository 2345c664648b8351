"""Train the torch engine on real MPI + gloo ranks with or without PHOENIX protection and record what the
runtime holds after every step. Run under ``srun --mpi=pmix`` (local cluster) or ``mpirun``.

Usage: python replication_prog.py CONFIG OUT_DIR [--protect] [--k K] [--chunk-bytes N] [--record]
       [--corrupt] [--kill RANK:STEP:CHUNK] [--commit-timeout-s S] [--node-per-rank]

Writes OUT_DIR/rank{r}.json with: losses, state_hash, the owner's SHA-256 of its live optimizer shard at
each commit (``owner[step]``), each held replica's committed step and SHA-256 after every step
(``held[shard][step]``; recorded after a barrier, when every owner has committed), buffer sizes, timings.

``--kill R:S:C``: logical rank R SIGKILLs itself while sending chunk C of its replica at step S (the copy of
S(S-1)). Survivors then stop training at the first error, read every replica they hold (``after_fault``),
write their file and leave without MPI_Finalize.
``--corrupt``: after training, flip one byte in each held committed replica and record whether reading it
fails its checksum.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path

import mpi4py

mpi4py.rc.finalize = False  # after a fault MPI_Finalize would wait for the dead rank; we finalize by hand
from mpi4py import MPI  # noqa: E402


def sha_of(pairs) -> str:
    h = hashlib.sha256()
    for name, t in pairs:
        h.update(name.encode())
        h.update(t.detach().contiguous().cpu().view(-1).view(__import__("torch").uint8).numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("out")
    ap.add_argument("--protect", action="store_true")
    ap.add_argument("--k", type=int, default=None)
    ap.add_argument("--chunk-bytes", type=int, default=None)
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--corrupt", action="store_true")
    ap.add_argument("--kill", default=None)
    ap.add_argument("--commit-timeout-s", type=float, default=20.0)
    ap.add_argument("--node-per-rank", action="store_true", help="treat each rank as its own node (mpirun)")
    ap.add_argument("--unthreaded", action="store_true", help="drive H2H from the training thread (FUNNELED mode)")
    ap.add_argument("--mem-available", default=None, help="RANK:BYTES -- pretend MemAvailable on one rank")
    a = ap.parse_args()

    import torch
    import torch.distributed as dist

    from phoenix_hpc.config.load import load_job_config
    from phoenix_hpc.engines.factory import create_engine
    from phoenix_hpc.errors import ReplicationError
    from phoenix_hpc.launch.groups import init_generation, resolve_grid
    from phoenix_hpc.launch.loop import train
    from phoenix_hpc.launch.rendezvous import mpi_store_rendezvous
    from phoenix_hpc.runtime.protector import Protector
    from phoenix_hpc.topology import parse_topology_addr, place_replicas

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    cfg = load_job_config(a.config)
    res = cfg.resilience
    k = a.k if a.k is not None else res.k
    chunk = a.chunk_bytes if a.chunk_bytes is not None else res.chunk_bytes
    p = cfg.parallelism
    grid = resolve_grid(p.tp, p.pp, p.dp, size)
    store = mpi_store_rendezvous(comm, True, res.collective_timeout_s)
    groups, coord = init_generation(store, 0, rank, grid, "gloo", res.collective_timeout_s)
    engine = create_engine(cfg, coord, groups, torch.device("cpu"))
    out = Path(a.out)
    rec: dict = {"rank": rank, "shard": coord.shard_prefix(), "owner": {}, "held": {}, "protect": a.protect,
                 "node": os.environ.get("SLURMD_NODENAME")}

    protector = None
    if a.protect:
        node = f"rank{rank}" if a.node_per_rank else (os.environ.get("SLURMD_NODENAME") or f"rank{rank}")
        addr = os.environ.get("SLURM_TOPOLOGY_ADDR")
        dom = parse_topology_addr(addr, os.environ["SLURM_TOPOLOGY_ADDR_PATTERN"]) if addr and not a.node_per_rank else {}
        nodes = comm.allgather(node)
        doms = dict(comm.allgather((node, dom)))
        levels = ("node", "switch") if all("switch" in d for d in doms.values()) else ("node",)
        placement = place_replicas(grid.tp, grid.pp, grid.dp, k, nodes, doms, levels)
        hook = None
        if a.kill:
            kr, ks, kc = (int(x) for x in a.kill.split(":"))

            def hook(phase, step, i, _r=rank):
                if _r == kr and phase == "h2h_send_chunk" and step == ks - 1 and i == kc:
                    os.kill(os.getpid(), signal.SIGKILL)

        logs: list[str] = []
        import phoenix_hpc.runtime.protector as pmod

        allocations = []
        real_alloc = pmod.allocate_buffers
        pmod.allocate_buffers = lambda plan, pin, **kw: allocations.append(plan.total_bytes) or real_alloc(plan, pin, **kw)
        mem = None
        if a.mem_available:
            mr, mb = (int(x) for x in a.mem_available.split(":"))
            mem = mb if mr == rank else None
        try:
            protector = Protector.create(
                engine=engine, comm=comm, placement=placement, logical_rank=rank,
                grid={"tp": grid.tp, "pp": grid.pp, "dp": grid.dp}, generation=0, chunk_bytes=chunk,
                commit_timeout_s=a.commit_timeout_s, log=logs.append, fault_hook=hook, mem_available_bytes=mem,
                threaded=False if a.unthreaded else None,
            )
        except ReplicationError as e:
            rec.update(create_error=str(e), allocations=allocations)
            (out / f"rank{rank}.json").write_text(json.dumps(rec))
            dist.barrier(group=groups.world)
            dist.destroy_process_group()
            comm.Barrier()
            MPI.Finalize()
            return
        rec["allocations"] = allocations
        rec["log"] = logs
        rec["placement"] = [[r.owner_rank, r.holder_rank, r.shard_id] for r in placement.replicas]
        rec["memory"] = {
            "snapshot_bytes": protector.layout.total_bytes,
            "replica_bytes": protector.layout.replica_bytes,
            "opt_data_bytes": protector.layout.opt_data_bytes,
            "held": {s: pp.nbytes for s, pp in protector.buffers.held.items()},
            "plan_total": protector.memory_plan.total_bytes,
            "allocated_total": protector.buffers.total_bytes,
            "allocated_local": [b.numel() for b in protector.buffers.local.bufs],
        }
        rec["thread_level"] = protector.thread_level
        rec["threaded"] = protector.h2h.threaded

    class Recording:
        """Delegates to the protector; after each commit (and a barrier) records owner and held hashes."""

        def start_snapshot(self, eng):
            protector.start_snapshot(eng)

        def wait_commit(self):
            c = protector.wait_commit()
            rec["owner"][str(c.step)] = sha_of(engine.optimizer_shard())
            tmp = out / f"owner{rank}.json.tmp"  # survives this process being killed later
            tmp.write_text(json.dumps(rec["owner"]))
            os.replace(tmp, out / f"owner{rank}.json")
            if a.record:
                dist.barrier(group=groups.world)
                for s in protector.held_shards():
                    u = protector.held_replica(s)
                    rec["held"].setdefault(s, {})[str(c.step)] = [u.step, sha_of(list(u.tensors.items()))]
            return c

    tokens = cfg.training.global_batch_size * cfg.model.seq_length
    t0 = time.perf_counter()
    try:
        records = train(engine, cfg.training.steps, tokens, protector=Recording() if protector else None)
    except Exception as e:  # noqa: BLE001 -- a fault drill: record what survives
        rec["error"] = f"{type(e).__name__}: {e}"[:500]
        rec["after_fault"] = {}
        rec["failed_at_step"] = engine.step + 1
        if protector is not None:
            protector.close(abandon=True)
            rec["local_committed_step"] = protector.committed_step
            for s in protector.held_shards():
                try:
                    u = protector.held_replica(s)
                    rec["after_fault"][s] = {"step": u.step, "sha": sha_of(list(u.tensors.items())), "verified": True}
                except ReplicationError as err:
                    rec["after_fault"][s] = {"verified": False, "error": str(err)}
        (out / f"rank{rank}.json").write_text(json.dumps(rec))
        sys.stdout.flush()
        os._exit(0)
    rec["wall_s"] = time.perf_counter() - t0
    rec["losses"] = [r.loss for r in records]
    rec["step_ms"] = [r.step_time_ms for r in records]
    rec["wait_ms"] = [r.exposed_wait_ms for r in records]
    rec["state_hash"] = engine.state_hash()
    if protector is not None:
        final = protector.flush(engine)
        # every owner's final replica is acknowledged once all ranks pass this barrier, so no held buffer
        # flips while the checks below read (and corrupt) it
        dist.barrier(group=groups.world)
        rec["owner"][str(final.step)] = sha_of(engine.optimizer_shard())
        rec["stats"] = protector.stats()
        rec["recoverable_step"] = protector.recoverable_step
        loc = protector.local_snapshot()
        rec["local_snapshot"] = {"step": loc.step, "opt_sha": sha_of([(n, t) for n, t in loc.tensors.items() if n.startswith("opt/")]),
                                 "envelope_step": loc.envelope.get("step")}
        if a.corrupt:
            rec["corrupt"] = {}
            rec["corrupt_restored"] = {}  # shard -> [committed step, step of the held replica once put back]
            for s in protector.held_shards():
                step, buf = protector.buffers.held[s].committed()
                from phoenix_hpc.runtime.snapshot import read_header

                e = next(t for t in read_header(buf).index["tensors"] if t["part"] == "opt" and t["nbytes"])
                off = e["offset"] + e["nbytes"] // 2
                buf[off] ^= 0xFF
                try:
                    protector.held_replica(s, step)
                    rec["corrupt"][s] = "not detected"
                except ReplicationError as err:
                    rec["corrupt"][s] = str(err)
                buf[off] ^= 0xFF
                rec["corrupt_restored"][s] = [step, protector.held_replica(s).step]
        protector.close()
    dist.barrier(group=groups.world)
    (out / f"rank{rank}.json").write_text(json.dumps(rec))
    dist.destroy_process_group()
    comm.Barrier()
    MPI.Finalize()


if __name__ == "__main__":
    main()
