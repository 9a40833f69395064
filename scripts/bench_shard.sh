#!/usr/bin/env bash
# The benchmark job 'shard' (benchmarks/harness/bench_jobs.py): shard_optimizer with Adam: the state each rank holds and its peak RSS (memory), and its speed on ResNet-50 at 1 Gbit/s (speed).
# Knobs (environment, default): OUT (benchmarks/shard), MODELS (resnet50 vgg16 bert gpt2), RANKS (2 3), SPEED_RATE (1gbit), ROUNDS (4). An argument, memory or speed, runs one part (none: both). Arguments go to scripts/bench.sh.
exec "$(dirname "${BASH_SOURCE[0]}")/bench.sh" shard "$@"
