"""The scheduling priority of the runtime's background threads (``resilience.thread_nice``, docs/design.md
section 4, Cost).

On Linux the nice value belongs to each thread (setpriority(2), "NOTES": ``PRIO_PROCESS`` with a thread ID
sets that thread only). The D2H copy/checksum thread and the H2H thread call :func:`lower_thread_priority`
when they start (a GPU rank's checksum threads are set to the same value by their pool,
:class:`phoenix_hpc.runtime.checksum_pool.ChecksumPool`), so that on cores they share with the training thread the scheduler gives them what the
training thread leaves (CFS weights, kernel ``sched_prio_to_weight``: nice 0 weighs 1024, nice 10 110,
nice 19 15). Raising one's own nice value needs no privilege; lowering it needs ``CAP_SYS_NICE``, so only
increments from 0 to 19 are accepted.
"""

from __future__ import annotations

import os
import threading

#: The allowed increments, inclusive; 19 is the lowest priority Linux has. The job config's field
#: (``config/schema.py``, ``resilience.thread_nice``) declares the same bounds (a unit test ties them).
NICE_MIN, NICE_MAX = 0, 19


def thread_nice_problem(value: object) -> str | None:
    """Why ``value`` is not an allowed ``resilience.thread_nice`` (an ``int`` from :data:`NICE_MIN` to
    :data:`NICE_MAX`; a ``bool`` is not one), naming the field, the value and what is allowed; None when
    it is allowed. Pure."""
    if isinstance(value, bool) or not isinstance(value, int) or not NICE_MIN <= value <= NICE_MAX:
        return (f"resilience.thread_nice: value {value!r} is not allowed (allowed: an integer from {NICE_MIN} "
                f"to {NICE_MAX})")
    return None


def lower_thread_priority(increment: int) -> int:
    """Make the calling thread ``increment`` nicer than it is (``setpriority(PRIO_PROCESS, tid, nice)``),
    capped at :data:`NICE_MAX`; returns the thread's nice value afterwards. 0 leaves the thread as it is.

    Raises ValueError for an increment :func:`thread_nice_problem` refuses (a negative one would need
    ``CAP_SYS_NICE``)."""
    problem = thread_nice_problem(increment)
    if problem is not None:
        raise ValueError(problem)
    tid = threading.get_native_id()
    now = os.getpriority(os.PRIO_PROCESS, tid)
    if increment == 0:
        return now
    new = min(NICE_MAX, now + increment)
    os.setpriority(os.PRIO_PROCESS, tid, new)
    return new
