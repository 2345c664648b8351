#!/usr/bin/env bash
# Set up (idempotent) and run the test suite. Tests that need the local Slurm cluster start it themselves
# and tear it down at the end, also when tests fail.
#   scripts/test.sh                      the whole suite (tests/)
#   scripts/test.sh -x -q -m "not cluster"   options go to pytest, still over tests/
#   scripts/test.sh tests/unit/test_placement.py::test_x   a path (or node id) replaces tests/
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
for arg in "$@"; do
  if [[ "$arg" == tests* || "$arg" == ./tests* ]]; then
    exec .venv/bin/python -m pytest "$@"
  fi
done
exec .venv/bin/python -m pytest tests "$@"
