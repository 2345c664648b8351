"""The adaptive protection interval (docs/design.md section 4, "Protection interval"): a pure decision.

When a snapshot's protection (D2H + checksums + H2H + acks) cannot finish inside the compute window of the
step that follows it, training waits before ``optimizer.step()`` (the *exposed wait*). The runtime then
protects only every m-th step: a snapshot of ``S(t)`` is started before the forward pass of step ``t + 1``;
its local copy must still be done before that step's ``optimizer_step`` (it reads the live state), but its
H2H may take the compute windows of steps ``t + 1 .. t + m`` and is committed before the optimizer step of
step ``t + m``; the next snapshot is of ``S(t + m)``. Lost work on a fault is then at most ``2m - 1``
finished steps plus the partial current step (:func:`lost_steps_at_most`): just before ``S(t + m)`` is
committed, in step ``t + 2m``, the recoverable step is still ``t``. With m = 1 that is the per-step bound, 1.
While the interval changes from m to m' the bound is ``m + m' - 1``; in any case ``2 x cap - 1``.

:func:`choose_interval` is what one rank proposes from its own measurements. The ranks agree on the
largest proposal through the commit fence (an MPI all-reduce every rank already makes at every commit,
:mod:`phoenix_hpc.runtime.h2h`): the interval of a snapshot is the maximum of the proposals made at the
commit two snapshots before it, a result every rank has (it waits for that fence, long completed), so
every rank protects the same steps and the fences stay paired.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

#: the exposed wait, as a fraction of the step time, above which protection "does not fit"
EXPOSED_THRESHOLD = 0.05
#: how much longer than the measured protection time the chosen interval's compute windows must be
HEADROOM = 1.25
#: how many of the newest commits a proposal looks at (median, so one slow step does not change m)
SAMPLES = 3


def lost_steps_at_most(m: int) -> int:
    """Finished steps a fault can lose with protection interval ``m`` (>= 1): ``2m - 1`` (see module doc)."""
    return 2 * int(m) - 1


@dataclass(frozen=True)
class Sample:
    """One committed snapshot, seconds: ``window_s`` the compute time per step of its interval (step time
    without the exposed waits), ``protect_s`` the protection's background time (D2H + checksums, then the
    H2H from first post to last ack), ``exposed_s`` the exposed wait per step of its interval."""

    window_s: float
    protect_s: float
    exposed_s: float


def choose_interval(current: int, samples: Sequence[Sample], cap: int, threshold: float = EXPOSED_THRESHOLD,
                    headroom: float = HEADROOM) -> int:
    """The protection interval m a rank proposes (pure).

    Args:
        current: the interval the samples were measured with (>= 1).
        samples: the newest committed snapshots (the median of each field is used); none: keep ``current``.
        cap: the largest interval allowed (``resilience.protect_every_max``, >= 1).
        threshold: exposed wait / step time above which the protection does not fit.
        headroom: the chosen interval's windows must cover ``headroom`` x the protection time.

    Returns:
        ``needed = ceil(headroom * protect / window)`` clamped to ``[1, cap]``, where the exposed wait is
        above the threshold: at least ``current + 1`` (it does not fit, grow); where it fits and ``needed`` is
        smaller than ``current``: ``needed`` (the window grew, shrink, back to 1 when one window holds it);
        otherwise ``current``.

    Raises:
        ValueError: ``current`` or ``cap`` below 1.
    """
    if current < 1 or cap < 1:
        raise ValueError(f"current ({current}) and cap ({cap}) must be >= 1")
    if not samples:
        return min(current, cap)
    window = statistics.median(s.window_s for s in samples)
    protect = statistics.median(s.protect_s for s in samples)
    exposed = statistics.median(s.exposed_s for s in samples)
    needed = 1 if window <= 0 and protect <= 0 else (
        cap if window <= 0 else max(1, math.ceil(headroom * protect / window)))
    step = window + exposed
    if step > 0 and exposed / step > threshold:
        return max(1, min(cap, max(needed, current + 1)))
    if needed < current:
        return max(1, min(cap, needed))
    return max(1, min(cap, current))
