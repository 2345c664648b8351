"""A member's side of a planned end: the final checkpoint from its host snapshot (protocol in
:mod:`phoenix_hpc.control.ending`).

Called when the coordinator's ``stop`` carries ``checkpoint: true``. The member frees its torch groups at
once (a peer blocked in a collective with it fails at once instead of waiting out the collective timeout,
and then receives the same ``stop``), closes its runtime protector without waiting on peers (the host
buffers stay readable), reports the steps of its verified local snapshots, writes the one step the
coordinator picks (file I/O only, :func:`phoenix_hpc.recovery.checkpoint.write_snapshot_shard`), reports
it, and returns the coordinator's final ``stop``. With ``resilience.checkpoint.save_megatron`` it also writes
that step in Megatron-LM's layout before reporting (:mod:`phoenix_hpc.launch.final_megatron`; the report
carries ``megatron`` {dir, folder, iteration, write_s} or ``megatron_error``).
"""

from __future__ import annotations

import time
from typing import Any


def final_checkpoint(member, stop_msg: dict[str, Any]) -> dict[str, Any]:
    """Run the member's part of a planned end. Returns the ``stop`` that ends the job (or, when the
    coordinator is silent for the member's instruction timeout ``member.wait_s``, counted from the
    ``stopping`` report and again from the ``shard_written`` report, ``stop_msg`` itself).

    Never raises for a failed write: the error is reported (``shard_written`` {error}) and the
    checkpoint stays incomplete."""
    from phoenix_hpc.recovery.ckpt_files import checkpoint_root
    from phoenix_hpc.recovery.checkpoint import write_snapshot_shard

    e = member.env
    client = e.client
    member.release_groups()
    prot, member.protector = member.protector, None
    steps: list[int] = []
    if prot is not None:
        prot.close(abandon=True)
        steps = list(prot.copy_steps()[0])
    client.report_stopping(member.generation, steps)
    deadline = time.monotonic() + member.wait_s
    while True:
        msg = client.wait_instruction(("write_checkpoint",), max(0.0, deadline - time.monotonic()))
        if msg is None:
            return stop_msg
        if msg["type"] == "stop":
            return msg
        step = int(msg["step"])
        t0 = time.perf_counter()
        try:
            u = prot.local_snapshot(step=step)
            info = write_snapshot_shard(checkpoint_root(e.cfg, e.run_dir), step, member.coord, u.tensors, u.envelope)
            info["write_s"] = round(time.perf_counter() - t0, 4)
        except Exception as exc:  # noqa: BLE001 -- reported; the checkpoint stays incomplete
            info = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"}
        if "error" not in info and e.cfg.resilience.checkpoint.save_megatron:
            from phoenix_hpc.launch.final_megatron import export

            info.update(export(member, u, step))
        client.report_shard_written(step, info)
        deadline = time.monotonic() + member.wait_s  # the coordinator's answer, counted from the report
        if member.logical == 0:
            e.log(f"[phoenix] rank 0: shard of the final checkpoint of step {step} "
                  f"{'written in ' + str(info['write_s']) + ' s' if 'error' not in info else 'failed: ' + info['error']}")
            if "megatron" in info or "megatron_error" in info:
                e.log(f"[phoenix] rank 0: final checkpoint of step {step} in Megatron-LM's layout: "
                      + megatron_note(info))


def megatron_note(info: dict[str, Any]) -> str:
    """The log's words for the Megatron-LM export in a ``shard_written`` report (:mod:`.final_megatron`). Pure."""
    if "megatron_error" in info:
        return f"failed: {info['megatron_error']}"
    m = info["megatron"]
    if "skipped" in m:
        return f"{m['dir']} already holds iteration {m['iteration']} ({m['skipped']})"
    return f"iteration {m['iteration']} written to {m['dir']} in {m['write_s']} s"
