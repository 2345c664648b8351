"""runtime/thread_priority: per-thread nice increments, and one bound shared with the job config."""

from __future__ import annotations

import os
import threading

import pytest

from phoenix_hpc.runtime.thread_priority import NICE_MAX, NICE_MIN, lower_thread_priority, thread_nice_problem


def test_a_background_thread_lowers_its_own_priority_only():
    main_before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen = {}

    def worker(inc, key):
        tid = threading.get_native_id()
        before = os.getpriority(os.PRIO_PROCESS, tid)
        seen[key] = (before, lower_thread_priority(inc), os.getpriority(os.PRIO_PROCESS, tid))

    for inc, key in ((3, "three"), (0, "zero"), (19, "capped"), (19, "again")):
        t = threading.Thread(target=worker, args=(inc, key))
        t.start()
        t.join()
    b = seen["three"][0]
    assert seen["three"][1:] == (min(19, b + 3), min(19, b + 3))
    assert seen["zero"][1:] == (seen["zero"][0], seen["zero"][0])
    assert seen["capped"][1:] == (19, 19) and seen["again"][1:] == (19, 19)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == main_before  # the caller's thread only


@pytest.mark.parametrize("bad", [-1, 20, True, "5", 1.0, None])
def test_an_increment_outside_0_to_19_is_refused_naming_the_field(bad):
    assert thread_nice_problem(bad) == (f"resilience.thread_nice: value {bad!r} is not allowed "
                                        "(allowed: an integer from 0 to 19)")
    with pytest.raises(ValueError, match="resilience.thread_nice"):
        lower_thread_priority(bad)


def test_the_job_configs_bounds_are_the_runtimes():
    from phoenix_hpc.config.schema import ResilienceConfig

    meta = ResilienceConfig.model_fields["thread_nice"].metadata
    ge = next(m.ge for m in meta if hasattr(m, "ge"))
    le = next(m.le for m in meta if hasattr(m, "le"))
    assert (ge, le) == (NICE_MIN, NICE_MAX) and thread_nice_problem(NICE_MIN) is None \
        and thread_nice_problem(NICE_MAX) is None
