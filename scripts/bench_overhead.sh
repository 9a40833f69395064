#!/usr/bin/env bash
# Overhead benchmark: a world of one (no communication), every policy and `auto` beside the plain
# optimizer on the built-in MLP, CNN and Transformer, rounds interleaved, ratios of best medians,
# glibc's malloc keeping freed memory (commsched/bench/allocator.py says why).
# On a machine with a GPU (torch.cuda available) it runs again on the GPU, with GPT-2 124M when
# `transformers` is importable, timed both ways (Note [Two clocks on a GPU]).
# Writes benchmarks/overhead/<device>/{README.md,results.json,results.png}.
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
OUT="${OUT:-benchmarks/overhead}"
# 40 rounds: each candidate's figure is its best round, and with 24 (nine candidates) the CNN's
# bytescheduler read 1.031x plain in one run, and 1.005x in a 40-round run of the same code
# (bytescheduler, horovod and prophet beside the two plain optimizers).
ROUNDS="${ROUNDS:-40}"
# 110 warm-up steps: a world of one steps as the plain optimizer from about iteration 80 (every
# policy) or 100 (`auto`) on (Note [A world of one steps as the plain optimizer] in
# commsched/runtime/passthrough.py), so every timed round measures what a user gets from then on.
WARMUP="${WARMUP:-110}"
export OVERHEAD_COMMAND="scripts/bench_overhead.sh"
.venv/bin/python -m commsched.bench.overhead --device cpu --rounds "$ROUNDS" --warmup "$WARMUP" \
  --out "$OUT/cpu"
if .venv/bin/python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  .venv/bin/python -m commsched.bench.overhead --device cuda --free-running --rounds "$ROUNDS" \
    --warmup "$WARMUP" --out "$OUT/gpu"
else
  echo "bench_overhead: no GPU here (torch.cuda.is_available() is false): GPU part not run" >&2
fi
echo "bench_overhead: wrote $OUT" >&2
