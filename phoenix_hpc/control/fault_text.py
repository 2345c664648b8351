"""Short, readable fault messages (pure): what the journal fold (:mod:`phoenix_hpc.control.view`) and
``phoenix status`` show of a fault.

Errors raised inside C++ libraries carry the source location first: gloo's
``[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer
[127.0.0.1]:41234`` and c10's ``Exception raised from ... at /path/file.cpp:12 (most recent call first):``
followed by a C++ stack. :func:`fault_cause` drops those parts and keeps the cause.
"""

from __future__ import annotations

import re

# "[<path>.<ext>:<line>] " as gloo/c10 prefix their messages (the path may be relative, "../third_party/...")
_SOURCE_LOCATION = re.compile(r"\[[^\]\s]*\.(?:cc|cpp|cxx|c|h|hpp|cu|py):\d+\]\s*")
# c10::Error appends "Exception raised from <function> at <file>:<line> (most recent call first):" + frames
_CPP_TRAILER = re.compile(r"\s*Exception raised from .*", re.DOTALL)


def fault_cause(exc_type: str | None, message: str | None) -> str:
    """``"EXC_TYPE: cause"`` from an exception's type name and message: source locations and C++ stack
    trailers removed, whitespace collapsed to single spaces. Either part may be empty."""
    text = _CPP_TRAILER.sub("", message or "")
    text = _SOURCE_LOCATION.sub("", text)
    text = " ".join(text.split())
    return ": ".join(p for p in ((exc_type or "").strip(), text) if p)


def shorten(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, ending in "..." when cut."""
    return text if len(text) <= width else text[: max(0, width - 3)].rstrip() + "..."
