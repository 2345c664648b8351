"""The rank entry point: ``python -m phoenix_hpc.launch.rank --run-dir RUN_DIR`` (console script
``phoenix-rank``), run on every slot of the job's one srun step (or under ``mpirun`` for development).

Sequence on every slot:

1. Read the slot's launcher environment (:mod:`.env`); MPI init (mpi4py, ``MPI.COMM_WORLD``); compare
   rank/size with the launcher's. Read the resolved config ``RUN_DIR/config.yaml`` (``--config``
   overrides the path); check the engine can run here (``megatron`` needs CUDA), the user code the config
   names imports and checks as at submit (:func:`phoenix_hpc.engines.factory.check_user_code`), and the
   dataset is a Megatron indexed dataset. The slots share their errors (one allgather), so a problem seen on any slot
   stops every slot with exit 2 before training and before any file is written; world rank 0 prints each
   distinct message once.
2. Active slots are those on
   the first ``resources.nodes`` nodes (``SLURM_NODEID``; all slots under mpirun); they must be world
   ranks ``0..A-1`` (srun's default block distribution) and ``A`` must match the grid
   (``tp x pp x dp``), else exit 2 naming both numbers.
3. Rendezvous (the coordinator's store when ``RUN_DIR/coordinator.json`` exists, see
   :mod:`phoenix_hpc.control.attach`; else :func:`.rendezvous.mpi_store_rendezvous`), then on active
   slots ``init_process_group`` (gloo on CPU, NCCL on GPU) for generation 0 with
   ``resilience.collective_timeout_s`` on every group, the dp/pp/tp sub-groups (:mod:`.groups`), the
   engine, optionally its state restored from ``--restore-dir``, and the training loop (:mod:`.loop`) up
   to ``training.steps``.
   Under a coordinator with ``resilience.enabled`` and ``mode: phoenix``, training runs in
   :class:`phoenix_hpc.launch.execute.Member`: the runtime protector (placement from
   :func:`phoenix_hpc.topology.generation_placement` over the slots' nodes and the failure domains of their
   ``SLURM_TOPOLOGY_ADDR``), commit reports, injected faults at every phase, and the rank side of local
   recovery and hot swap. Standby slots warm up (imports, dataset reader) and wait for a ``recover``
   plan naming them (:func:`phoenix_hpc.launch.execute.wait_for_join`): they then take their logical
   rank, are restored, and train to the end like any member; or for ``stop``.
4. Without a coordinator every slot ends with a barrier over ``MPI.COMM_WORLD`` (so the store host,
   world rank 0, outlives its users and standby slots learn that the job is over) and ``MPI_Finalize``
   (unless it left PMIx after ``MPI_Init``, :mod:`.pmix`, which every slot under Open MPI's PMIx does so that
   its death does not cancel the Slurm step: then it just ends).
   Under a coordinator a slot reports ``done`` and waits (bounded) for the coordinator's ``stop``; it does
   not call ``MPI_Finalize``, which would synchronise with slots that may have died.

Files written by active rank ``r`` (logical rank):

* ``RUN_DIR/ranks/rank{r}.steps.jsonl`` -- one JSON object per step: ``step, loss (null except on the
  last pipeline stage), step_time_ms, tokens_per_s, exposed_wait_ms, lr, grad_norm`` (``lr``: the rate the
  step's update used, one step behind Megatron-LM's logged rate, which is the next iteration's);
* ``RUN_DIR/ranks/rank{r}.json`` (at the end, written atomically) -- summary: ``status`` (done | stopped |
  failed | left | drained | fenced),
  ``rank, world_rank, coord, grid, generation, joined`` (a standby slot that took this rank),
  ``recoveries`` (under protection: per recovery the generation, recoverable step, live step, dirty,
  rolled back, timings and their detail in seconds), ``engine, host, node_id, start_step, steps, first_loss,
  final_loss, mean_step_time_ms, tokens_per_s, state_hash`` (:meth:`Engine.state_hash`), ``param_hash``,
  ``optimizer_hash``, shard sizes in bytes, ``gc`` (the garbage collector's pauses in this process,
  :meth:`phoenix_hpc.launch.heap.GcPauses.summary`), and on failure ``error``. A slot that a planned drain
  moved to a spare (``status`` drained) writes its summary to ``RUN_DIR/ranks/drained-world{w}.json`` (its
  world rank) instead: ``rank{r}.json`` belongs to the spare that holds rank ``r`` now, and the drained slot
  may leave after that spare has finished. Likewise a slot the coordinator declared dead while its process
  lived (a GPU error, a hang; ``status`` fenced: it is told to stop at once) writes
  ``RUN_DIR/ranks/fenced-world{w}.json``, and a slot whose DP replica a shrink removed (``status`` left: its
  logical rank may be a renumbered member's now) ``RUN_DIR/ranks/left-world{w}.json``; a slot that later
  joins again as a spare writes the summary of the rank it then holds at its end;
* with ``--snapshot-at S``: the rank's state after step S in ``--snapshot-dir`` (default
  ``RUN_DIR/snapshots/step{S}``), one file per logical coordinate (:mod:`.state_files`).

The last pipeline stage's DP rank 0 also prints one line per ``training.log_interval`` steps and a final
summary to stdout.

A slot under a coordinator turns SIGTERM (``scancel``, ``scancel --signal=TERM``, preemption: Slurm signals
the step's tasks) into a ``signal`` report: the coordinator then ends the job as planned, the members
writing the final checkpoint from their host snapshots (:mod:`phoenix_hpc.control.ending`).

Exit codes: 0 done; 2 bad input or environment (a PhoenixError); 3 the coordinator stopped the job before
its end (time limit, SIGTERM, a stop request: one line says why and names the checkpoint); 74 the slot's MPI
library deadlocked on a dead peer (:class:`phoenix_hpc.errors.TransportWedged`); 1 anything else.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path

from phoenix_hpc.errors import EngineError, PhoenixError
from phoenix_hpc.launch.rank_summary import STATUS_OF_END, StepLog, done_line, done_summary, end_summary, write_summary
from phoenix_hpc.launch.registration import (  # noqa: F401 -- gather_nodes, listen_from_registration: read here too
    attach_slot, gather_nodes, listen_from_registration, protected)

EXIT_STOPPED = 3  # the job was stopped before its end (the coordinator's verdict of the same name)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="phoenix-rank", description="Run one slot of a phoenix_hpc job.")
    ap.add_argument("--run-dir", required=True, help="the job's run directory (holds config.yaml)")
    ap.add_argument("--config", help="config file (default RUN_DIR/config.yaml)")
    ap.add_argument("--snapshot-at", type=int, action="append", default=[], help="save each rank's state after this step")
    ap.add_argument("--snapshot-dir", help="where --snapshot-at writes (default RUN_DIR/snapshots/step{S})")
    ap.add_argument("--restore-dir", help="load each rank's state from here before training")
    return ap.parse_args(argv)


def _barrier(comm, poll_s: float = 0.05) -> None:
    """Barrier over ``comm`` that sleeps while waiting (a blocking MPI barrier spins a core)."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(poll_s)


