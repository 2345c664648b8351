"""The test suite never reads or writes the user's own runs index (``~/.phoenix/runs.jsonl``):
tests/conftest.py points ``PHOENIX_HOME`` elsewhere for the whole session."""

from __future__ import annotations

import os
from pathlib import Path

from phoenix_hpc.status.runs import phoenix_home


def test_the_runs_index_of_the_suite_is_not_the_users():
    assert os.environ.get("PHOENIX_HOME")
    assert phoenix_home().resolve() != (Path.home() / ".phoenix").resolve()
