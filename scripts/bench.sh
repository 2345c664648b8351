#!/usr/bin/env bash
# Benchmarks of PHOENIX on a local Slurm cluster of its own: per-step overhead (protection on vs off,
# interleaved), host memory per rank, hot swap against requeue, in-job and in-process restart, hot-swap scaling
# and what of a hot swap grows with the model size.
# Writes BENCHMARKS.md, BENCHMARKS.json and benchmarks/*.png (into --out, default the repository root).
# Prints numbers; it is not a test.
#
# Usage: scripts/bench.sh [--quick] [--sections overhead,recovery,scaling,by_size] [--out DIR] [--seed N]
#                         [--baselines requeue,in-job,in-process] [--ks 10,50,100] [--trials 3]
#   --quick   under 3 minutes on 2 cores: fewer steps, K=10 only, no scaling or by_size section
#   (full run: about 20-35 minutes on 2 cores)
#
# The cluster (8 nodes) lives in .phoenix/bench/<timestamp>/cluster with the work files; it is stopped by
# the PIDs it recorded when this script ends, also on failure or Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
ARGS=()
OUT=.
while (($#)); do
  case "$1" in
    --quick) ARGS+=(--quick); shift ;;
    --sections|--seed|--baselines|--ks|--trials) ARGS+=("$1" "${2:?$1 needs a value}"); shift 2 ;;
    --out) OUT=${2:?--out needs a value}; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "scripts/bench.sh: unknown option '$1' (allowed: --quick, --sections LIST, --out DIR, --seed N, --baselines LIST, --ks LIST, --trials N)" >&2; exit 2 ;;
  esac
done

if [ "$(id -u)" = 0 ]; then
  scripts/setup.sh
elif [ ! -x .venv/bin/python ]; then
  echo "scripts/bench.sh: run scripts/setup.sh (as root) first" >&2
  exit 2
fi

RUN=".phoenix/bench/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$RUN"
RUN=$(cd "$RUN" && pwd)
CLUSTER_UP=0
cleanup() {
  rc=$?
  if [ "$CLUSTER_UP" = 1 ]; then
    .venv/bin/phoenix cluster down --run-dir "$RUN/cluster" >/dev/null || echo "[bench] cluster down failed; see $RUN/cluster" >&2
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "[bench] starting a local cluster in $RUN/cluster"
CLUSTER_UP=1
.venv/bin/phoenix cluster up --nodes 8 --run-dir "$RUN/cluster" >/dev/null
.venv/bin/python -m phoenix_hpc.bench.run --cluster-dir "$RUN/cluster" --work-dir "$RUN/work" --out-dir "$OUT" "${ARGS[@]}"
