#!/usr/bin/env bash
# shard_optimizer (issue 57, items 3 and 5): memory and speed, with Adam (two state tensors per
# parameter).
#  * memory: one job per model, mode (plain dear, sharded dear, torch-zero: DDP with torch's
#    ZeroRedundancyOptimizer) and world size (RANKS, default "2 3"), unshaped: the optimizer state
#    each rank holds and its peak RSS (benchmarks.harness.shard_memory);
#  * speed: 2 ranks on a loopback shaped to SPEED_RATE (1gbit), ResNet-50, every candidate in one
#    job (commsched.bench.compare --memory): sharded dear beside dear, a control of dear, hvd,
#    torch DDP and torch-zero.
# `scripts/bench_shard.sh memory` and `scripts/bench_shard.sh speed` run one part each (no
# argument: both); MODELS (default "resnet50 vgg16 bert gpt2") chooses the memory jobs. Writes
# benchmarks/shard/{memory.jsonl, memory_command.txt, speed/results.*, README.md}.
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
OUT="${OUT:-benchmarks/shard}"
MODELS="${MODELS:-resnet50 vgg16 bert gpt2}"
RANKS="${RANKS:-2 3}"
PART="${1:-all}"
SPEED_RATE="${SPEED_RATE:-1gbit}"
ROUNDS="${ROUNDS:-4}"
mkdir -p "$OUT"
if [ "$PART" = all ] || [ "$PART" = memory ]; then
rm -f "$OUT/memory.jsonl"
echo "MODELS='$MODELS' RANKS='$RANKS' scripts/bench_shard.sh memory" > "$OUT/memory_command.txt"
for model in $MODELS; do
  for ranks in $RANKS; do
    for mode in plain sharded torch-zero; do
      .venv/bin/horovodrun -np "$ranks" --gloo .venv/bin/python -m benchmarks.harness.shard_memory \
        --model "$model" --mode "$mode" --out "$OUT/memory.jsonl" 2>&1 | rank0_stdout
    done
  done
done
fi
if [ "$PART" = all ] || [ "$PART" = speed ]; then
  trap 'scripts/netem.sh down' EXIT
  scripts/netem.sh up "$SPEED_RATE"
  mkdir -p "$OUT/speed"
  echo "SPEED_RATE=$SPEED_RATE ROUNDS=$ROUNDS scripts/bench_shard.sh speed" > "$OUT/speed_command.txt"
  DEAR="commsched:dear?fusion_threshold=4MiB"
  scripts/netem.sh run .venv/bin/horovodrun -np 2 --gloo .venv/bin/python -m commsched.bench.compare \
    --model resnet50 --batch-size 8 --rounds "$ROUNDS" --steps 4 --warmup 8 --optimizer adam \
    --memory --candidates "hvd,torch-ddp,torch-zero,$DEAR,$DEAR&shard_optimizer=1,$DEAR#control" \
    --link-note "loopback shaped to $SPEED_RATE" --out "$OUT/speed" 2>&1 | rank0_stdout
fi
.venv/bin/python scripts/shard_report.py "$OUT"
echo "bench_shard: wrote $OUT/README.md" >&2
