"""One rank of scripts/bench-overhead: train the torch engine with or without PHOENIX protection and write
per-step times to OUT_DIR/rank{r}.json. Started by the bench script under mpirun or srun."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import mpi4py

mpi4py.rc.finalize = False
from mpi4py import MPI  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("out")
    ap.add_argument("--protect", action="store_true")
    a = ap.parse_args()

    import torch
    import torch.distributed as dist

    from phoenix_hpc.config.load import load_job_config
    from phoenix_hpc.engines.factory import create_engine
    from phoenix_hpc.launch.groups import init_generation, resolve_grid
    from phoenix_hpc.launch.loop import train
    from phoenix_hpc.launch.rendezvous import mpi_store_rendezvous
    from phoenix_hpc.runtime.protector import Protector
    from phoenix_hpc.topology import place_replicas

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 1))
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    cfg = load_job_config(a.config)
    p, res = cfg.parallelism, cfg.resilience
    grid = resolve_grid(p.tp, p.pp, p.dp, size)
    store = mpi_store_rendezvous(comm, True, res.collective_timeout_s)
    groups, coord = init_generation(store, 0, rank, grid, "gloo", res.collective_timeout_s)
    engine = create_engine(cfg, coord, groups, torch.device("cpu"))
    protector = None
    if a.protect:
        # every rank its own failure domain: one host, so "node" is the process here
        placement = place_replicas(grid.tp, grid.pp, grid.dp, res.k, [f"slot{r}" for r in range(size)], None, ("node",))
        protector = Protector.create(engine=engine, comm=comm, placement=placement, logical_rank=rank,
                                     grid={"tp": grid.tp, "pp": grid.pp, "dp": grid.dp}, generation=0,
                                     chunk_bytes=res.chunk_bytes, log=None, checksum=res.checksum)
    tokens = cfg.training.global_batch_size * cfg.model.seq_length
    import time

    cpu = [time.process_time()]  # CPU seconds of the whole process (all threads: training, copy, H2H)
    records = train(engine, cfg.training.steps, tokens, protector=protector,
                    on_step=lambda rec: cpu.append(time.process_time()))
    out = {"rank": rank, "step_ms": [r.step_time_ms for r in records], "wait_ms": [r.exposed_wait_ms for r in records],
           "cpu_ms": [1e3 * (b - a) for a, b in zip(cpu, cpu[1:])]}
    if protector is not None:
        from phoenix_hpc.bench.throughput import measure

        out["stats"] = protector.stats()
        out["throughput_ns_per_byte"] = measure(16 << 20, 3)  # this machine's limit, same run
        out["checksum"] = res.checksum
        protector.close()
    Path(a.out, f"rank{rank}.json").write_text(json.dumps(out))
    dist.barrier(group=groups.world)
    dist.destroy_process_group()
    comm.Barrier()
    MPI.Finalize()


if __name__ == "__main__":
    main()
