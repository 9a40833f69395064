#!/usr/bin/env bash
# Installs Horovod 0.28.1 (PyTorch + Gloo; MPI where mpicxx is found, NCCL on a CUDA torch with
# NCCL_HOME set) into the environment of PYTHON (default: `python` on PATH), built against the
# torch installed there. The one place of the recipe that makes Horovod's last release build on
# torch >= 2.1 and CMake >= 4 (docs/install.md):
#   * a C++ compiler wrapper that turns Horovod's forced -std=c++11/14 into -std=c++17, which
#     torch's headers need;
#   * CMAKE_POLICY_VERSION_MINIMUM=3.5 (its bundled Gloo asks for CMake < 3.5);
#   * HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 ... and --no-build-isolation, so that the build
#     sees this environment's torch;
#   * a wheel cache per torch version: a Horovod wheel runs only with the torch it was built
#     against, and pip's own wheel cache would hand a wheel built for one torch to another
#     ("Horovod was built with a different torch version").
# Idempotent: does nothing when horovod.torch already imports; installs from the cache when it
# holds a wheel for this torch (seconds); builds otherwise (about 2.5 minutes on 2 cores).
#
# Usage: scripts/install_horovod.sh [--cached-only] [PYTHON]
#   --cached-only  install from the wheel cache or fail with status 3; never build (tests use it)
# Environment: HOROVOD_WHEEL_CACHE (default ~/.cache/commsched/horovod-wheels), CXX (the real
#   C++ compiler behind the wrapper, default g++), MAX_JOBS (parallel compile jobs, default nproc).
set -euo pipefail
HVD_VERSION=0.28.1
CACHED_ONLY=0
if [ "${1:-}" = "--cached-only" ]; then CACHED_ONLY=1; shift; fi
PY="${1:-python}"
say() { echo "install_horovod.sh: $*" >&2; }

if ! TORCH="$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)"; then
  say "torch is not importable by $PY: install torch there first (Horovod is built against it)"
  exit 1
fi
# Works already: imports, was built against this torch (Horovod itself only warns when the
# torch it was built against differs but its extension still loads), and has MPI where mpicxx
# is found (a Horovod built before MPI was installed is built again).
WANT_MPI=0
if command -v mpicxx >/dev/null 2>&1; then WANT_MPI=1; fi
if "$PY" - "$HVD_VERSION" "$WANT_MPI" 2>/dev/null <<'PYEOF'
import json
import os
import sys

import horovod
import horovod.torch
import torch

with open(os.path.join(os.path.dirname(horovod.__file__), "metadata.json")) as handle:
    built_for = json.load(handle).get("pytorch")
mpi_ok = sys.argv[2] == "0" or horovod.torch.mpi_built()
sys.exit(0 if horovod.__version__ == sys.argv[1] and built_for == torch.__version__ and mpi_ok
         else 1)
PYEOF
then
  say "horovod $HVD_VERSION already works with torch $TORCH ($PY)"
  exit 0
fi
PY_BIN="$("$PY" -c 'import os, sys; print(os.path.dirname(sys.executable))')"
PY_TAG="$("$PY" -c 'import sys; print(f"cp{sys.version_info.major}{sys.version_info.minor}")')"
PIP=("$PY" -m pip --disable-pip-version-check)

# What the wheel is built with is part of its cache key, as the torch it is built against is.
HVD_FLAGS=(HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_TENSORFLOW=1
           HOROVOD_WITHOUT_MXNET=1)
FEATURES=gloo
if command -v mpicxx >/dev/null 2>&1; then
  HVD_FLAGS+=(HOROVOD_WITH_MPI=1); FEATURES+=-mpi
else
  HVD_FLAGS+=(HOROVOD_WITHOUT_MPI=1)
fi
if [ -n "${NCCL_HOME:-}" ] && "$PY" -c 'import sys, torch; sys.exit(torch.version.cuda is None)'; then
  HVD_FLAGS+=(HOROVOD_GPU_OPERATIONS=NCCL); FEATURES+=-nccl
