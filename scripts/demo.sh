#!/usr/bin/env bash
# The main job end to end, on a fresh Debian 12 machine, as root:
#   set-up (scripts/setup.sh, idempotent), then `phoenix demo`: a local Slurm cluster (6 nodes on 2 leaf
#   switches), a dataset from the standard library, a fault-free run of examples/gpt-small.yaml, the same run
#   with a node killed mid-run (hot swap to a spare), `phoenix status`, and a report. The cluster is stopped
#   at the end, also on failure or Ctrl-C. Options go to `phoenix demo` (e.g. --steps 20; see --help).
# Exit code: 0 the final state after the node loss equals the fault-free one; 1 it does not (or a job
# failed); 2 bad input or environment; 130 interrupted.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/phoenix demo "$@"
