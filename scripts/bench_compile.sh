#!/usr/bin/env bash
# The benchmark job 'compile' (benchmarks/harness/bench_jobs.py): 2 ranks under torchrun on a shaped loopback, the Transformer: eager against torch.compile per policy, graph breaks counted.
# Knobs (environment, default): OUT (benchmarks/compile), RATE (1gbit), ARGS (empty). Arguments go to scripts/bench.sh.
exec "$(dirname "${BASH_SOURCE[0]}")/bench.sh" compile "$@"
