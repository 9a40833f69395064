#!/usr/bin/env bash
# Installs everything commsched needs into .venv: torch (CPU 2.13.0 unless one is importable),
# Horovod 0.28.1 built with PyTorch + Gloo, and commsched itself (editable, compiling csrc/).
# Idempotent: each step checks whether its result is already there.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${COMMSCHED_VENV:-$ROOT/.venv}"
PY_BASE="${PYTHON:-python3}"
STEP="start"
trap 'echo "setup.sh: step \"$STEP\" failed (exit $?)" >&2' ERR

step() { STEP="$1"; echo "== setup: $1" >&2; }

step "create venv"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY_BASE" -m venv "$VENV"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check -q)

step "build tools"
if ! "$PY" -c "import wheel, setuptools, packaging, cmake, ninja" 2>/dev/null; then
  "${PIP[@]}" install "setuptools>=64" wheel packaging cmake ninja
fi

step "torch"
if ! "$PY" -c "import torch" 2>/dev/null; then
  "${PIP[@]}" install "torch==2.13.0"  # the newest release the whole suite has run on
fi
# The supported range is kept in commsched/torch_compat.py alone; it is read from the file, as
# commsched itself is not built yet.
if ! TORCH_RANGE_ERROR="$("$PY" - "$ROOT/commsched/torch_compat.py" "$VENV" <<'PYEOF'
import importlib.util
import sys

spec = importlib.util.spec_from_file_location("_commsched_torch_compat", sys.argv[1])
compat = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compat)
import torch

if not compat.is_supported(torch.__version__):
    print(f"torch {torch.__version__} (in {sys.argv[2]}) is outside commsched's supported range "
          f"{compat.supported_range()}; install a torch in that range there, or remove it and "
          "setup.sh installs torch==2.13.0")
    sys.exit(1)
PYEOF
)"; then
  echo "setup.sh: ${TORCH_RANGE_ERROR:-torch version check failed}" >&2
  exit 1
fi

step "python dependencies"
if ! "$PY" -c "import numpy, yaml, pytest, hypothesis, matplotlib, ruff, psutil, sklearn" 2>/dev/null; then
  "${PIP[@]}" install numpy pyyaml pytest pytest-timeout hypothesis matplotlib ruff mypy psutil cloudpickle scikit-learn
fi

step "horovod 0.28.1 (PyTorch + Gloo)"
if ! "$PY" -c "import horovod.torch" 2>/dev/null; then
  WRAP="$VENV/bin/cxx17-wrapper"
  # Horovod 0.28.1 forces -std=c++14 in two CMakeLists; torch>=2.1 headers need C++17.
  cat > "$WRAP" <<'WRAPEOF'
#!/usr/bin/env bash
args=()
for a in "$@"; do
  case "$a" in
    -std=c++11|-std=c++14|-std=gnu++11|-std=gnu++14) args+=("-std=c++17") ;;
    *) args+=("$a") ;;
  esac
done
exec "${COMMSCHED_REAL_CXX:-g++}" "${args[@]}"
WRAPEOF
  chmod +x "$WRAP"
  HVD_FLAGS=(HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1)
  if command -v mpicxx >/dev/null 2>&1; then HVD_FLAGS+=(HOROVOD_WITH_MPI=1); else HVD_FLAGS+=(HOROVOD_WITHOUT_MPI=1); fi
  if "$PY" -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() and torch.backends.cudnn.is_available() else 1)" 2>/dev/null \
     && [ -n "${NCCL_HOME:-}" ]; then HVD_FLAGS+=(HOROVOD_GPU_OPERATIONS=NCCL); fi
  env "${HVD_FLAGS[@]}" CMAKE_POLICY_VERSION_MINIMUM=3.5 CXX="$WRAP" \
    MAKEFLAGS="-j$(nproc)" PATH="$VENV/bin:$PATH" \
    "$PY" -m pip --disable-pip-version-check install --no-build-isolation "horovod[pytorch]==0.28.1" 2>&1 | tail -n 5
  "$PY" -c "import horovod.torch"
fi

step "commsched (editable, builds commsched._C)"
if ! (cd /tmp && "$PY" -c "import commsched._C, commsched, os, sys; sys.exit(0 if os.path.dirname(commsched.__file__).startswith('$ROOT') else 1)") 2>/dev/null \
   || [ -n "$(find "$ROOT/csrc" -newer "$ROOT/.venv/.commsched-built" 2>/dev/null | head -n 1)" ] \
   || [ ! -f "$ROOT/.venv/.commsched-built" ]; then
  (cd "$ROOT" && MAX_JOBS="$(nproc)" "$PY" -m pip --disable-pip-version-check -q install --no-build-isolation --no-deps -e .)
  touch "$ROOT/.venv/.commsched-built"
fi

step "done"
echo "setup.sh: ready ($VENV)" >&2
