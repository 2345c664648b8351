#!/usr/bin/env bash
# Run every one-GPU check in one command on a bare machine with a CUDA GPU (CPython 3.12, x86-64, torch
# with CUDA; no network, no virtual environment of ours) and write OUT_DIR/gpu-report.json and .md.
#   scripts/gpu-check.sh [--dry-run] [OUT_DIR]        OUT_DIR defaults to gpu-report/
# 1. the wheels in .whl/ (fetched by scripts/gpu-wheels.sh where the package index is reachable) are
#    checked against pyproject.toml's pins and installed with pip, without network, into a temporary folder;
# 2. the checks run from this checkout (PYTHONPATH, no install), each in its own process under its timeout,
#    all within --budget-s (default 450 s) -- see phoenix_hpc/gpucheck/.
# --dry-run does everything up to the first CUDA call (wheel check and install, imports, the checks' configs
# and dataset) on any machine; where the interpreter is not CPython 3.12 on x86-64 the wheels are installed
# for that target but not imported, and the imports use the interpreter's own copies (the report says so).
# Python: $PHOENIX_GPU_PYTHON, else python3; wheels: $PHOENIX_GPU_WHEELS, else .whl/.
# Exit codes: 0 all passed or skipped, 1 a check failed, 2 bad input, no CUDA device, or a missing or
# wrong-platform wheel (named, with the command that fetches it).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PHOENIX_GPU_PYTHON:-python3}
DRY=()
ARGS=()
for a in "$@"; do
  case "$a" in
    --dry-run) DRY=(--dry-run) ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) ARGS+=("$a") ;;   # OUT_DIR, --budget-s S, --only NAMES: checked by the runner
  esac
done
if ! command -v "$PY" >/dev/null 2>&1; then
  echo "gpu-check: PHOENIX_GPU_PYTHON=$PY: no such interpreter" >&2
  exit 2
fi
if ! "$PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)" 2>/dev/null; then
  echo "gpu-check: $PY cannot import torch; the check needs a Python with torch (set PHOENIX_GPU_PYTHON)" >&2
  exit 2
fi
# 1. wheels: every pinned package present for CPython 3.12 / manylinux x86-64 (else exit 2 naming it)
WHEEL_DIR=${PHOENIX_GPU_WHEELS:-.whl}
WHEELS=$(PYTHONPATH="$ROOT" "$PY" -m phoenix_hpc.gpucheck.wheels check "$WHEEL_DIR") || exit 2
TARGET=$(mktemp -d "${TMPDIR:-/tmp}/phoenix-gpu-wheels.XXXXXX")
trap 'rm -rf "$TARGET"' EXIT
if "$PY" -m pip --version >/dev/null 2>&1; then
  # --ignore-requires-python: pip compares a wheel's Requires-Python with the interpreter running pip, not
  # --python-version; megatron-core 0.19.2 requires >=3.12, and a dry run elsewhere still installs it
  # shellcheck disable=SC2086
  if ! "$PY" -m pip install -q --no-index --no-deps --disable-pip-version-check --ignore-requires-python --target "$TARGET" \
       --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
       --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
       --platform manylinux2014_x86_64 $WHEELS; then
    echo "gpu-check: pip could not install the wheels in $WHEEL_DIR/ for CPython 3.12 x86-64; fetch them again with scripts/gpu-wheels.sh" >&2
    exit 2
  fi
else
  # no pip here: a wheel is a zip archive whose root is the install folder (PEP 427), so unpack them
  for w in $WHEELS; do "$PY" -m zipfile -e "$w" "$TARGET"; done
  echo "gpu-check: $PY has no pip; unpacked the wheels with zipfile instead"
fi
NWHEELS=$(wc -w <<<"$WHEELS")
if "$PY" -c 'import platform, sys; sys.exit(0 if sys.version_info[:2] == (3, 12) and platform.machine() == "x86_64" and sys.implementation.name == "cpython" else 1)'; then
  export PYTHONPATH="$TARGET:$ROOT"
  export PHOENIX_GPU_WHEEL_TARGET="$TARGET"
  export PHOENIX_GPU_WHEELS_NOTE="installed $NWHEELS wheels from $WHEEL_DIR/ without network; imported from them"
else
  here=$("$PY" -c 'import platform, sys; print(f"{sys.implementation.name} {platform.python_version()} on {platform.machine()}")')
  if ((${#DRY[@]} == 0)); then
    echo "gpu-check: the wheels in $WHEEL_DIR/ are for CPython 3.12 on x86-64, and $PY is $here; run on the GPU machine's python3 (or use --dry-run)" >&2
    exit 2
  fi
  export PYTHONPATH="$ROOT"
  export PHOENIX_GPU_WHEELS_NOTE="installed $NWHEELS wheels from $WHEEL_DIR/ without network for CPython 3.12 x86-64; not imported: this interpreter is $here, so the imports below use its own copies"
fi
# 2. the checks (each in its own process, under its timeout and the budget)
exec "$PY" -m phoenix_hpc.gpucheck.run "${DRY[@]}" "${ARGS[@]}"
