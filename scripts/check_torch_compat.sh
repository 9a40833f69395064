#!/usr/bin/env bash
# Builds commsched on the oldest supported torch (MIN_TORCH in commsched/torch_compat.py) and runs
# the unit and multi-rank tests there (not those marked launcher or gpu), in a side venv: .venv and the in-tree commsched/_C*.so are
# left alone. Writes benchmarks/torch_compat/torch-<version>.md and the index README.md beside it.
# Not part of scripts/test.sh: it installs a ~5 GB torch (PyPI's linux wheels are CUDA builds;
# they import and run on a machine without a GPU).
#
#   scripts/check_torch_compat.sh                      # torch 2.4.1 in .venv-torch-compat
#   COMPAT_TORCH=2.15.0 scripts/check_torch_compat.sh  # another release, in .venv-torch-2.15.0
#
# The venv also keeps the copy of the sources and the build folder, so that a second run only
# recompiles what changed. Exit status: pytest's (a run that collects nothing fails).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TORCH_PIN="${COMPAT_TORCH:-2.4.1}"
if [ "$TORCH_PIN" = "2.4.1" ]; then DEFAULT_VENV="$ROOT/.venv-torch-compat"; else DEFAULT_VENV="$ROOT/.venv-torch-$TORCH_PIN"; fi
VENV="${COMPAT_VENV:-$DEFAULT_VENV}"
REPORT_DIR="$ROOT/benchmarks/torch_compat"
PY_BASE="${PYTHON:-python3}"
SRC="$VENV/commsched-src"      # a copy of the working tree (tracked and untracked, not ignored)
BUILD="$VENV/commsched-build"  # build_ext's temp and lib folders, kept for incremental builds
LOG="$VENV/check_torch_compat.log"
# Tests that need Horovod, which this venv does not have (building it takes long and it is
# covered by the main venv): deselected here, each with its reason.
DESELECT=(
  "tests/test_small_pieces.py::test_horovod_compression_and_ops_are_accepted"
)
DESELECT_REASON="imports horovod.torch to check that Horovod's Compression and op objects are accepted; Horovod is not installed in the side venv"
# Whole modules that import Horovod at the top: left out of the collection (a deselect comes too
# late, after the import failed), each with its reason. The horovodrun tests (IGNORE_GLOB) are
# marked launcher, which -m leaves out anyway, but their job modules import Horovod.
IGNORE=(
  "tests/runtime/test_elastic_local.py"
)
IGNORE_GLOB="*_horovodrun.py"
IGNORE_REASON="modules that import Horovod at the top: test_elastic_local.py, Elastic Horovod's protocol in a world of one (the failure type is Horovod's HorovodInternalError), and the horovodrun tests (marked launcher) through their job modules; Horovod is not installed in the side venv"
log() { echo "== check_torch_compat: $*" >&2; }

log "venv $VENV (torch $TORCH_PIN)"
[ -x "$VENV/bin/python" ] || "$PY_BASE" -m venv "$VENV"
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check -q)

if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.__version__.split('+')[0] == '$TORCH_PIN' else 1)" 2>/dev/null; then
  log "installing torch==$TORCH_PIN"
  "${PIP[@]}" install "torch==$TORCH_PIN" > "$LOG" 2>&1 || { tail -n 20 "$LOG" >&2; exit 1; }
fi
if ! "$PY" -c "import numpy, yaml, pytest, pytest_timeout, hypothesis, psutil, cloudpickle, matplotlib, sklearn, setuptools, wheel, ninja, packaging" 2>/dev/null; then
  log "installing the test dependencies"
  "${PIP[@]}" install numpy pyyaml pytest pytest-timeout hypothesis psutil cloudpickle matplotlib \
    scikit-learn setuptools wheel ninja packaging > "$LOG" 2>&1 || { tail -n 20 "$LOG" >&2; exit 1; }
fi

log "copying the working tree to $SRC"
rm -rf "$SRC"
mkdir -p "$SRC" "$BUILD"
# tar keeps the files' times, so ninja recompiles only the sources that changed since last time.
(cd "$ROOT" && git ls-files -z -co --exclude-standard \
   | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
   | tar --null -T - -cf -) | tar -xf - -C "$SRC"

log "building commsched._C against this torch"
# --force: setuptools would skip the build when only a header changed; ninja still recompiles
# only what is out of date.
(cd "$SRC" && MAX_JOBS="$(nproc)" "$PY" setup.py -q build_ext --force \
   --build-temp "$BUILD/temp" --build-lib "$BUILD/lib") > "$LOG" 2>&1 || { tail -n 40 "$LOG" >&2; exit 1; }
cp "$BUILD"/lib/commsched/_C*.so "$SRC/commsched/"

PYTEST=(-m pytest tests -m "not launcher and not gpu" -q -p no:cacheprovider -rfEs)
for test in "${DESELECT[@]}"; do PYTEST+=(--deselect "$test"); done
for module in "${IGNORE[@]}"; do PYTEST+=(--ignore "$module"); done
PYTEST+=(--ignore-glob "$IGNORE_GLOB")
# The command as a shell reads it: the arguments that hold a space or a glob quoted.
COMMAND="PYTHONPATH=. OMP_NUM_THREADS=1 python"
for arg in "${PYTEST[@]}"; do
  case "$arg" in *" "* | *"*"*) COMMAND+=" \"$arg\"" ;; *) COMMAND+=" $arg" ;; esac
