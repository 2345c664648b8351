#!/usr/bin/env bash
# Set up (idempotent) and run the test suite. Tests that need the local Slurm cluster start it themselves
# and tear it down at the end, also when tests fail.
#   scripts/test.sh                      the whole suite: tests/unit on every core (pytest-xdist, -n auto),
#                                        then tests/e2e in one process (one local cluster, one job at a time)
#   scripts/test.sh -x -q -m "not cluster"   options go to pytest, to both parts
#   scripts/test.sh tests/unit/test_placement.py::test_x   a path (or node id) replaces tests/, in one process
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
for arg in "$@"; do
  if [[ "$arg" == tests* || "$arg" == ./tests* ]]; then
    exec .venv/bin/python -m pytest "$@"
  fi
done
# pytest exit code 5: no test selected (e.g. -m "not cluster" leaves no e2e test); not a failure here.
# Each part prints its ten slowest tests (pyproject.toml: --durations=10) and then its wall time.
part() {
  local rc=0 t0=$SECONDS
  .venv/bin/python -m pytest "$@" || rc=$?
  [[ $rc -eq 5 ]] && rc=0
  echo "[test] $1: $((SECONDS - t0)) s (exit $rc)"
  return $rc
}
rc=0
part tests/unit -n auto "$@" || rc=$?
if [[ $rc -ne 0 && " $* " == *" -x "* ]]; then
  exit $rc
fi
part tests/e2e "$@" || rc=$?
exit $rc
