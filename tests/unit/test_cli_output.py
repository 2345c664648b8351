"""The commands' console: readable tables in pipes and files."""

from __future__ import annotations

import io
import sys

from phoenix_hpc.cli.output import PIPE_WIDTH, make_console


def test_a_pipe_gets_wide_tables_unless_columns_is_set(monkeypatch):
    monkeypatch.setattr(sys, "stdout", io.StringIO())  # not a terminal
    monkeypatch.delenv("COLUMNS", raising=False)
    assert make_console().width == PIPE_WIDTH
    monkeypatch.setenv("COLUMNS", "100")
    assert make_console().width == 100
