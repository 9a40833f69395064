#!/usr/bin/env bash
# Scale by simulation, calibrated on measurement (issue 55, item 4). For each real model
# (commsched/bench/real_models.py: full-size gradients, reduced inputs):
#   1. one 2-rank torchrun job on this machine's loopback (no shaping, no Horovod) times
#      `local (no comm)`, commsched's `horovod`, `ddp` and `dear` side by side, with --predict:
#      each commsched candidate's own profile predicts its measured iteration (validation rows),
#      and the `horovod` candidate's profile is kept;
#   2. the simulator predicts 8 to 256 workers at 1, 10, 25 and 100 Gbit/s from the `dear`
#      candidate's profile (an overlap policy's profile records the forward modules that the
#      overlap policies' predictions need; a synchronous one's does not), for every policy and
#      for PowerSGD (rank 4). SIMULATE_ONLY=1 redoes this step from the kept profiles.
# Writes benchmarks/scale/<model>/{validation.md,results.json,scaling.png,table.md} and
# benchmarks/scale/README.md. MODELS, WORKERS, BANDWIDTHS override the defaults.
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
OUT="${OUT:-benchmarks/scale}"
MODELS="${MODELS:-resnet50 vgg16 bert gpt2}"
WORKERS="${WORKERS:-8,16,32,64,128,256}"
BANDWIDTHS="${BANDWIDTHS:-1gbit,10gbit,25gbit,100gbit}"
CANDIDATES="local (no comm),commsched:horovod,commsched:ddp,commsched:dear?fusion_threshold=4MiB"
declare -A BATCH=([resnet50]=8 [vgg16]=8 [bert]=4 [gpt2]=4)
for model in $MODELS; do
  dir="$OUT/$model"
  if [ -z "${SIMULATE_ONLY:-}" ]; then
    rm -rf "$dir"
    mkdir -p "$dir"
    # Four candidates of a 110-138 M parameter model per rank fit this 24 GB machine
    # (docs/examples.md); one all-reduce of every gradient is measured for the floor.
    .venv/bin/torchrun --standalone --nproc_per_node=2 -m benchmarks.harness.compare_predict \
      --model "$model" --batch-size "${BATCH[$model]}" --candidates "$CANDIDATES" \
      --warmup 8 --rounds 3 --steps 4 --predict-dir "$dir/profiles" \
      --link-note "loopback, unshaped" --out "$dir/measured" 2>&1 | tee "$dir/measured.log" \
      | grep -v "^\[rank1\]" | tail -n 40
  fi
  # candidate3 is commsched:dear (its index in CANDIDATES).
  .venv/bin/python -m commsched simulate --profile "$dir/profiles/candidate3.json" \
    --workers "$WORKERS" --bandwidth "$BANDWIDTHS" --latency 20us --algorithm ring \
    --policy all --compression 1,powersgd:4 --json "$dir/results.json" \
    --plot "$dir/scaling.png" --markdown "$dir/table.md" > /dev/null
done
.venv/bin/python scripts/scale_report.py "$OUT" $MODELS \
  --command "MODELS='$MODELS' WORKERS=$WORKERS BANDWIDTHS=$BANDWIDTHS scripts/bench_scale.sh"
echo "bench_scale: wrote $OUT/README.md" >&2
