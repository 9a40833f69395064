#!/usr/bin/env bash
# The benchmark job 'unshaped' (benchmarks/harness/bench_jobs.py): 2 ranks on the plain loopback, the CNN and the Transformer: every policy and auto against hvd and DDP.
# Knobs (environment, default): OUT (benchmarks/unshaped), ROUNDS (24). Arguments go to scripts/bench.sh.
exec "$(dirname "${BASH_SOURCE[0]}")/bench.sh" unshaped "$@"
