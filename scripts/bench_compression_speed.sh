#!/usr/bin/env bash
# The benchmark job 'compression_speed' (benchmarks/harness/bench_jobs.py): 2 ranks on a shaped loopback: hvd (fp16), DDP's PowerSGD hook and every policy with PowerSGD and top-k.
# Knobs (environment, default): OUT (benchmarks/compression_speed), RATE (1gbit), RANK (4), TOPK (0.01), ROUNDS (5), STEPS (8). Arguments go to scripts/bench.sh.
exec "$(dirname "${BASH_SOURCE[0]}")/bench.sh" compression_speed "$@"
