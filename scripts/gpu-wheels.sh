#!/usr/bin/env bash
# Fetch into .whl/ (git-ignored) the wheels a bare GPU machine (CPython 3.12, x86-64, torch with CUDA, no
# network) lacks: the packages of phoenix_hpc/gpucheck/wheels.py GPU_MISSING at the versions pyproject.toml
# pins. Binary wheels are downloaded for cp312 / manylinux x86-64; a package published only as a source
# archive (python-hostlist) is built into a pure-Python wheel. Needs the package index; prints the total size.
# scripts/gpu-check.sh installs them on the GPU machine without network.
#   scripts/gpu-wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
mapfile -t PINS < <("$PY" -m phoenix_hpc.gpucheck.wheels pins)
mkdir -p .whl
TAGS=(--python-version 3.12 --implementation cp --abi cp312 --platform manylinux_2_28_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
missing=$("$PY" -m phoenix_hpc.gpucheck.wheels check .whl 2>&1 || true)
for pin in "${PINS[@]}"; do
  if grep -q -F -- "- $pin:" <<<"$missing"; then
    echo "[gpu-wheels] fetching $pin"
    if ! err=$("$PY" -m pip download -q --no-deps --only-binary=:all: "${TAGS[@]}" -d .whl "$pin" 2>&1 >/dev/null); then
      if grep -q "No matching distribution" <<<"$err"; then
        # no binary wheel published: build a pure-Python one from the source archive
        "$PY" -m pip wheel -q --no-deps -w .whl "$pin"
      else
        echo "$err" >&2
        exit 1
      fi
    fi
  fi
done
"$PY" -m phoenix_hpc.gpucheck.wheels check .whl >/dev/null   # exit 2 naming what is still missing
total=$(du -cb $("$PY" -m phoenix_hpc.gpucheck.wheels check .whl) | tail -1 | cut -f1)
echo "[gpu-wheels] ${#PINS[@]} wheels in .whl/: $((total / 1024)) KiB in all (the GPU machine takes 64 MiB with the working tree)"