def wait_for_role(comm) -> None:
    """Standby: idle until given a role. Until the coordinator hands out roles, the only message is the
    end of the job (the final barrier over ``comm``)."""
    _barrier(comm, poll_s=0.2)


def preflight(cfg) -> None:
    """Checks every slot makes before MPI starts.

    Raises:
        EngineError: the engine cannot run here; DataError: the dataset is missing or not indexed;
        ConfigError: user code named in the config (engine, model.factory, data.factory) does not import or
            is malformed (the same check as ``phoenix submit``'s), or a package ``logging`` needs is missing.
    """
    from phoenix_hpc.data.indexed import check_indexed_dataset
    from phoenix_hpc.engines.factory import check_engine_runnable, check_user_code

    check_engine_runnable(cfg.engine)
    check_user_code(cfg)
    from phoenix_hpc.errors import ConfigError
    from phoenix_hpc.launch.metrics_log import logging_problems

    problems = logging_problems(cfg)
    if problems:
        raise ConfigError(problems, source=f"job {cfg.name!r}")
    for field, prefix in cfg.data.prefix_fields:
        check_indexed_dataset(prefix, field=field)


def set_nccl_error_env(cfg, env=None) -> dict[str, str]:
    """Set torch's NCCL error-handling variables for a protected job on CUDA before any process group
    exists (:func:`phoenix_hpc.launch.nccl_env.nccl_error_env`). Returns what was set.

    Raises:
        EngineError: a variable holds a value under which torch would end a surviving rank.
    """
    import torch

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    return apply_nccl_error_env(os.environ if env is None else env, backend, protected(cfg))


