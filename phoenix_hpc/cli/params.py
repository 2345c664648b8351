"""Click parameter types shared by the ``phoenix`` subcommands.

click's own ``FloatRange(min=...)`` lets ``nan`` (no comparison is true of it) and ``inf`` through; a wait of
``nan`` or ``inf`` seconds then fails deep inside (``socket.settimeout``, ``time.sleep``: a traceback) or never
ends. Every duration option of the CLI uses :class:`Seconds` instead.
"""

from __future__ import annotations

import math

import click

#: Largest duration any option accepts (timeouts, intervals), seconds: 30 days. Longer waits serve no purpose,
#: and far longer ones overflow the platform's time arithmetic (a socket timeout or ``time.sleep`` beyond about
#: 9.2e9 s raises OverflowError).
MAX_SECONDS = 30 * 24 * 3600  # 2592000


class Seconds(click.FloatRange):
    """A duration in seconds: a finite number from ``min`` to ``max`` (default :data:`MAX_SECONDS`), inclusive.

    Errors: a value that is not a number, not finite (``nan``, ``inf``, ``-inf``) or outside the range is
    refused before the command runs, as a usage error (exit code 2) that names the option, the value and what
    is allowed, e.g. ``Invalid value for '--timeout-s': nan is not allowed; expected a finite number of seconds
    from 1 to 2592000``.
    """

    name = "seconds"

    def __init__(self, min: float, max: float = MAX_SECONDS) -> None:  # noqa: A002 - click's own names
        super().__init__(min=min, max=max)

    def convert(self, value, param, ctx):
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{number!r} is not allowed; expected a finite number of seconds from {self.min:g} to "
                      f"{self.max:g}", param, ctx)
        return super().convert(number, param, ctx)
