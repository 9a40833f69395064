#!/usr/bin/env bash
# The GPU check (issue 14): on a machine with a CUDA device, builds commsched._C against the
# torch there, runs the overhead benchmark's GPU part (world of one, every policy beside the plain
# optimizer; GPT-2 124M first when transformers is importable, each model's report written as it
# is done, so a time limit keeps what was measured; timed synchronised per step and
# free-running, Note [Two clocks on a GPU]) and then the tests marked gpu, each under its own
# limit ($GPU_CHECK_BENCH_S, $GPU_CHECK_TESTS_S; 300 s each), and writes a report to
# benchmarks/gpu/ (README.md, tests.log, junit.xml, overhead/). Exits non-zero if a test failed.
# Without a CUDA device it stops at once with one line saying so.
#
# Python: $GPU_CHECK_PYTHON, else .venv/bin/python if its torch sees a GPU (scripts/setup.sh made
# it), else python3 (the GPU machines' image: a CUDA torch, pytest, transformers, no registry),
# whose build goes in place (commsched/_C*.so, git-ignored) since setup.sh would need a registry.
# $GPU_CHECK_COMMIT names the commit in the report where the copy has no .git (the device tool).
# $GPU_CHECK_MODELS (say, gpt2) limits the benchmark to those models: on GPT-2, 20 rounds on
# both clocks took about 1.5 s per candidate and round (benchmarks/gpu/README.md), and each
# further model adds its own rounds to a lent machine's 15 minutes. $GPU_CHECK_POLICIES (say,
# horovod,dear,auto) limits the candidates beside the two plain optimizers the same way: fewer
# candidates buy more rounds, and more rounds narrow the interval each verdict prints (Note [The
# range of a best round] in benchmarks/harness/overhead_report.py). $GPU_CHECK_INSTANCES (say, 4) builds
# the candidates that many times, $ROUNDS rounds each (Note [Builds of the candidates] in
# benchmarks/harness/overhead.py): on the H100 two identical plain optimizers settled 1.5-3% apart.
# $GPU_CHECK_WARMUP (say, 110) sets the warm-up steps of each build: a world of one steps as the
# plain optimizer from about iteration 80 (every policy) or 100 (`auto`) on (Note [A world of one
# steps as the plain optimizer] in commsched/runtime/modes/plain.py), and the benchmark's default
# warm-up is 30. A candidate "<policy> (engine kept)" never does, and measures the runtime's own
# cost per step (Note [The engine kept] in benchmarks/harness/overhead_report.py).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-benchmarks/gpu}"
ROUNDS="${ROUNDS:-6}"
CUDA_CHECK='import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'

PY=""
TRIED=()
for candidate in ${GPU_CHECK_PYTHON:-.venv/bin/python python3}; do
  [ -x "$candidate" ] || command -v "$candidate" >/dev/null 2>&1 || continue
  TRIED+=("$candidate")
  if "$candidate" -c "$CUDA_CHECK" 2>/dev/null; then PY="$candidate"; break; fi
done
if [ -z "$PY" ]; then
  echo "gpu_check: no CUDA device: torch.cuda.is_available() is not true for ${TRIED[*]:-any python}; nothing run" >&2
  exit 1
fi

echo "== gpu_check: build ($PY)" >&2
if [ "$PY" = .venv/bin/python ]; then
  scripts/setup.sh
else
  MAX_JOBS="$(nproc)" "$PY" setup.py -q build_ext --inplace >/dev/null
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PY" -c "import commsched._C"
mkdir -p "$OUT"
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1

echo "== gpu_check: overhead benchmark, GPU part" >&2
set +e
# The benchmark goes first: a lent machine's minutes are few, and a hung test must not eat the
# report (the first run, 2026-11-26, lost it that way). Each part has its own limit.
timeout "${GPU_CHECK_BENCH_S:-300}" env OVERHEAD_COMMAND="scripts/gpu_check.sh" \
  "$PY" -m benchmarks.harness.overhead --device cuda --free-running --rounds "$ROUNDS" \
  ${GPU_CHECK_MODELS:+--models "$GPU_CHECK_MODELS"} \
  ${GPU_CHECK_POLICIES:+--policies "$GPU_CHECK_POLICIES"} \
  ${GPU_CHECK_INSTANCES:+--instances "$GPU_CHECK_INSTANCES"} \
  ${GPU_CHECK_WARMUP:+--warmup "$GPU_CHECK_WARMUP"} --out "$OUT/overhead" 2>&1 \
  | tee "$OUT/overhead.log"
BENCH_RC=${PIPESTATUS[0]}
set -e

echo "== gpu_check: tests marked gpu" >&2
# Only the modules marked gpu (the pytestmark at their top) are collected: other modules import
# what a GPU machine's image may lack (Horovod, hypothesis), and one that fails to import stops
# the whole collection.
mapfile -t GPU_TESTS < <(grep -rlE --include='test_*.py' '^pytestmark = .*pytest\.mark\.gpu\b' tests \
  | sort)
set +e
timeout "${GPU_CHECK_TESTS_S:-300}" "$PY" -m pytest "${GPU_TESTS[@]}" -m gpu -q -rs -p no:cacheprovider \
  --junitxml="$OUT/junit.xml" 2>&1 | tee "$OUT/tests.log"
TESTS_RC=${PIPESTATUS[0]}
set -e

"$PY" - "$OUT" "$TESTS_RC" "$BENCH_RC" "${GPU_CHECK_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}" <<'PYEOF'
import datetime
import os
import sys

import torch

out, tests_rc, bench_rc, commit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
with open(os.path.join(out, "tests.log"), encoding="utf-8") as handle:
    lines = [line.strip() for line in handle if line.strip()]
summary = next((line for line in reversed(lines) if " in " in line and ("passed" in line
                or "failed" in line or "skipped" in line or "error" in line)), "(no summary)")
nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.distributed.is_nccl_available() \
    else "not available"
report = [
    "# GPU check", "",
    "Command: `scripts/gpu_check.sh`", "",
    f"- date (UTC): {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}",
    f"- commit: {commit}",
    f"- device: {torch.cuda.get_device_name(0)} ({torch.cuda.device_count()} visible)",
    f"- torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {nccl}", "",
    "## Tests marked gpu", "",
    f"`{summary}` (exit code {tests_rc}; full log: tests.log, junit.xml)", "",
    "## Overhead benchmark, GPU part", "",
    (f"See overhead/README.md (exit code {bench_rc}; log: overhead.log)." if bench_rc == 0
     else f"FAILED with exit code {bench_rc}"
     + (" (cut short by $GPU_CHECK_BENCH_S)" if bench_rc == 124 else "") + ": see overhead.log"
     + ("; overhead/README.md has the models that finished."
        if os.path.exists(os.path.join(out, "overhead", "README.md")) else ".")),
    "",
]
with open(os.path.join(out, "README.md"), "w", encoding="utf-8") as handle:
    handle.write("\n".join(report))
print("\n".join(report))
PYEOF

if [ "$TESTS_RC" -ne 0 ] || [ "$BENCH_RC" -ne 0 ]; then
  echo "gpu_check: FAILED (gpu tests exit $TESTS_RC, overhead exit $BENCH_RC); report in $OUT" >&2
  exit 1
fi
echo "gpu_check: passed; report in $OUT" >&2
