#!/usr/bin/env bash
# The benchmark job 'scale' (benchmarks/harness/bench_jobs.py): each real model measured on 2 ranks of the plain loopback, then the simulator's sweep from its profile: 8 to 256 workers, 1 to 100 Gbit/s.
# Knobs (environment, default): OUT (benchmarks/scale), MODELS (resnet50 vgg16 bert gpt2), WORKERS (8,16,32,64,128,256), BANDWIDTHS (1gbit,10gbit,25gbit,100gbit), SIMULATE_ONLY (empty). Arguments go to scripts/bench.sh.
exec "$(dirname "${BASH_SOURCE[0]}")/bench.sh" scale "$@"
