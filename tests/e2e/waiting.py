"""Polling helper shared by the end-to-end tests."""

from __future__ import annotations

import time
from typing import Any, Callable


def wait_for(pred: Callable[[], Any], timeout_s: float = 15.0, what: str = "condition", poll_s: float = 0.05) -> Any:
    """Call ``pred`` every ``poll_s`` seconds until it returns something true, and return that.

    Raises:
        AssertionError: ``pred`` stayed false for ``timeout_s`` seconds (the message names ``what``).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)
