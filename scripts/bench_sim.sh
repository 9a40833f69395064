#!/usr/bin/env bash
# Simulator validation (issue: what-if simulator, item 5): every policy and `auto` on the built-in
# CNN and Transformer at two shaped bandwidths, 2 ranks (and the CNN on 3 ranks at one); each
# commsched candidate's plan is simulated from its own profile as it stands at the end of the
# run and set beside the measured median. 8 rounds of 8 steps, as the overlap benchmark: with 2,
# the 2 Gbit/s CNN's overlap candidates measured 11-18% above their predictions in one run, and
# bytescheduler 10% below its own in the next; with 3, bytescheduler measured 166.5 ms (p10-p90
# 148.7-201.7) against a prediction of 145.5, and prophet, planning the same blocks on two of
# its four profiles, 158.2 ms in the same job; with 5, the worst of the 35 predictions read
# 12.6%, 6.4%, 13.7% and 8.9% in four runs in a row, the measured medians moving by a few percent
# from one run to the next. Writes
# benchmarks/sim_validation/<model>-<rate>/results.* (and predict/: what each prediction was
# made from, so that a change to the fit or the simulator can be checked on these runs) and
# README.md. REPORT_ONLY=1 rebuilds README.md from the
# results already there (after scripts/bench_compression_speed.sh re-ran, whose runs its last
# section validates), running nothing. PARTS (default "policies sharded") chooses what runs; a
# part left out is reported from its results already there. "sharded": shard_optimizer (issue
# 57, item 6) with Adam at SHARDED_RATE (1gbit), the CNN and the Transformer on 2 ranks and the
# CNN on 3: each synchronous policy and dear sharded, beside unsharded horovod and dear, and
# `auto` sharded; written to benchmarks/sim_validation/sharded-<model>-<rate>[-3ranks].
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
RATES="${RATES:-1gbit 2gbit}"
THREE_RANKS_RATE="${THREE_RANKS_RATE:-1gbit}"  # the rate at which the CNN also runs on 3 ranks
OUT="${OUT:-benchmarks/sim_validation}"
CANDIDATES="local (no comm),hvd,commsched:horovod,commsched:ddp,commsched:mgwfbp,commsched:bytescheduler?partition_bytes=2MiB&credit_bytes=4MiB,commsched:prophet?partition_bytes=2MiB&credit_bytes=4MiB,commsched:dear?fusion_threshold=4MiB,commsched:auto"
PARTS="${PARTS:-policies sharded}"
SHARDED_RATE="${SHARDED_RATE:-1gbit}"
SHARDED_CANDIDATES="commsched:horovod,commsched:horovod?shard_optimizer=1,commsched:ddp?shard_optimizer=1,commsched:mgwfbp?shard_optimizer=1,commsched:dear?fusion_threshold=4MiB,commsched:dear?fusion_threshold=4MiB&shard_optimizer=1,commsched:auto?shard_optimizer=1"
runs() { [ "${REPORT_ONLY:-0}" != 1 ] && [[ " $PARTS " == *" $1 "* ]]; }
trap 'scripts/netem.sh down' EXIT
results=()
for rate in $RATES; do
  runs policies && scripts/netem.sh up "$rate"
  specs=("cnn 64 2" "transformer 8 2")
  [ "$rate" = "$THREE_RANKS_RATE" ] && specs+=("cnn 64 3")
  for spec in "${specs[@]}"; do
    set -- $spec
    dir="$OUT/$1-$rate"
    [ "$3" = 2 ] || dir="$dir-$3ranks"
    results+=("$dir/results.json")
    runs policies || continue
    scripts/netem.sh run .venv/bin/horovodrun -np "$3" --gloo .venv/bin/python -m benchmarks.harness.compare_predict \
      --model "$1" --batch-size "$2" --rounds "${ROUNDS:-8}" --steps 8 --warmup 28 --candidates "$CANDIDATES" \
      --predict-dir "$dir/predict" --link-note "loopback shaped to $rate" --out "$dir" 2>&1 \
      | rank0_stdout
  done
