#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite. Tests that need the local Slurm cluster start it
# themselves and tear it down at the end, also when tests fail.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest tests "$@"
