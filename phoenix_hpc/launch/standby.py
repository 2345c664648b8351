"""A standby slot: what it does before it waits (a *warm* spare, docs/design.md section 7) and its wait for
a recovery plan that names it."""

from __future__ import annotations

import time

from phoenix_hpc.launch.signals import StopRequested
from phoenix_hpc.recovery.plan import RecoveryPlan


def import_runtime(cfg) -> None:
    """Import the code a slot runs: torch.distributed, the dataset reader (megatron-core's, with ``data.path``;
    a ``data.blend`` is also built here, once per process, before any process group exists),
    the engine of ``cfg.engine`` (a user's engine class too; the torch engine or one derived from it: also
    what torch loads on the first construction of a model on the meta device,
    :func:`~phoenix_hpc.engines.torch_gpt.load_meta_kernels`; the Megatron engine or one derived from it: the
    megatron-core modules it builds with, :func:`~phoenix_hpc.engines.megatron_engine.import_megatron_core`),
    the protection runtime and the recovery driver. Seconds on a busy node (megatron-core's import alone
    brings in about 2,900 modules). On a GPU node, call it after ``torch.cuda.set_device``: a library may
    touch CUDA when it is imported. A user's class that cannot be imported is left to the engine's
    construction to report (the rank's preflight has refused it already)."""
    import torch.distributed  # noqa: F401

    from phoenix_hpc.engines import factory
    from phoenix_hpc.errors import ConfigError
    from phoenix_hpc.launch import groups, loop  # noqa: F401
    from phoenix_hpc.runtime import protector  # noqa: F401

    if cfg.data.prefixes:
        from phoenix_hpc.data.indexed import megatron_indexed_module

        megatron_indexed_module()
    if cfg.data.blend is not None:  # megatron-core's builder synchronises over the default group if one exists:
        from phoenix_hpc.data.blend import open_blend  # build it before any (phoenix_hpc/data/blend.py)

        open_blend(cfg)
    try:
        torch_like, megatron_like = factory.engine_family(cfg)
    except ConfigError:
        return
    if torch_like:
        from phoenix_hpc.engines.torch_gpt import load_meta_kernels

        load_meta_kernels()
    if megatron_like:
        from phoenix_hpc.engines.megatron_engine import import_megatron_core

        import_megatron_core()


def warm_up(cfg) -> None:
    """What a standby slot does before it waits (a *warm* spare, docs/design.md section 7): import what it
    will run (:func:`import_runtime`) and open the dataset once, so that a recovery does not pay for it."""
    from phoenix_hpc.data.indexed import open_indexed_dataset

    import_runtime(cfg)
    for prefix in cfg.data.prefixes:
        open_indexed_dataset(prefix)


def wait_for_join(client, wait_s: float | None = None) -> RecoveryPlan | None:
    """Standby: wait for a ``recover`` instruction naming this slot in its joins. Returns the plan, or None
    when the coordinator says ``stop`` (or, with ``wait_s``, nothing came in time). Waits only inside
    ``client.wait_instruction`` (on the doorbell), so a plan is taken as soon as it is rung, never after a
    sleep of its own: the spare's start is on the hot swap's critical path.

    Raises:
        StopRequested: the ``stop`` says this slot was declared dead (``job_state`` fenced: a spare whose
            heartbeats stopped while its process lived): the slot exits with an error line naming why, as a
            fenced member does (launch/rank.py), not as a spare the job no longer needs."""
    deadline = None if wait_s is None else time.monotonic() + wait_s
    while True:
        left = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
        msg = client.wait_instruction(("recover",), left)
        if msg is not None:
            if msg["type"] == "stop":
                if msg.get("job_state") == "fenced":
                    raise StopRequested(msg)
                return None
            plan = RecoveryPlan.from_json(msg.get("plan") or {})
            if any(j.world_rank == client.world_rank for j in plan.joins):
                return plan
        if deadline is not None and time.monotonic() >= deadline:
            return None
