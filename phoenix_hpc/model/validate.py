"""Input checks shared by the cost model, the simulator and the scaling fit.

Each check raises :class:`phoenix_hpc.errors.ModelError` with a message that names the parameter (and the
CLI option spelled from it: ``mttf_s`` -> ``--mttf-s``), the offending value and the allowed range. The CLI
options of ``phoenix model`` carry the same names as the library parameters, so the message is right for
both callers.
"""

from __future__ import annotations

import math
import sys

from phoenix_hpc.errors import ModelError


def option_name(name: str) -> str:
    """``mttf_s`` -> ``--mttf-s``: the CLI option that carries parameter ``name``."""
    return "--" + name.replace("_", "-")


def fail(name: str, value: object, allowed: str) -> ModelError:
    """Build the error for parameter ``name`` holding ``value`` when only ``allowed`` is accepted."""
    return ModelError(f"{option_name(name)}: {value!r} is not allowed; {allowed}")


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail(name, value, "expected a number")
    v = float(value)
    if math.isnan(v) or math.isinf(v):
        raise fail(name, value, "expected a finite number")
    return v


def finite_result(what: str, inputs: dict[str, object], *results: float) -> None:
    """Raise ModelError naming every input (as its option) when a result computed from finite inputs
    overflowed to infinity (e.g. ``--step-s 1e307`` times a replay of many steps): no single input is out of
    its range, so the message names them all and what overflowed."""
    if all(math.isfinite(r) for r in results):
        return
    given = ", ".join(f"{option_name(k)} {val!r}" for k, val in inputs.items())
    raise ModelError(f"{given}: the {what} overflows to infinity; use values whose products stay below "
                     f"{sys.float_info.max:.3g}")


def positive(name: str, value: object) -> float:
    """Return ``value`` as float if it is a finite number > 0, else raise ModelError."""
    v = _number(name, value)
    if v <= 0:
        raise fail(name, value, "must be > 0")
    return v


def non_negative(name: str, value: object) -> float:
    """Return ``value`` as float if it is a finite number >= 0, else raise ModelError."""
    v = _number(name, value)
    if v < 0:
        raise fail(name, value, "must be >= 0")
    return v


def probability(name: str, value: object) -> float:
    """Return ``value`` as float if it lies in [0, 1], else raise ModelError."""
    v = _number(name, value)
    if not 0.0 <= v <= 1.0:
        raise fail(name, value, "must be a probability in [0, 1]")
    return v


def fraction_below_one(name: str, value: object) -> float:
    """Return ``value`` as float if it lies in [0, 1), else raise ModelError (e.g. phi, Eq. 5)."""
    v = _number(name, value)
    if not 0.0 <= v < 1.0:
        raise fail(name, value, "must be in [0, 1)")
    return v


def integer_at_least(name: str, value: object, minimum: int) -> int:
    """Return ``value`` as int if it is an integer >= ``minimum``, else raise ModelError."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise fail(name, value, f"expected an integer >= {minimum}")
    if value < minimum:
        raise fail(name, value, f"must be an integer >= {minimum}")
    return int(value)


def ratio_at_least_one(name: str, value: object) -> float:
    """Return ``value`` as float if it is a finite number >= 1 (a time ratio such as protected over unprotected
    step time), else raise ModelError. A measured ratio below 1 is noise; the caller passes 1 for it."""
    v = _number(name, value)
    if v < 1.0:
        raise fail(name, value, "must be a number >= 1 (step time with protection over without; a measured ratio "
                                "below 1 is noise: give 1)")
    return v


def protection_interval(name: str, value: object, ckpt_every: int) -> int:
    """Return ``value`` as int if it is a protection interval m from 1 to ``ckpt_every`` (the checkpoint
    interval bounds it, as it bounds ``resilience.protect_every_max``), else raise ModelError."""
    m = integer_at_least(name, value, 1)
    if m > ckpt_every:
        raise fail(name, value, f"must be an integer from 1 to --ckpt-every ({ckpt_every}), as "
                                "resilience.protect_every_max is")
    return m


def open_unit(name: str, value: object) -> float:
    """Return ``value`` as float if it lies strictly between 0 and 1, else raise ModelError (e.g. a target
    probability: 0 asks for nothing, 1 for infinitely many spares)."""
    v = _number(name, value)
    if not 0.0 < v < 1.0:
        raise fail(name, value, "must be strictly between 0 and 1")
    return v
