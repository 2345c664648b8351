"""Fault injection in the unprotected training loop: ``resilience.mode: checkpoint-restart`` under the batch
script, where a slot has a coordinator client but no :class:`~phoenix_hpc.launch.execute.Member`.

``phoenix inject-fault`` and ``phoenix drill`` then work on the baseline as they do on a protected job, so
the in-job checkpoint-restart can be drilled fault for fault against the hot swap
(:mod:`phoenix_hpc.drills.in_job`). The hook does what the member does at the phases of
:func:`phoenix_hpc.launch.loop.train`: at the start of every iteration it pops the slot's instructions (an
``inject`` is armed or refused against the step it is about to start, :meth:`~phoenix_hpc.control.client.
CoordinatorClient.poll_if_rung`; any other instruction stays queued in ``client.instructions``, in order) and marks
the iteration started; at every phase it fires the injection due there
(:class:`~phoenix_hpc.faults.trigger.FaultTrigger`, landing record first). The phases of this loop are
``forward_backward``, ``reduce_gradients`` and ``optimizer_step``: the in-memory protection's phases (D2H,
H2H, its commit wait) do not exist here, so an injection armed for them never fires and is reported missed
at the end of the job.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable


def injection_hook(client, run_dir: Path, world_rank: int, last_step: int) -> Callable[[int, str], None]:
    """The ``phase_hook`` for :func:`phoenix_hpc.launch.loop.train` of slot ``world_rank``.

    Raises (from the hook):
        ControlError: the coordinator cannot be reached when the instructions are popped (as in the member).
        InjectedCommError, InjectedGPUError, ...: an injected fault of a kind that raises (see
            :meth:`phoenix_hpc.faults.trigger.FaultTrigger.check`); the other kinds do not return.
    """
    from phoenix_hpc.faults.trigger import FaultTrigger
    from phoenix_hpc.launch.execute import fired_notice

    client.last_step = int(last_step)  # an injection past the last step is refused at once
    trigger = FaultTrigger(client.injections, notify=fired_notice(client, run_dir, world_rank),
                           on_link_down=[client.stop_heartbeat], lock=client.injections_lock)

    def hook(step: int, phase: str) -> None:
        if phase == "forward_backward":
            # arms or refuses injections for this step and later; the store is read only when the coordinator
            # rang this slot's doorbell (every step without a liveness connection), as the member does
            client.instructions.extend(client.poll_if_rung())
            client.started_step = step  # from now on, injections for this step come too late
        trigger.check(step, phase)

    return hook