def apply_nccl_error_env(env, backend: str, protected: bool) -> dict[str, str]:
    """Set in ``env`` (a mutable mapping, e.g. ``os.environ``) what
    :func:`phoenix_hpc.launch.nccl_env.nccl_error_env` decides for ``backend`` and ``protected``; returns
    what was set. The GPU check (``gpucheck/common.py``) calls it as a protected job on CUDA does.

    Raises:
        EngineError: a variable holds a value under which torch would end a surviving rank (the message
            names the variable, its value and the allowed values).
    """
    from phoenix_hpc.launch.nccl_env import nccl_error_env

    updates, problems = nccl_error_env(env, backend, protected)
    if problems:
        raise EngineError("; ".join(problems))
    env.update(updates)
    return updates


def _device_of(slot):
    """This slot's torch device (deterministic algorithms on; cuBLAS's workspace set before its first call) and
    its collective backend: ``(device, "nccl" | "gloo")``."""
    import torch

    from phoenix_hpc.engines.factory import default_device

    torch.set_num_threads(int(os.environ.get("SLURM_CPUS_PER_TASK") or os.environ.get("OMP_NUM_THREADS") or 1))
    device = default_device(slot.local_rank)
    if device.type == "cuda":  # deterministic cuBLAS needs this before the first cuBLAS call
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=device.type == "cuda")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device, "nccl" if device.type == "cuda" else "gloo"


def _member_of(args, cfg, slot, grid, store, run_dir: Path, progress, resilient, join_plan, device, backend):
    """The protected driver's :class:`~phoenix_hpc.launch.execute.Member` of this slot, in its first
    generation: started (generation 0, its state restored from ``--restore-dir`` or the newest persistent
    checkpoint) or joined (``join_plan``)."""
    from phoenix_hpc.launch import persist
    from phoenix_hpc.launch.execute import Member, MemberEnv
    from phoenix_hpc.launch.state_files import load_rank_state

    member = Member(MemberEnv(
        cfg=cfg, run_dir=run_dir, world_comm=resilient["world_comm"], world_rank=slot.world_rank,
        client=resilient["client"], progress=progress, store=store, nodes=resilient["nodes"],
        domains=resilient["domains"], levels=resilient["levels"], grid=grid, backend=backend, device=device,
        watchdog=resilient.get("watchdog") if join_plan is None else None,
    ))
    if join_plan is not None:
        member.join(join_plan)
        return member

    def restore(eng) -> None:
        if args.restore_dir:
            load_rank_state(eng, args.restore_dir)
        persist.restore_latest(eng, member.groups, cfg, run_dir)  # a resubmitted job resumes

    # known before the generation is built (unless --restore-dir): the slot answers injections meanwhile
    member.start(restore=restore, start_step=resilient.get("start_step"))
    return member


def _plain_groups(cfg, store, slot, grid, device, backend):
    """Without protection: generation 0's groups, ``(groups, coord)``."""
    from phoenix_hpc.engines.user_code import load_engine_class
    from phoenix_hpc.launch.groups import init_generation

    owns_groups = load_engine_class(cfg.engine, cfg.python_path).owns_groups
    return init_generation(store, 0, slot.world_rank, grid, backend, cfg.resilience.collective_timeout_s,
                           device_id=device if device.type == "cuda" else None, sub_groups=not owns_groups)


