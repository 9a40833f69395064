#!/usr/bin/env bash
# Overhead benchmark: a world of one (no communication), every policy and `auto` beside the plain
# optimizer on the built-in MLP, CNN and Transformer, rounds interleaved, ratios of best medians,
# glibc's malloc keeping freed memory (benchmarks/harness/allocator.py says why).
# On a machine with a GPU (torch.cuda available) it runs again on the GPU, with GPT-2 124M when
# `transformers` is importable, timed both ways (Note [Two clocks on a GPU]).
# Writes benchmarks/overhead/<device>/{README.md,results.json,results.png}.
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
OUT="${OUT:-benchmarks/overhead}"
# 4 builds of every candidate, 10 rounds each (Note [Builds of the candidates] in
# benchmarks/harness/overhead.py): past its warm-up every policy runs the user's optimizer passed
# through, so with one build the candidates differ only by where each copy of the model landed
# in memory: 3.0% (CNN) and 3.7% (Transformer) between six policies running identical code, and
# `auto` read 1.030x and 1.033x "the fastest policy", the luckiest copy. With 4 builds the CNN's
# policies read 1.001-1.007x plain and `auto` 1.003x the fastest (benchmarks/overhead/
# cnn_builds_cpu/). 40 rounds in all, as many as the one-build runs had. The fastest of six
# copies stays biased low even so, and the report prints beside `auto` what the control reads
# by the same figure (Note [What no commsched code reads against the fastest policy]).
INSTANCES="${INSTANCES:-4}"
ROUNDS="${ROUNDS:-10}"
# 110 warm-up steps: a world of one steps as the plain optimizer from about iteration 80 (every
# policy) or 100 (`auto`) on (Note [A world of one steps as the plain optimizer] in
# commsched/runtime/modes/plain.py), so every timed round measures what a user gets from then on.
WARMUP="${WARMUP:-110}"
export OVERHEAD_COMMAND="scripts/bench_overhead.sh"
.venv/bin/python -m benchmarks.harness.overhead --device cpu --instances "$INSTANCES" --rounds "$ROUNDS" \
  --warmup "$WARMUP" --out "$OUT/cpu"
if .venv/bin/python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  .venv/bin/python -m benchmarks.harness.overhead --device cuda --free-running --instances "$INSTANCES" \
    --rounds "$ROUNDS" --warmup "$WARMUP" --out "$OUT/gpu"
else
  echo "bench_overhead: no GPU here (torch.cuda.is_available() is false): GPU part not run" >&2
fi
echo "bench_overhead: wrote $OUT" >&2