done
log "${COMMAND#*python -m }"
set +e
(cd "$SRC" && OMP_NUM_THREADS=1 PYTHONPATH="$SRC" "$PY" "${PYTEST[@]}") 2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -eq 5 ]; then
  echo "check_torch_compat.sh: pytest collected no tests" >&2
  rc=1
fi

log "writing the report"
mkdir -p "$REPORT_DIR"
HEAD_SHA="$(cd "$ROOT" && git rev-parse --short HEAD)"
DIRTY="$(cd "$ROOT" && git status --porcelain | wc -l | tr -d ' ')"
"$PY" - "$LOG" "$REPORT_DIR" "$TORCH_PIN" "$rc" "$HEAD_SHA" "$DIRTY" "$SRC/commsched/torch_compat.py" \
  "$DESELECT_REASON" "$COMMAND" "${IGNORE[*]} $IGNORE_GLOB" \
  "$IGNORE_REASON" <<'PYEOF'
import datetime
import importlib.util
import pathlib
import platform
import re
import sys

import torch

log, report_dir, pin, rc, head, dirty, compat_path, reason, command, ignored, ignore_reason = \
    sys.argv[1:]
spec = importlib.util.spec_from_file_location("_torch_compat", compat_path)
compat = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compat)

lines = pathlib.Path(log).read_text(encoding="utf-8", errors="replace").splitlines()
summary = next((line.strip("= ") for line in reversed(lines)
                if re.search(r"\d+ (passed|failed|errors?|skipped|deselected)\b", line)),
               "no summary line")
counts = {kind.rstrip("s") if kind.startswith("error") else kind: int(n) for n, kind in re.findall(
    r"(\d+) (passed|failed|skipped|deselected|errors?)\b", summary)}
counted = ", ".join(f"{counts.get(k, 0)} {k}"
                    for k in ("passed", "failed", "error", "skipped", "deselected"))
details = [line for line in lines if line.startswith(("FAILED ", "ERROR ", "SKIPPED "))]
build = f"CUDA {torch.version.cuda} build, run on CPU" if torch.version.cuda else "CPU build"
date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
tree = head + (f" with {dirty} paths changed or added (git status)" if dirty != "0" else "")
verdict = "pass" if rc == "0" else f"FAIL (pytest exit {rc})"
variant = f" (`COMPAT_TORCH={pin}`)" if pin != "2.4.1" else ""

out = [f"# commsched on torch {pin}", "",
       f"Written by `scripts/check_torch_compat.sh`{variant}: a side venv with this torch,",
       "commsched._C compiled from `csrc/` against it, then the unit and multi-rank tests.", "",
       "| | |", "|---|---|",
       f"| result | **{verdict}**: {counted} |",
       f"| pytest | {summary} |",
       f"| torch | {torch.__version__} ({build}) |",
       f"| python | {platform.python_version()} |",
       f"| date | {date} |",
       f"| source | working tree at {tree} |",
       "", "Command, run in a copy of the working tree with the side venv's python:", "",
       "```", command, "```", "",
       "Deselected: `tests/test_small_pieces.py::test_horovod_compression_and_ops_are_accepted`"
       f" ({reason}).", ""]
if ignored:
    out += [f"Not collected: `{ignored}` ({ignore_reason}).", ""]
if details:
    out += ["Failures, errors and skips:", "", "```", *details, "```", ""]
(pathlib.Path(report_dir) / f"torch-{pin}.md").write_text("\n".join(out), encoding="utf-8")


def field(body: str, key: str) -> str:
    match = re.search(rf"^\| {key} \| (.*) \|$", body, re.M)
    return match[1] if match else "?"


rows = []
for path in sorted(pathlib.Path(report_dir).glob("torch-*.md"),
                   key=lambda p: [int(x) for x in re.findall(r"\d+", p.stem)]):
    body = path.read_text(encoding="utf-8")
    rows.append(f"| [{path.stem.removeprefix('torch-')}]({path.name}) | {field(body, 'result')} | "
                f"{field(body, 'python')} | {field(body, 'date')} |")
index = ["# torch compatibility runs", "",
         f"commsched supports torch {compat.supported_range()} (`commsched/torch_compat.py`, and",
         "`csrc/torch_compat.h` for the C++ side). Each row is one run of",
         "`scripts/check_torch_compat.sh` (by default the oldest supported release, 2.4.1;",
         "`COMPAT_TORCH=<version>` runs another): commsched._C built against that torch in a side",
         "venv, then `pytest tests -m \"not launcher and not gpu\"`. The launcher tests and the",
         "benchmarks need Horovod and run on the torch that `scripts/setup.sh` installs.", "",
         "| torch | result | python | date |", "|---|---|---|---|", *rows, ""]
(pathlib.Path(report_dir) / "README.md").write_text("\n".join(index), encoding="utf-8")
print(f"check_torch_compat.sh: torch {pin}: {verdict}: {counted} -> "
      f"{pathlib.Path(report_dir) / f'torch-{pin}.md'}")
PYEOF
exit "$rc"