def _plain_engine(args, cfg, coord, groups, run_dir: Path, device):
    """Without protection: generation 0's engine on ``groups``, its state restored from ``--restore-dir`` or
    the newest persistent checkpoint. Returns ``(engine, groups)`` (the engine's groups when it owns them)."""
    from phoenix_hpc.engines.factory import create_engine
    from phoenix_hpc.launch import persist
    from phoenix_hpc.launch.state_files import load_rank_state

    engine = create_engine(cfg, coord, groups, device)
    if engine.owns_groups:  # the engine completed the world group with its own dp/pp/tp groups
        groups = engine.groups
    if args.restore_dir:
        load_rank_state(engine, args.restore_dir)
    persist.restore_latest(engine, groups, cfg, run_dir)
    return engine, groups


def run_active(args, cfg, slot, grid, store, run_dir: Path, progress=None, resilient=None,
               join_plan=None, client=None) -> dict:
    """Train as logical rank ``slot.world_rank`` (generation 0), or, with ``join_plan``, as the logical rank
    a recovery plan gives this standby slot. ``resilient`` (a dict with ``client``, ``nodes``, ``domains``,
    ``levels``, ``world_comm``) turns on the protected driver (:class:`phoenix_hpc.launch.execute.Member`);
    without it, ``client`` (the coordinator client of an unprotected job under the batch script) lets
    injected faults land in the plain loop (:mod:`phoenix_hpc.launch.plain_faults`).
    Returns the summary written to ``rank{r}.json``."""
    import torch.distributed as dist

    from phoenix_hpc.launch import persist
    from phoenix_hpc.launch.evaluate import evaluator_of
    from phoenix_hpc.launch.loop import train
    from phoenix_hpc.launch.metrics_log import is_logging_rank, metrics_log_of
    from phoenix_hpc.launch.state_files import save_rank_state

    device, backend = _device_of(slot)
    member, engine, groups = None, None, None
    if resilient is not None:
        member = _member_of(args, cfg, slot, grid, store, run_dir, progress, resilient, join_plan, device, backend)
        # no local reference to the member's groups: a recovery frees them (Member.release_groups)
        rank, coord = member.logical, member.coord
    else:
        rank = slot.world_rank
        groups, coord = _plain_groups(cfg, store, slot, grid, device, backend)
    summary: dict = {"status": "failed", "rank": rank, "world_rank": slot.world_rank, "generation": 0,
                     "engine": cfg.engine, "coord": coord.to_json(), "grid": grid.to_json(), "host": slot.hostname,
                     "node_id": slot.node_id, "joined": join_plan is not None}
    ranks_dir = run_dir / "ranks"
    ranks_dir.mkdir(parents=True, exist_ok=True)
    try:
        if member is None:
            engine, groups = _plain_engine(args, cfg, coord, groups, run_dir, device)
        else:
            engine = member.engine
        summary["start_step"] = start_step = engine.step
        if progress is not None:  # heartbeats say the restored step (a resumed job) before its first step ends
            progress.set(step=start_step)
        reporter = coord.pp == grid.pp - 1 and coord.dp == 0
        tokens_per_step = cfg.training.global_batch_size * cfg.model.seq_length
        snapshot_at = set(args.snapshot_at)
        log = StepLog(cfg, ranks_dir / f"rank{rank}.steps.jsonl", progress, reporter,
                      metrics_log_of(cfg, run_dir, start_step) if is_logging_rank(coord, grid) else None)
        evaluator = evaluator_of(cfg, log.on_eval)

        def on_step(rec) -> None:
            log.record(rec)
            if rec.step in snapshot_at:  # the member's engine is a new object after a rebuild
                save_rank_state(engine if member is None else member.engine,
                                args.snapshot_dir or run_dir / "snapshots" / f"step{rec.step}")
            if member is None:
                persist.save_if_due(engine, groups, rec.step, cfg, run_dir)
            else:  # the member's engine and groups of the current generation
                path = persist.save_if_due(member.engine, member.groups, rec.step, cfg, run_dir)
                if path is not None and member.logical == 0:
                    resilient["client"].report_checkpoint(rec.step, str(path))

        try:
            if member is not None:
                member.run(cfg.training.steps, tokens_per_step, on_step=on_step, evaluator=evaluator)
                engine = member.engine
                member.finish()
            else:
                hook = None
                if client is not None:
                    from phoenix_hpc.launch.plain_faults import injection_hook

                    hook = injection_hook(client, run_dir, slot.world_rank, cfg.training.steps)
                train(engine, cfg.training.steps, tokens_per_step, protector=None, on_step=on_step,
                      phase_hook=hook, keep=False, evaluator=evaluator)
        finally:
            log.close()
        summary.update(done_summary(engine, log.totals, tokens_per_step))
        if reporter:
            print(done_line(summary, rank), flush=True)
        return summary
    except BaseException as exc:
        summary["error"] = f"{type(exc).__name__}: {exc}"
        summary["status"] = STATUS_OF_END.get(getattr(exc, "job_state", None), summary["status"])
        raise
    finally:
        end_summary(summary, member)
        write_summary(ranks_dir, summary)
        if dist.is_initialized():
            dist.destroy_process_group()


