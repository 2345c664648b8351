"""NCCL: a process group created, aborted and created again (the abort path of a GPU recovery), with times.

Item ``nccl.create_abort_create``: on the default NCCL group of world size 1, a new group is created and
its communicator brought up by a first all-reduce; the group is aborted (:func:`abort_function`); a second
group is created and a collective on it must run, and on the default group too (:func:`collective_ran`: an
all-gather into a separate output, which a collective that did nothing leaves unchanged; at world size 1 an
all-reduce sum equals its input whether or not it ran).
Times in ms: group creation, first collective (communicator set-up), abort, re-creation, its first
collective. Every group is made under the NCCL error-handling variables of a protected job
(``nccl_env``, :func:`phoenix_hpc.gpucheck.common.job_nccl_env`); diagnoses: the abort by each API
(``abort_ms_by_api``) and with ``TORCH_NCCL_ENABLE_MONITORING=1`` instead (``abort_ms_torch_monitoring``).

Item ``nccl.generation_abort``: the recovery's own sequence (:func:`phoenix_hpc.launch.abort.abort_nccl_groups`,
which aborts every registered communicator, the default group's included, and never destroys one), then
``destroy_process_group`` where torch still has a default group (as
:meth:`phoenix_hpc.launch.execute.Member.release_groups` does: ``_abort_process_group()`` unregisters every
group on torch 2.11, so ``is_initialized()`` is false after it), and a new default group for the next
generation, on which a collective must run (:func:`collective_ran`). Times in ms: the abort, the destroy, the new
generation's set-up and first collective; ``unregistered_by_abort``: whether the abort left no default group.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from phoenix_hpc.gpucheck import common
from phoenix_hpc.gpucheck.report import item

NAME = "nccl"
TIMEOUT_S = 45
ITEMS = ("nccl.create_abort_create", "nccl.generation_abort")
LIMIT = ("world size 1: the communicator has no peer, so no network transport is set up and the abort "
         "releases no rank blocked on a dead peer; the times are a lower bound of a multi-node group's")


def abort_function():
    """``(abort(group), name)``: the one-group NCCL abort the recovery uses
    (:func:`phoenix_hpc.launch.abort.abort_group` with :func:`~phoenix_hpc.launch.abort.choose_nccl_abort`'s
    choice for the installed torch)."""
    import torch.distributed.distributed_c10d as c10d

    from phoenix_hpc.launch.abort import abort_group, choose_nccl_abort

    how = choose_nccl_abort(c10d)
    return (lambda group: abort_group(group, how, c10d)), how


def plan(work: Path) -> dict:
    """Dry run: the abort function torch offers (no CUDA call)."""
    return {"abort": abort_function()[1]}


def collective_ran(group=None, device: str = "cuda") -> bool:
    """Whether a collective on ``group`` really ran: an all-gather of a known tensor into a separate
    output filled with -1. At world size 1 an all-reduce sum equals its input whether or not it ran; an
    all-gather that did nothing leaves the -1s (any backend; tested on gloo)."""
    import torch
    import torch.distributed as dist

    x = torch.arange(1, 9, dtype=torch.float32, device=device)
    out = torch.full_like(x, -1.0)
    dist.all_gather([out], x, group=group)
    if device != "cpu":
        torch.cuda.synchronize()
    return bool(torch.equal(out, x))


def ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1e3, 2)


def run(work: Path) -> list[dict]:
    import torch
    import torch.distributed as dist

    common.init_nccl_world()
    abort, how = abort_function()
    nums: dict = {"abort_api": how, "nccl_env": common.job_nccl_env()}

    def bring_up(key: str):
        t0 = time.perf_counter()
        g = dist.new_group([0], backend="nccl")
        nums[f"{key}_create_ms"] = ms(t0)
        x = torch.ones(1 << 20, device="cuda")
        t0 = time.perf_counter()
        dist.all_reduce(x, group=g)
        torch.cuda.synchronize()
        nums[f"{key}_first_allreduce_ms"] = ms(t0)
        return g, x

    g1, _ = bring_up("first")
    t0 = time.perf_counter()
    abort(g1)
    torch.cuda.synchronize()
    nums["abort_ms"] = ms(t0)
    del g1
    g2, x = bring_up("again")
    ok_again = collective_ran(g2)
    ok_world = collective_ran(None)
    why = [] if ok_again else ["the re-created group's all-gather did not run (its output kept its fill)"]
    why += [] if ok_world else ["the default group's all-gather did not run after the abort"]
    nums["abort_ms_by_api"] = abort_times_by_api(bring_up)  # a diagnosis: which call aborts fastest
    nums["abort_ms_torch_monitoring"] = abort_time_with_monitoring(bring_up, abort)  # and with torch's default
    first = item(ITEMS[0], "failed", "; ".join(why), nums, LIMIT) if why else item(ITEMS[0], "passed", numbers=nums, limit=LIMIT)
    return [first, generation_abort()]


def abort_times_by_api(bring_up) -> dict[str, float | str]:
    """Milliseconds to abort one freshly used group with each of the three one-group aborts
    (:func:`phoenix_hpc.launch.abort.abort_group`: ``abort_process_group``, ``group_abort``,
    ``backend_abort``) that the installed torch offers, or the error it raised (a diagnosis, not a verdict:
    the recovery's abort took about a second per group on an H200, which one of them may avoid)."""
    import torch
    import torch.distributed.distributed_c10d as c10d

    from phoenix_hpc.launch.abort import abort_group

    out: dict[str, float | str] = {}
    for how in ("abort_process_group", "group_abort", "backend_abort"):
        try:
            g, _ = bring_up(f"diag_{how}")
            t0 = time.perf_counter()
            abort_group(g, how, c10d)
            torch.cuda.synchronize()
            out[how] = ms(t0)
        except Exception as e:  # noqa: BLE001 -- recorded: this torch lacks it, or it failed
            out[how] = f"{type(e).__name__}: {str(e)[:120]}"
    return out


def abort_time_with_monitoring(bring_up, abort) -> float | str:
    """Milliseconds to abort one freshly used group created with torch's default
    ``TORCH_NCCL_ENABLE_MONITORING=1`` (whether torch's heartbeat monitor may end the process), which a
    protected job sets to 0 (:mod:`phoenix_hpc.launch.nccl_env`), or the error raised; the variable is put
    back afterwards (a diagnosis: the check's earlier runs kept torch's default and measured about a second
    per abort)."""
    import torch

    from phoenix_hpc.launch.nccl_env import ENABLE_MONITORING

    before = os.environ.get(ENABLE_MONITORING)
    os.environ[ENABLE_MONITORING] = "1"
    try:
        g, _ = bring_up("diag_monitoring")
        t0 = time.perf_counter()
        abort(g)
        torch.cuda.synchronize()
        return ms(t0)
    except Exception as e:  # noqa: BLE001 -- recorded
        return f"{type(e).__name__}: {str(e)[:120]}"
    finally:
        if before is None:
            os.environ.pop(ENABLE_MONITORING, None)
        else:
            os.environ[ENABLE_MONITORING] = before


def generation_abort() -> dict:
    """Item ``nccl.generation_abort`` (see the module doc); torch.distributed must be initialised."""
    import torch
    import torch.distributed as dist

    from phoenix_hpc.launch.abort import abort_nccl_groups

    nums: dict = {}
    t0 = time.perf_counter()
    nums["abort_api"] = abort_nccl_groups()
    nums["abort_ms"] = ms(t0)
    nums["unregistered_by_abort"] = not dist.is_initialized()
    t0 = time.perf_counter()
    if dist.is_initialized():  # the recovery's own guard (Member.release_groups, Member._reconfigure)
        dist.destroy_process_group()
    nums["destroy_ms"] = ms(t0)
    t0 = time.perf_counter()
    common.init_nccl_world()
    ran = collective_ran(None)
    nums["next_generation_ms"] = ms(t0)
    if ran:
        return item(ITEMS[1], "passed", numbers=nums, limit=LIMIT)
    return item(ITEMS[1], "failed", "the next generation's all-gather did not run (its output kept its fill)", nums,
                LIMIT)
