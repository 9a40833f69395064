#!/usr/bin/env bash
# Installs everything commsched needs into .venv: torch (CPU 2.13.0 unless one is importable),
# Open MPI, MPICH, Slurm and munge (Debian's packages, as root), Horovod 0.28.1 built with
# PyTorch + Gloo + MPI (scripts/install_horovod.sh), and commsched itself
# (editable, compiling csrc/ against that torch; docs/install.md).
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
if ! "$PY" -c "import numpy, yaml, pytest, xdist, hypothesis, matplotlib, ruff, psutil, sklearn" 2>/dev/null; then
  "${PIP[@]}" install numpy pyyaml pytest pytest-timeout pytest-xdist hypothesis matplotlib ruff mypy psutil cloudpickle scikit-learn
fi

step "examples and lightning extras (transformers, lightning)"
# torchvision is left out: PyPI's x86_64 wheels are CUDA builds that fail to import beside the
# CPU torch installed above ('operator torchvision::nms does not exist'); the examples and the
# benchmark build ResNet-50 and VGG-16 in torchvision's layout without it (commsched.bench.vision).
# The pin on torch keeps pip from replacing the torch installed above.
if ! "$PY" -c "import transformers, lightning" 2>/dev/null; then
  "${PIP[@]}" install "transformers>=4.40" "lightning>=2.2" \
    "torch==$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')"
fi

step "system packages (Open MPI, MPICH, Slurm, munge)"
# Horovod is built with MPI where mpicxx is found (clusters mostly run it so), and the launcher
# tests run Open MPI's mpirun, MPICH's mpiexec.hydra and srun of a one-node Slurm they start.
# Debian's packages, as root; elsewhere those tests skip, saying why.
SYSTEM_COMMANDS=(mpirun.openmpi mpicxx.openmpi mpiexec.hydra srun sbatch slurmctld slurmd munged)
missing=()
for name in "${SYSTEM_COMMANDS[@]}"; do
  command -v "$name" >/dev/null 2>&1 || missing+=("$name")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    PACKAGES=(openmpi-bin libopenmpi-dev mpich slurmd slurmctld slurm-client munge)
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" >/dev/null; then
      apt-get update -q >/dev/null
      apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" >/dev/null
    fi
  else
    echo "setup.sh: ${missing[*]} not found and not root with apt-get: Horovod is built without" \
      "MPI and the mpirun and srun tests skip" >&2
  fi
fi

step "horovod 0.28.1 (PyTorch + Gloo, and MPI where mpicxx is found)"
# The recipe (C++17 wrapper, CMake policy, flags, a wheel cache per torch) lives in that script
# alone; it returns at once when horovod.torch already imports.
"$ROOT/scripts/install_horovod.sh" "$PY"

step "commsched (editable, builds commsched._C)"
# Rebuilt when never built, when csrc/ changed since, or when the extension was built against
# another torch than the venv's (or by a setup.py that kept no record of it: _build_info.json).
# setup.py keeps the objects in build/temp-torch*, so a rebuild compiles only what changed.
MARK="$VENV/.commsched-built"
built_for_this_torch() {
  (cd /tmp && "$PY" - "$ROOT" <<'PYEOF'
import json
import os
import sys

import torch

import commsched._C

root = sys.argv[1]
if not os.path.realpath(commsched._C.__file__).startswith(os.path.realpath(root) + os.sep):
    sys.exit(1)
with open(os.path.join(root, "commsched", "_build_info.json"), encoding="utf-8") as handle:
    sys.exit(0 if json.load(handle).get("torch") == torch.__version__ else 1)
PYEOF
  ) 2>/dev/null
}
if [ ! -f "$MARK" ] || [ -n "$(find "$ROOT/csrc" -newer "$MARK" 2>/dev/null | head -n 1)" ] \
   || ! built_for_this_torch; then
  (cd "$ROOT" && MAX_JOBS="$(nproc)" "$PY" -m pip --disable-pip-version-check -q install --no-build-isolation --no-deps -e .)
  touch "$MARK"
fi

step "done"
echo "setup.sh: ready ($VENV)" >&2
