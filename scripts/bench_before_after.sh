#!/usr/bin/env bash
# A refactoring's cost, before against after, in one job: the code at BASE (a commit) and the
# checkout side by side, alternating, ROUNDS times each. Three measures:
#   - Python calls per iteration in a world of one that keeps the engine (scripts/python_calls.py
#     --engine-kept; a count, not a timing);
#   - the overhead benchmark's world of one (benchmarks/harness/overhead.py): the plain optimizer
#     and the overlap policies with the engine kept, each run's ratio over its own plain optimizer;
#   - the CNN on 2 ranks at RATE (a shaped loopback, scripts/netem.sh): torch DDP, horovod and
#     dear, each run's ratio over its own torch DDP.
# BASE's C++ must be the checkout's (its extension is copied, not built).
# Writes $OUT/{README.md,results.json,results.png}.
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
BASE="${BASE:?set BASE to the commit to compare against}"
OUT="${OUT:-benchmarks/overhead/before_after}"
REPORT="$OUT"  # as given, for the report's paths
ROUNDS="${ROUNDS:-2}"
RATE="${RATE:-1gbit}"
BASE_DIR="$(mktemp -d /tmp/commsched-base.XXXXXX)"
cleanup() { scripts/netem.sh down; git worktree remove --force "$BASE_DIR" 2>/dev/null || true; }
trap cleanup EXIT
git worktree add -q --detach "$BASE_DIR" "$BASE"
if ! git diff --quiet "$BASE" HEAD -- csrc setup.py; then
  echo "bench_before_after: csrc/ or setup.py differ between $BASE and HEAD; build $BASE first" >&2
  git diff --stat "$BASE" HEAD -- csrc setup.py >&2
fi
cp commsched/_C*.so commsched/_build_info.json "$BASE_DIR/commsched/"
# Absolute: each side's runs start in their own tree.
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
scripts/netem.sh up "$RATE"
CANDIDATES="torch-ddp,commsched:horovod,commsched:dear?fusion_threshold=4MiB"
for round in $(seq "$ROUNDS"); do
  for side in base head; do
    dir="$ROOT"; [ "$side" = base ] && dir="$BASE_DIR"
    run="$OUT/$side-$round"
    mkdir -p "$run"
    (cd "$dir" && PYTHONPATH="$dir" "$ROOT/.venv/bin/python" "$ROOT/scripts/python_calls.py" \
      --engine-kept --models mlp transformer --policies horovod bytescheduler dear) > "$run/calls.md"
    (cd "$dir" && PYTHONPATH="$dir" "$ROOT/.venv/bin/python" -m benchmarks.harness.overhead \
      --device cpu --models mlp,cnn --instances 2 --rounds 6 --warmup 110 \
      --policies "bytescheduler (engine kept),dear (engine kept)" --out "$run/overhead") >/dev/null
    # The run's own README speaks of its side's code (where its Notes were then); the report
    # reads results.json only.
    rm -f "$run/overhead/README.md"
    (cd "$dir" && "$ROOT/scripts/netem.sh" run "$ROOT/.venv/bin/horovodrun" -np 2 --gloo \
      env PYTHONPATH="$dir" "$ROOT/.venv/bin/python" -m commsched.bench.compare --model cnn \
      --batch-size 64 --rounds 4 --steps 8 --warmup 12 --candidates "$CANDIDATES" \
      --link-note "loopback shaped to $RATE" --out "$run/cnn") 2>&1 | rank0_stdout >/dev/null
  done
done
.venv/bin/python -m benchmarks.harness.before_after --out "$REPORT" --base "$BASE" \
  --rounds "$ROUNDS" --rate "$RATE" \
  --command "BASE=$BASE ROUNDS=$ROUNDS RATE=$RATE scripts/bench_before_after.sh"
echo "bench_before_after: wrote $OUT/README.md" >&2
