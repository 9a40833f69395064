#!/usr/bin/env bash
# Compiles commsched._C against a CUDA build of torch (no GPU needed), in a separate venv, to keep
# the accelerator path (c10 device-generic streams and events, c10d on CUDA torch) building.
# Not part of scripts/test.sh: it installs a ~5.5 GB torch.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${CUDA_VENV:-$ROOT/.venv-cuda}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -c "import torch; assert torch.version.cuda" 2>/dev/null || \
  "$PY" -m pip -q --disable-pip-version-check install "torch==2.14.1" setuptools wheel ninja numpy
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
BUILD="$(mktemp -d)"
trap 'rm -rf "$BUILD"' EXIT
cd "$ROOT"
"$PY" setup.py -q build_ext --build-temp "$BUILD/tmp" --build-lib "$BUILD/lib"
cd "$BUILD/lib"  # import the fresh build, not the repository's CPU one
"$PY" -c "
import torch, commsched._C as C
print('commsched._C built against torch', torch.__version__, 'CUDA', torch.version.cuda, '->', C.__file__)"
