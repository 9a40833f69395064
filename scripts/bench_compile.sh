#!/usr/bin/env bash
# torch.compile under every policy: the built-in Transformer on 2 ranks under torchrun, inside a
# network namespace whose loopback is shaped to RATE (default 1gbit), eager and compiled runs
# side by side per policy. Counts the graph breaks of one steady-state forward pass and times
# both runs (scripts/compile_cost.py). Writes benchmarks/compile/{results.json,README.md}.
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
RATE="${RATE:-1gbit}"
OUT="${OUT:-benchmarks/compile}"
trap 'scripts/netem.sh down' EXIT
scripts/netem.sh up "$RATE"
BENCH_COMMAND="RATE=$RATE scripts/bench_compile.sh" OMP_NUM_THREADS=1 \
  scripts/netem.sh run .venv/bin/torchrun --nproc_per_node=2 --master_addr=127.0.0.1 \
  --master_port=29533 scripts/compile_cost.py --out "$OUT" \
  --note "Loopback shaped to $RATE; torch $(.venv/bin/python -c 'import torch; print(torch.__version__)'), CPU, default inductor backend." \
  "$@"
echo "bench_compile: wrote $OUT/README.md" >&2
