"""torch's NCCL error-handling environment for a protected job (pure decision; docs/design.md section 12).

torch's ``ProcessGroupNCCL`` watchdog reacts to a failed or timed-out collective according to
``TORCH_NCCL_ASYNC_ERROR_HANDLING`` (torch docs, "PYTORCH ProcessGroupNCCL Environment Variables", same
meaning in torch 2.6 to 2.13): ``0`` no handling; ``1`` abort the communicator and tear down the process;
``2`` only abort the communicator; ``3`` tear down the process without aborting (the default). With ``1`` or
``3`` a survivor of a peer's death is killed by torch, and the hot swap it was meant to take part in
becomes a second fault. PHOENIX needs the process to live and the collective to fail:

- ``TORCH_NCCL_ASYNC_ERROR_HANDLING=2`` when unset. torch's watchdog then aborts a communicator whose
  collective failed or exceeded ``resilience.collective_timeout_s``, the training thread's wait raises,
  and the rank reports the fault; the quiesce watchdog (:mod:`.quiesce_watch`) aborts sooner when the
  coordinator knows of the fault first. ``0`` is accepted too (then only PHOENIX aborts: torch's note on
  ``_abort_process_group`` recommends it; a collective whose peer died then ends only on the coordinator's
  quiesce). ``1`` and ``3`` are refused.
- ``TORCH_NCCL_ENABLE_MONITORING=0`` when unset: torch's heartbeat monitor kills the process when its own
  watchdog thread is stuck for ``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC`` (e.g. in an abort); the coordinator
  fences such a rank instead (it does not answer the quiesce in time) and replaces it. A value set by the
  user is kept.

The legacy name ``NCCL_ASYNC_ERROR_HANDLING`` is read by torch only when the ``TORCH_`` one is unset; the
``TORCH_`` one is always set here, so it decides.
"""

from __future__ import annotations

from collections.abc import Mapping

ASYNC_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
ENABLE_MONITORING = "TORCH_NCCL_ENABLE_MONITORING"
ALLOWED_ASYNC = ("0", "2")
MEANING = {"0": "no handling", "1": "abort the communicator and tear down the process",
           "2": "abort the communicator only", "3": "tear down the process without aborting"}


def nccl_error_env(env: Mapping[str, str], backend: str, protected: bool) -> tuple[dict[str, str], list[str]]:
    """The variables to set before the first NCCL process group is created, and the problems.

    Args:
        env: the process environment (e.g. ``os.environ``).
        backend: ``nccl`` or ``gloo`` (nothing to do for gloo).
        protected: whether the PHOENIX protected driver runs (``resilience.enabled`` and ``mode: phoenix``);
            without it torch's defaults are kept.

    Returns:
        ``(updates, problems)``: ``updates`` to apply to the environment (only unset variables), and one
        message per refused value, naming the variable, the value and what is allowed.
    """
    if backend != "nccl" or not protected:
        return {}, []
    updates: dict[str, str] = {}
    problems: list[str] = []
    value = env.get(ASYNC_ERROR_HANDLING)
    if value is None or value.strip() == "":
        updates[ASYNC_ERROR_HANDLING] = "2"
    elif value.strip() not in ALLOWED_ASYNC:
        what = MEANING.get(value.strip(), "not a value torch knows")
        problems.append(
            f"{ASYNC_ERROR_HANDLING}={value!r} ({what}) would let torch end a surviving rank when a peer "
            f"fails; a protected job allows {' or '.join(ALLOWED_ASYNC)} (2: abort the communicator only, "
            "the default PHOENIX sets when the variable is unset)")
    if env.get(ENABLE_MONITORING) in (None, ""):
        updates[ENABLE_MONITORING] = "0"
    return updates, problems