done
sharded=()
runs sharded && scripts/netem.sh up "$SHARDED_RATE"
for spec in "cnn 64 2" "transformer 8 2" "cnn 64 3"; do
  set -- $spec
  dir="$OUT/sharded-$1-$SHARDED_RATE"
  [ "$3" = 2 ] || dir="$dir-$3ranks"
  sharded+=("$dir/results.json")
  runs sharded || continue
  scripts/netem.sh run .venv/bin/horovodrun -np "$3" --gloo .venv/bin/python -m benchmarks.harness.compare_predict \
    --model "$1" --batch-size "$2" --rounds "${ROUNDS:-8}" --steps 8 --warmup 28 --optimizer adam \
    --memory --candidates "$SHARDED_CANDIDATES" --predict-dir "$dir/predict" \
    --link-note "loopback shaped to $SHARDED_RATE" --out "$dir" 2>&1 | rank0_stdout
done
{
  echo "# Simulator validation: predicted vs measured iteration time, 2 ranks (and 3 on the CNN at $THREE_RANKS_RATE)"
  echo
  echo "Command: \`RATES=\"$RATES\" THREE_RANKS_RATE=$THREE_RANKS_RATE scripts/bench_sim.sh\`. Each setting is one horovodrun job (candidates interleaved, steady-state medians as in benchmarks/overlap); each commsched plan is simulated (\`commsched.sim\`, fitted α/β per collective, synchronous or cross-iteration mode) from that candidate's own profile as it stands at the end of the run, the world's (the collectives of the rank the others waited for, whose took the least time in all, and each gradient ready when the last rank had it, iteration by iteration: Note [The rank the others wait for] and Note [Every rank's gradients] in \`runtime/planning/world_profile.py\`; the profiler keeps the latest iterations; the first ones are warm-up: a Transformer's backward ran 4x slower for about ten steps). \`auto\` is simulated the same way with the plan it installed (its own prediction when it chose is in the line below each table); an iteration's collectives are never predicted to move their wire bytes faster than the link's bulk rate, from the all-reduce of every gradient each job measures (one block may) (Note [No faster than the link's bulk rate] in \`sim/network.py\`); each setting's \`predict/\` keeps what its predictions were made from. 28 warm-up steps per candidate cover its profiling steps and its 20-step check, and \`auto\` steps on, untimed, until its re-plan and trials of close runners-up are over."
  echo
  .venv/bin/python -m benchmarks.harness.sim_validation "${results[@]}"
  compressed=(benchmarks/compression_speed/*/results.json)
  if [ -e "${compressed[0]}" ]; then
    echo
    echo "## Compressed runs"
    echo
    echo "The runs of benchmarks/compression_speed (\`scripts/bench_compression_speed.sh\`, 2 ranks at 1 Gbit/s), each compressed plan simulated with the compressor's own wire tensors and measured compute (sim/compressed.py) instead of a bare ratio; target: within 15%."
    echo
    .venv/bin/python -m benchmarks.harness.sim_validation "${compressed[@]}"
  fi
  if [ -e "${sharded[0]}" ]; then
    echo
    echo "## Sharded runs"
    echo
    echo "\`shard_optimizer=True\` (docs/sharding.md) with Adam at $SHARDED_RATE, \`PARTS=sharded scripts/bench_sim.sh\`: each sharded plan simulated from its own run's profile, whose \`update_shards\` says its updates were of slices (sim/sharded.py: the sharded plan's reduce-scatters and all-gathers, one optimizer call per block on 1/N of it), beside the unsharded horovod and dear of the same job; target: within 15%."
    echo
    .venv/bin/python -m benchmarks.harness.sim_validation "${sharded[@]}"
  fi
  for r in "${results[@]}" "${sharded[@]}"; do
    d="$(dirname "$r")"; [ -e "$d/results.md" ] || continue
    echo; sed 's/^# /## /' "$d/results.md"
  done
} > "$OUT/README.md"
echo "bench_sim: wrote $OUT/README.md" >&2
