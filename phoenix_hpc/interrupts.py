"""Ctrl-C (SIGINT) held back over a section that must not be left half done (files that belong together, a
submitted job and its record).

:func:`hold_interrupt` installs, for the ``with`` block, a SIGINT handler that only notes the signal; the
previous handler is put back on exit, and an interrupt noted inside the block is raised there as
:class:`KeyboardInterrupt`, once the block is whole (the caller's ``except KeyboardInterrupt`` then undoes or
reports). Signal handlers can be set from the main thread only (Python's ``signal`` module); elsewhere the
block runs unchanged.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


class Held:
    """What :func:`hold_interrupt` yields: ``interrupted`` becomes True when SIGINT arrived in the block."""

    def __init__(self) -> None:
        self.interrupted = False


@contextlib.contextmanager
def hold_interrupt() -> Iterator[Held]:
    """Hold SIGINT back until the block ends, then raise :class:`KeyboardInterrupt` if one arrived (see the
    module doc). When the block raises while an interrupt is held (a child process the same Ctrl-C ended),
:class:`KeyboardInterrupt` is raised from that exception."""
    held = Held()
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # a process that ignores SIGINT (started in the
        yield held  # background by a non-interactive shell, nohup) is not interrupted by it, held or not
        return

    def note(signum, frame) -> None:  # noqa: ARG001 -- signal handler signature
        held.interrupted = True

    previous = signal.signal(signal.SIGINT, note)
    try:
        yield held
    except BaseException as exc:
        signal.signal(signal.SIGINT, previous)
        if held.interrupted and not isinstance(exc, KeyboardInterrupt):
            raise KeyboardInterrupt from exc  # e.g. a child process that the same Ctrl-C ended
        raise
    signal.signal(signal.SIGINT, previous)
    if held.interrupted:
        raise KeyboardInterrupt
