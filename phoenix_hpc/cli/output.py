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