def _agree_on_errors(comm, error: PhoenixError | None) -> PhoenixError | None:
    """Collective: share every slot's pre-training error so that all slots stop together (a problem seen
    on one node only must not leave the others waiting in MPI). World rank 0 prints each distinct
    message once, with the world ranks that hit it. Returns the first error, or None."""
    errors = comm.allgather(None if error is None else (type(error).__name__, str(error), error.exit_code))
    seen: dict[str, list[int]] = {}
    for r, e in enumerate(errors):
        if e is not None:
            seen.setdefault(e[1], []).append(r)
    if not seen:
        return None
    if comm.Get_rank() == 0:
        for msg, ranks in seen.items():
            where = "all slots" if len(ranks) == len(errors) else f"slots {ranks}"
            print(f"error ({where}): {msg}", file=sys.stderr, flush=True)
    first = next(e for e in errors if e is not None)
    out = PhoenixError(first[1])
    out.exit_code = first[2]
    return out


def _config_and_grid(comm, slot, args, run_dir: Path):
    """Collective: the job's config and grid, checked on every slot. Returns ``(slot, cfg, active, grid,
    error)``; ``error`` (a PhoenixError, the same on every slot) when a slot refused its input or the active
    slots are not world ranks ``0..A-1``."""
    from phoenix_hpc.config.load import load_job_config
    from phoenix_hpc.launch.env import check_against_mpi
    from phoenix_hpc.launch.groups import resolve_grid

    cfg = active = grid = None
    err: PhoenixError | None = None
    try:
        slot = check_against_mpi(slot, comm.Get_rank(), comm.Get_size())
        cfg = load_job_config(args.config or run_dir / "config.yaml")
        preflight(cfg)
        set_nccl_error_env(cfg)  # before the first NCCL group: torch reads it when a group is created
    except PhoenixError as exc:
        err = exc
    err = _agree_on_errors(comm, err)
    if err is None:
        try:
            active = slot.is_active(cfg.resources.nodes)
            flags = comm.allgather(active)
            n_active = sum(flags)
            if flags != [True] * n_active + [False] * (len(flags) - n_active) or n_active == 0:
                raise EngineError(
                    f"active slots must be world ranks 0..A-1 (srun block distribution); got active ranks "
                    f"{[i for i, f in enumerate(flags) if f]} of {len(flags)}"
                )
            p = cfg.parallelism
            grid = resolve_grid(p.tp, p.pp, p.dp, n_active)
        except PhoenixError as exc:  # the same on every slot (computed from allgathered data)
            if comm.Get_rank() == 0:
                print(f"error (all slots): {exc}", file=sys.stderr, flush=True)
            err = exc
    return slot, cfg, active, grid, err


