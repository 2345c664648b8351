"""The rich console of the ``phoenix`` commands."""

from __future__ import annotations

import os
import sys

PIPE_WIDTH = 160  # columns when the output is not a terminal (rich would use 80 and squeeze wide tables)


def make_console(stderr: bool = False):
    """A :class:`rich.console.Console` on stdout (or stderr). Into a pipe or a file, without ``COLUMNS`` set,
    tables get :data:`PIPE_WIDTH` columns instead of rich's 80, so that logs and ``| less`` stay readable."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None
    if not os.environ.get("COLUMNS") and not (hasattr(stream, "isatty") and stream.isatty()):
        width = PIPE_WIDTH
    return Console(stderr=stderr, width=width)


class LineProgress:
    """Progress as plain lines, for output that is not a terminal (a pipe, ``tee``, a CI log), where rich's
    live displays print nothing until they end.

    :meth:`update` prints ``"<description>: step N/TOTAL"`` when the description changes, and otherwise at
    most once per ``every_s`` seconds while the count moves.

    Args:
        echo: prints one line (e.g. ``click.echo`` to stderr).
        every_s: the least seconds between two lines of the same description.
        clock: monotonic seconds (injectable for tests).
    """

    def __init__(self, echo, every_s: float = 5.0, clock=None):
        import time

        self.echo, self.every_s, self.clock = echo, every_s, clock or time.monotonic
        self._desc: str | None = None
        self._count: int | None = None
        self._t = float("-inf")

    def update(self, description: str, completed: int | None, total: int | None = None) -> None:
        now = self.clock()
        changed = description != self._desc
        if not changed and (completed == self._count or now - self._t < self.every_s):
            return
        self._desc, self._count, self._t = description, completed, now
        step = "-" if completed is None else str(completed)
        self.echo(f"{description}: step {step}" + (f"/{total}" if total else ""))