fi
KEY="horovod-$HVD_VERSION-torch-${TORCH//[^A-Za-z0-9._-]/-}-$PY_TAG-$FEATURES"
CACHE_ROOT="${HOROVOD_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/commsched/horovod-wheels}"
CACHE="$CACHE_ROOT/$KEY"
mkdir -p "$CACHE"
# One build per cache entry at a time (setup.sh and a test may run together).
exec 9>"$CACHE/.lock"
flock 9

# The torch a wheel was built against, from the metadata.json Horovod writes into it.
wheel_torch() {
  "$PY" - "$1" <<'PYEOF'
import json
import sys
import zipfile

with zipfile.ZipFile(sys.argv[1]) as wheel:
    print(json.loads(wheel.read("horovod/metadata.json")).get("pytorch", ""))
PYEOF
}

cached_wheel() {
  local wheel
  for wheel in "$CACHE"/horovod-"$HVD_VERSION"-*.whl; do
    [ -f "$wheel" ] || continue
    if [ "$(wheel_torch "$wheel" 2>/dev/null)" = "$TORCH" ]; then echo "$wheel"; return 0; fi
    say "removing $wheel: built against another torch than $TORCH"
    rm -f "$wheel"
  done
  return 1
}

if ! WHEEL="$(cached_wheel)"; then
  if [ "$CACHED_ONLY" = 1 ]; then
    say "no cached wheel for torch $TORCH in $CACHE (--cached-only: not building)"
    exit 3
  fi
  say "building horovod $HVD_VERSION against torch $TORCH ($FEATURES) into $CACHE"
  if ! "$PY" -c 'import cmake, packaging, setuptools, wheel' 2>/dev/null; then
    "${PIP[@]}" install -q cmake packaging setuptools wheel
  fi
  WORK="$(mktemp -d)"
  trap 'rm -rf "$WORK"' EXIT
  # Horovod 0.28.1 forces -std=c++14 in two CMakeLists; torch >= 2.1 headers need C++17.
  REAL_CXX="$(command -v "${CXX:-g++}")"
  cat > "$WORK/cxx17" <<WRAPEOF
#!/usr/bin/env bash
args=()
for a in "\$@"; do
  case "\$a" in
    -std=c++11|-std=c++14|-std=gnu++11|-std=gnu++14) args+=("-std=c++17") ;;
    *) args+=("\$a") ;;
  esac
done
exec "$REAL_CXX" "\${args[@]}"
WRAPEOF
  chmod +x "$WORK/cxx17"
  # --no-cache-dir: pip's wheel cache is keyed by the sdist alone and would return a wheel built
  # against whatever torch built it first.
  if ! env "${HVD_FLAGS[@]}" CMAKE_POLICY_VERSION_MINIMUM=3.5 CXX="$WORK/cxx17" \
      MAKEFLAGS="-j${MAX_JOBS:-$(nproc)}" PATH="$PY_BIN:$PATH" \
      "${PIP[@]}" wheel --no-build-isolation --no-deps --no-cache-dir -w "$WORK/out" \
      "horovod==$HVD_VERSION" > "$WORK/build.log" 2>&1; then
    tail -n 40 "$WORK/build.log" >&2
    say "building horovod failed (the lines above are the end of pip's output)"
    exit 1
  fi
  BUILT="$(ls "$WORK"/out/horovod-"$HVD_VERSION"-*.whl)"
  mv "$BUILT" "$CACHE/"
  WHEEL="$CACHE/$(basename "$BUILT")"
fi

say "installing $WHEEL"
# A horovod of the same version that does not import (built against another torch) would count as
# installed already: remove it first.
if "$PY" -c 'import importlib.metadata as m; m.distribution("horovod")' 2>/dev/null; then
  "${PIP[@]}" uninstall -q -y horovod
fi
"${PIP[@]}" install -q --no-build-isolation "$WHEEL"
if ! IMPORT_ERROR="$("$PY" -c 'import horovod.torch' 2>&1)"; then
  echo "$IMPORT_ERROR" >&2
  say "horovod.torch does not import after installing $WHEEL"
  exit 1
fi
say "horovod $HVD_VERSION installed for torch $TORCH ($PY)"