def _prepare_device(slot, cfg) -> None:
    """On a GPU, before the CUDA context exists and before the imports: Megatron-LM's
    ``CUDA_DEVICE_MAX_CONNECTIONS``, and this slot's GPU current (a library that touches CUDA when imported,
    Transformer Engine, must find it, not GPU 0)."""
    from phoenix_hpc.engines.factory import default_device

    device = default_device(slot.local_rank)
    if device.type != "cuda":
        return
    import torch

    from phoenix_hpc.engines.megatron_env import apply_megatron_cuda_env, compute_capability_major

    apply_megatron_cuda_env(os.environ, cfg.engine, cfg.parallelism.tp, compute_capability_major(device.index or 0))
    torch.cuda.set_device(device)


def _as_spare(att, slot, cfg, train) -> dict | None:
    """A standby slot: warm up, then join each plan that names it (``train(join_plan=..., store=...)``) until
    one ends with a summary; None when the job ends (``stop``) without needing it."""
    from phoenix_hpc.launch.execute import wait_for_join, warm_up
    from phoenix_hpc.launch.heap import freeze_long_lived

    warm_up(cfg)
    freeze_long_lived()  # a slot that was active froze at its start: nothing more (launch/heap.py)
    summary = None
    while summary is None:
        plan = wait_for_join(att.client)  # None: the job ended (stop) without needing this spare
        if plan is None:
            break
        print(f"[phoenix] standby world rank {slot.world_rank} on {slot.hostname}: joining generation "
              f"{plan.generation}", flush=True)
        summary = train(join_plan=plan, store=att.client.tcp_store())
    return summary


def _exit_code(exc: PhoenixError, slot, att) -> int:
    """The exit code of a slot that ``exc`` ended (module doc), said in one line; a fault is reported."""
    from phoenix_hpc.launch.execute import StopRequested

    if isinstance(exc, StopRequested) and exc.job_state == "stopped":  # a planned end: one line, code 3
        print(f"[phoenix] world rank {slot.world_rank}: {exc}", file=sys.stderr, flush=True)
        code = EXIT_STOPPED
    elif isinstance(exc, StopRequested) and exc.job_state == "drained":  # moved to a spare: not an error
        print(f"[phoenix] world rank {slot.world_rank}: {exc}", file=sys.stderr, flush=True)
        code = 0
    else:
        print(f"error [world rank {slot.world_rank}]: {exc}", file=sys.stderr, flush=True)
        code = 1 if isinstance(exc, StopRequested) else exc.exit_code
    if att and not isinstance(exc, StopRequested):
        att.client.report_fault(att.progress.generation or 0, att.progress.step, "step", exc,
                                kind=getattr(exc, "fault_kind", None))
    return code


def _trainer(args, cfg, slot, grid, store, run_dir: Path, att, resilient):
    """``train(**kw)``: :func:`run_active` (on ``kw``'s ``store``, else ``store``); None when a shrink sent
    this slot back to standby (launch/shrink.py)."""
    def train(**kw) -> dict | None:
        try:
            return run_active(args, cfg, slot, grid, kw.pop("store", store), run_dir,
                              att.progress if att else None, resilient, **kw)
        except PhoenixError as exc:
            if getattr(exc, "job_state", None) != "standby":
                raise
            print(f"[phoenix] world rank {slot.world_rank}: {exc}; waiting as a spare", flush=True)
            return None

    return train


