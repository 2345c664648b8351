"""A member's side of a planned end with ``resilience.checkpoint.save_megatron``: the final checkpoint also in
Megatron-LM's torch_dist layout, so that the run can go on in Megatron-LM from the step the job stopped at
(docs/design.md section 7, "Planned ends").

:func:`phoenix_hpc.launch.final.final_checkpoint` calls :func:`export` after the member wrote its shard of
the final checkpoint of ``step`` and before it reports it: the coordinator is still waiting for the
``shard_written`` answers, so its store serves the rendezvous, and the slots are not yet asked to exit.
Writing with megatron-core's ``dist_checkpointing`` needs live process groups and an engine built on them,
and a planned end released the generation's groups at once (a member blocked in a collective must fail
fast). So the members build one more set of groups for the export only
(:func:`phoenix_hpc.launch.groups.init_generation` over the coordinator's store under the prefix
:func:`store_prefix`, which no generation uses), each ends its engine
and builds a fresh one on them (the Megatron engine's recovery style is ``rebuild``), loads its host
snapshot of ``step`` into it and writes it (:func:`phoenix_hpc.engines.megatron_ckpt.save_snapshot`: model
and DistributedOptimizer sharded state dicts, iteration, scheduler, RNG; then
``latest_checkpointed_iteration.txt``). Every member takes part or the collectives of the others fail after
``resilience.collective_timeout_s``: a failed export is reported, it never makes the final checkpoint of
phoenix's own format incomplete.

Not written twice: when the periodic export already wrote ``step`` (the tracker names it and its folder
exists, :func:`already_written`), nothing is done.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


def store_prefix(generation: int, step: int) -> str:
    """The store prefix of the export's rendezvous: distinct from every generation's ``gen{g}``
    (:func:`phoenix_hpc.launch.groups.init_generation`), so no member of a generation can join it. Pure."""
    return f"final-megatron/gen{int(generation)}/step{int(step)}"


def already_written(root: str | Path, step: int) -> bool:
    """Whether the Megatron-LM checkpoint directory ``root`` already holds ``step`` as its newest checkpoint
    (its ``latest_checkpointed_iteration.txt`` names ``step`` and ``iter_{step:07d}`` exists): the periodic
    export of that step. A missing or unreadable tracker: False (reads two file-system entries)."""
    from phoenix_hpc.engines.megatron_layout import iter_dir, read_tracker

    try:
        it = read_tracker(root)
    except ValueError:
        return False
    return it == int(step) and iter_dir(root, step).is_dir()


def export(member, unpacked, step: int) -> dict[str, Any]:
    """Write this member's host snapshot ``unpacked`` of ``step`` (:meth:`Protector.local_snapshot`) into
    ``resilience.checkpoint.save_megatron`` in Megatron-LM's layout, collectively with every member (module
    doc). Ends the member's engine and leaves a fresh one whose groups are released again (the job is
    ending), as a generation's are (:meth:`Member.release_groups`: NCCL communicators aborted, gloo
    connections shut down, then ``destroy_process_group``). Returns what the member adds to its
    ``shard_written`` report: ``{"megatron": {"dir", "iteration", "write_s", "folder"}}``,
    ``{"megatron": {"dir", "iteration", "skipped": why}}`` or ``{"megatron_error": "..."}``; never raises for
    a failed export (the error is reported and logged)."""
    from phoenix_hpc.engines.megatron_ckpt import save_snapshot
    from phoenix_hpc.launch.abort import SocketCapture
    from phoenix_hpc.launch.copies import split_snapshot
    from phoenix_hpc.launch.groups import init_generation
    from phoenix_hpc.launch.member_env import generation_abort
    from phoenix_hpc.launch.persist import log_event

    e = member.env
    root = e.cfg.resilience.checkpoint.save_megatron
    if already_written(root, step):
        return {"megatron": {"dir": str(root), "iteration": int(step), "skipped": "written by the periodic export"}}
    t0 = time.perf_counter()
    t_start = time.time()
    try:
        member._teardown_engine()  # its model and optimizer hold the released groups
        with SocketCapture() as cap:  # released as a generation's are: aborted, never left hanging
            member.groups, _ = init_generation(  # the Megatron engine owns its groups: the default group only
                member._store(), member.generation, member.logical, e.grid, e.backend,
                e.cfg.resilience.collective_timeout_s, device_id=e.device if e.backend == "nccl" else None,
                sub_groups=False, prefix=store_prefix(member.generation, step))
        member.aborter = generation_abort(e.backend, member.generation, cap.sockets, member.groups)
        member._construct_engine(state_follows=True)
        opt, par, envelope = split_snapshot(unpacked)
        d = save_snapshot(member.engine, opt, par, envelope, root)
    except Exception as exc:  # noqa: BLE001 -- reported; phoenix's own final checkpoint is unaffected
        return {"megatron_error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"}
    finally:
        member.release_groups()  # Member.release_groups: the aborter's abort, destroy_process_group, the engine's
    write_s = round(time.perf_counter() - t0, 4)
    log_event(e.run_dir, member.logical, {"event": "save_megatron", "step": int(step), "t_start": t_start,
                                          "t_end": time.time(), "final": True})
    return {"megatron": {"dir": str(root), "iteration": int(step), "write_s": write_s,
                         "folder": Path(d).name}}
