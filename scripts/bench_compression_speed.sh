#!/usr/bin/env bash
# Compression speed benchmark (issue 15, item 6): 2 ranks inside a network namespace whose
# loopback is shaped to RATE (1 Gbit/s), the built-in CNN and Transformer, side by side in one
# horovodrun job per model: hvd uncompressed and fp16, DDP with its PowerSGD hook (rank 4),
# every commsched policy and auto with PowerSGD rank 4 and with top-k 1%. Writes
# benchmarks/compression_speed/<model>/results.{json,md,png} (median iteration times, bytes per
# iteration of each candidate, the simulator's prediction for each commsched candidate from its
# own profile) and a summary with the issue's targets.
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
RATE="${RATE:-1gbit}"
RANK="${RANK:-4}"
TOPK="${TOPK:-0.01}"
OUT="${OUT:-benchmarks/compression_speed}"
# A namespace of its own: another benchmark may hold the default one.
export NETNS="${NETNS:-cscompress}"
PSGD="compression=powersgd&powersgd_rank=$RANK"
TOPK_KNOBS="compression=topk&topk_ratio=$TOPK"
CANDIDATES="local (no comm),hvd,hvd-fp16,torch-ddp,torch-ddp-powersgd?rank=$RANK&start_iter=2&min_rate=2"
for policy in horovod ddp mgwfbp bytescheduler prophet dear auto; do
  CANDIDATES="$CANDIDATES,commsched:$policy?$PSGD,commsched:$policy?$TOPK_KNOBS"
done
trap 'scripts/netem.sh down' EXIT
# 5 rounds of 8 steps: with 3, the Transformer's best PowerSGD candidate read 0.87x and 0.91x
# DDP's hook in two runs on one day, a spread as wide as its distance to the 0.9 target.
run() {  # model batch out
  scripts/netem.sh up "$RATE"
  # 18 warm-up steps cover commsched's profiling steps, its steady-state re-plan ten steps later
  # (Note [Planning from the steady state]) and DDP's start_powerSGD_iter.
  scripts/netem.sh run .venv/bin/horovodrun -np 2 --gloo .venv/bin/python -m commsched.bench.compare \
    --model "$1" --batch-size "$2" --rounds "${ROUNDS:-5}" --steps "${STEPS:-8}" --warmup 18 \
    --candidates "$CANDIDATES" --predict --link-note "loopback shaped to $RATE" \
    --out "$OUT/$3" 2>&1 | rank0_stdout
}
run cnn 64 cnn
run transformer 8 transformer
{
  echo "# Compression speed: 2 ranks, loopback shaped to $RATE"
  echo
  echo "Command: \`RATE=$RATE RANK=$RANK TOPK=$TOPK scripts/bench_compression_speed.sh\` (each model: one horovodrun job, candidates interleaved round by round; iteration time = time between the slowest rank's consecutive step completions)."
  echo
  echo "payload MB/iter: what one rank hands to its collectives per iteration (all-reduce: the buffer; all-gather: its own share); sent MB/iter: what it sends on a ring (commsched.bench.compression_speed). predicted ms: the simulator from the candidate's own profile, with the compressor's wire tensors and measured compute (docs/simulator.md)."
  for m in cnn transformer; do
    echo; sed 's/^# /## /' "$OUT/$m/results.md"; echo
    echo "Targets (commsched + PowerSGD rank $RANK at most 0.9x DDP + PowerSGD hook and 0.6x hvd):"
    echo; .venv/bin/python -m benchmarks.harness.compression_targets "$OUT/$m/results.json"
    echo; echo "![$m]($m/results.png)"
  done
} > "$OUT/README.md"
echo "bench_compression_speed: wrote $OUT/README.md" >&2
