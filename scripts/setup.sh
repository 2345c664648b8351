#!/usr/bin/env bash
# One idempotent set-up on a fresh Debian 12 machine, run as root:
#   apt packages (Slurm 22.05, munge, Open MPI 4.1), a virtualenv .venv, torch (CPU build), and
#   phoenix_hpc in editable mode with its dev extras. A second run with nothing changed takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "scripts/setup.sh must run as root (it installs Debian packages)" >&2
  exit 2
fi

APT_PKGS=(munge slurmctld slurmd slurm-client openmpi-bin libopenmpi-dev python3-venv)
missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "[setup] installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python

# torch first: an unpinned torch pulled in by a dependency would fetch a multi-GB CUDA build.
TORCH_VERSION=${PHOENIX_TORCH_VERSION:-2.13.0}
if ! "$VPY" -c "import torch,sys; sys.exit(0 if torch.__version__.split('+')[0]=='$TORCH_VERSION' else 1)" 2>/dev/null; then
  echo "[setup] installing torch==$TORCH_VERSION"
  "$VPY" -m pip install -q "torch==$TORCH_VERSION"
fi

# The project, editable, with dev extras; skipped when pyproject.toml has not changed since last time.
stamp=.venv/.phoenix-install-stamp
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] || ! .venv/bin/phoenix --version >/dev/null 2>&1; then
  echo "[setup] installing phoenix_hpc (editable, dev extras)"
  MPICC=mpicc "$VPY" -m pip install -q -e ".[dev]"
  echo "$want" > "$stamp"
fi
# The newest megatron-core release the Megatron engine's calls are checked against (a unit test reads its
# source without importing it: it needs Python 3.12; phoenix_hpc/engines/megatron_version.py NEWEST_CHECKED).
MCORE_NEWEST=$("$VPY" -c "from phoenix_hpc.engines.megatron_version import NEWEST_CHECKED as v, WHEEL_DIR as d; print(v, d)")
read -r mcore_version mcore_dir <<<"$MCORE_NEWEST"
if ! ls "$mcore_dir"/megatron_core-"$mcore_version"-*.whl >/dev/null 2>&1; then
  echo "[setup] fetching the megatron-core $mcore_version wheel (source checked by the unit tests) into $mcore_dir"
  mkdir -p "$mcore_dir"
  "$VPY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 -d "$mcore_dir" "megatron-core==$mcore_version"
fi
echo "[setup] ready: $(.venv/bin/phoenix --version)"
