"""``python -m phoenix_hpc.cli.main`` runs the same CLI as the ``phoenix`` entry point."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from phoenix_hpc import __version__

ROOT = Path(__file__).resolve().parents[2]


def test_python_dash_m_runs_the_cli_as_the_entry_point_does(tmp_path):
    ran = subprocess.run([sys.executable, "-m", "phoenix_hpc.cli.main", "--version"], capture_output=True,
                         text=True, cwd=ROOT, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == f"phoenix, version {__version__}"
    bad = subprocess.run([sys.executable, "-m", "phoenix_hpc.cli.main", "config", "from-megatron", "--",
                          "--num-layers", "x"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert bad.returncode == 2 and "--num-layers" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
