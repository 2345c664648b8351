"""The test-only environment variables (``PHOENIX_TEST_*``): one table of every one, and their strict reading.

They exist so that an end-to-end test on the local cluster can open a window that otherwise lasts
milliseconds, or make a path slow; a production job must not carry any of them. Slurm's ``sbatch`` passes
the submitting shell's whole environment into the job by default (``--export=ALL``, sbatch(1)), so one left
set in a shell reaches every rank and the coordinator of a real job. Hence, for every variable of
:data:`VARIABLES`:

- it is read strictly: a value that is not allowed, or an unknown ``PHOENIX_TEST_*`` name (a typo would
  otherwise act as unset), is refused with a message naming the variable, the value and what is allowed;
  ``phoenix submit`` refuses before sbatch (exit 2), the coordinator before it is ready (exit 2, so the batch
  script starts no srun step), a rank before it trains;
- when set, ``phoenix submit`` warns, the coordinator journals ``test_env`` {variables: {NAME: VALUE}} at its
  start, and ``phoenix status`` shows it as a warning.

An empty value counts as unset (as ``FOO= cmd`` in a shell means "no value").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

PREFIX = "PHOENIX_TEST_"
HOLD_ENV = "PHOENIX_TEST_HOLD_AFTER"
REPLICATION_DELAY_ENV = "PHOENIX_TEST_REPLICATION_DELAY_S"
HOLD_EVENTS = ("recovery_start",)
HOLD_MAX_S = 3600.0
REPLICATION_DELAY_MAX_S = 60.0


class TestEnvError(ValueError):
    """A ``PHOENIX_TEST_*`` variable with a value that is not allowed, or an unknown one."""

    __test__ = False  # not a pytest test class


def _seconds(name: str, value: str, text: str, low_open: bool, high: float) -> float:
    """``text`` as seconds in ``(0, high]`` (``low_open``) or ``[0, high]``; TestEnvError otherwise."""
    try:
        s = float(text)
    except ValueError:
        s = math.nan
    ok = (0 < s if low_open else 0 <= s) and s <= high  # NaN and inf fail both comparisons
    if not ok:
        rng = f"(0, {high:g}]" if low_open else f"[0, {high:g}]"
        raise TestEnvError(f"{name}={value!r}: seconds must be a finite number in {rng}, got {text!r}")
    return s


def parse_hold(value: str | None) -> tuple[str, float] | None:
    """:data:`HOLD_ENV`: ``"EVENT:SECONDS"`` -> ``(event, seconds)``; None or ``""`` -> None. Pure.

    Raises:
        TestEnvError: not two parts, an event not in :data:`HOLD_EVENTS`, or seconds not in (0, 3600].
    """
    if not value:
        return None
    event, sep, secs = value.partition(":")
    if not sep or event not in HOLD_EVENTS:
        raise TestEnvError(f"{HOLD_ENV}={value!r}: expected EVENT:SECONDS with EVENT one of {list(HOLD_EVENTS)}")
    return event, _seconds(HOLD_ENV, value, secs, True, HOLD_MAX_S)


def parse_replication_delay(value: str | None) -> float:
    """:data:`REPLICATION_DELAY_ENV`: seconds in [0, 60] (0, None or ``""``: no delay). Pure.

    Raises:
        TestEnvError: not a number, negative, NaN, infinite or above 60.
    """
    if not value:
        return 0.0
    return _seconds(REPLICATION_DELAY_ENV, value, value, False, REPLICATION_DELAY_MAX_S)


@dataclass(frozen=True)
class TestVariable:
    """One test-only variable: its ``name``, what values are ``allowed`` (words), what it does
    (``effect``), who reads it (``reader``), and ``parse`` (value -> the setting; raises TestEnvError)."""

    __test__ = False  # not a pytest test class

    name: str
    allowed: str
    effect: str
    reader: str
    parse: Callable[[str | None], Any]


VARIABLES: dict[str, TestVariable] = {v.name: v for v in (
    TestVariable(HOLD_ENV, "recovery_start:SECONDS, SECONDS in (0, 3600]",
                 "the first coordinator of a job sleeps SECONDS once, right after it journalled recovery_start "
                 "and rang the survivors' quiesce (journal test_hold)",
                 "phoenix_hpc/control/coordinator.py", parse_hold),
    TestVariable(REPLICATION_DELAY_ENV, "SECONDS in [0, 60] (0: no delay)",
                 "every rank's copy thread waits SECONDS after each snapshot's local copy before handing its "
                 "replica to the H2H engine (a slow replication path)",
                 "phoenix_hpc/runtime/protector.py", parse_replication_delay),
)}


def active_test_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The ``PHOENIX_TEST_*`` variables of ``environ`` that are set and act, as ``{name: value}``, after
    checking every one of them. Pure. A delay of 0 does not act and is left out.

    Raises:
        TestEnvError: an unknown ``PHOENIX_TEST_*`` name (with a value), or a value its parser refuses; the
            first one in name order.
    """
    out: dict[str, str] = {}
    for name in sorted(k for k in environ if k.startswith(PREFIX)):
        value = environ[name]
        if not value:
            continue
        var = VARIABLES.get(name)
        if var is None:
            raise TestEnvError(f"{name}={value!r}: not a test-only variable of phoenix_hpc; the known ones are "
                               f"{sorted(VARIABLES)} (unset it)")
        setting = var.parse(value)
        if setting:
            out[name] = value
    return out


def describe(active: Mapping[str, str]) -> str:
    """One line naming each active variable with its value and effect, for a warning. Pure."""
    return "; ".join(f"{n}={v!r} ({VARIABLES[n].effect})" if n in VARIABLES else f"{n}={v!r}"
                     for n, v in active.items())