def _end_attached(att, summary, cfg) -> None:
    """A slot under the coordinator ends: after ``done``, a bounded wait for the coordinator's ``stop`` (a
    restart under way: ``done`` goes to the next coordinator; the watchdog bounds the wait), then the client
    closes."""
    if summary is not None and not att.client.stop_received:
        while att.client.wait_instruction(("stop",), timeout_s=max(30.0, 3 * cfg.resilience.heartbeat_timeout_s)) \
                is None and att.client.away:
            pass
    att.client.close()
    sys.stdout.flush()
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    from phoenix_hpc.launch.heap import PAUSES, cap_malloc_arenas

    cap_malloc_arenas()  # before any thread allocates: host memory flat across recoveries (launch/heap.py)
    PAUSES.install()  # the collections' pauses, in the rank summary and each recovery's detail
    args = _parse(argv)
    run_dir = Path(args.run_dir)
    from phoenix_hpc.launch.env import slot_from_env

    try:
        slot = slot_from_env(os.environ)
    except PhoenixError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code

    import mpi4py

    from phoenix_hpc.launch import pmix

    # MPI_Finalize synchronises with every process of the job, dead ones included: it is called by hand,
    # only when no slot can have died and the slot did not leave PMIx (see the end of this function).
    mpi4py.rc.finalize = False
    try:
        pmix.prepare_env()  # before MPI_Init: every peer's address is fetched at init (launch/pmix.py)
    except PhoenixError as exc:  # a bad PHOENIX_PMIX_DETACH
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    from mpi4py import MPI

    # a slot's death must not cancel the whole Slurm step (Slurm's PMIx plugin does on a lost connection)
    detached = pmix.detach() is not None

    def finalize() -> None:
        if not detached:  # MPI_Finalize's fence needs PMIx: a detached slot just ends
            MPI.Finalize()

    from phoenix_hpc.launch.rendezvous import mpi_store_rendezvous

    from phoenix_hpc.runtime.mpi_faults import errors_return

    comm = errors_return(MPI.COMM_WORLD)  # a dead slot's errors are returned (MPI.Exception), never fatal
    slot, cfg, active, grid, err = _config_and_grid(comm, slot, args, run_dir)
    if err is not None:
        finalize()
        return err.exit_code

    from phoenix_hpc.control.attach import coordinator_present

    att = None
    resilient = None
    if coordinator_present(run_dir):  # under the batch script: the coordinator's store and heartbeats
        try:
            att, resilient = attach_slot(comm, slot, cfg, run_dir, active, grid, args.restore_dir)
        except PhoenixError as exc:
            print(f"error [world rank {comm.Get_rank()}]: {exc}", file=sys.stderr, flush=True)
            return exc.exit_code
        store = att.store
    else:
        store = mpi_store_rendezvous(comm, active, cfg.resilience.collective_timeout_s)
    code = 0
    summary = None
    try:
        train = _trainer(args, cfg, slot, grid, store, run_dir, att, resilient)
        from phoenix_hpc.launch.heap import freeze_long_lived

        _prepare_device(slot, cfg)
        if active:
            from phoenix_hpc.launch.execute import import_runtime

            import_runtime(cfg)
            freeze_long_lived()  # before the first generation's groups, engine and protector (launch/heap.py)
            summary = train(client=att.client if att is not None and resilient is None else None)
        standby = summary is None
        if standby and att is not None and resilient is not None:
            summary = _as_spare(att, slot, cfg, train)
        elif standby and att is not None:
            att.client.wait_instruction(("stop",), timeout_s=float("inf"))
        elif standby:
            wait_for_role(comm)
            finalize()
            return 0
        if att and summary is not None:
            att.client.report_done(int(summary.get("generation", 0)), summary["steps"], summary["state_hash"])
    except PhoenixError as exc:
        code = _exit_code(exc, slot, att)
    except Exception as exc:
        traceback.print_exc()
        code = 1
        if att:
            att.client.report_fault(att.progress.generation or 0, att.progress.step, "step", exc)
    if resilient is not None and resilient.get("watchdog") is not None:
        resilient["watchdog"].close()  # the client is read directly from here on
    if att is None:
        _barrier(comm)
        finalize()
        return code
    _end_attached(att, summary, cfg)
    return code


if __name__ == "__main__":
    sys.exit(main())
