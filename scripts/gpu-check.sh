#!/usr/bin/env bash
# Run every GPU-only test (pytest marker `gpu`) on one CUDA GPU, in under 10 minutes.
# Usage: scripts/gpu-check.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
"$PY" - <<'PYEOF'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("gpu-check: no CUDA device visible (torch.cuda.is_available() is False)")
print(f"gpu-check: torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}")
PYEOF
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
exec timeout 600 "$PY" -m pytest -m gpu tests -q -rA -s -p no:cacheprovider "$@"
