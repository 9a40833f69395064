#!/usr/bin/env bash
# The benchmark job 'zoo' (benchmarks/harness/bench_jobs.py): eight architectures nobody tuned for, from transformers configs, 2 ranks on a link where hvd waits about half its iteration: every policy at its defaults against hvd and DDP, with the floor.
# Knobs (environment, default): OUT (benchmarks/zoo), MODELS (all eight), ROUNDS (4), REPORT_ONLY (0: run, 1: only rewrite the report), RATE_<MODEL> (each architecture's link). Arguments go to scripts/bench.sh.
exec "$(dirname "${BASH_SOURCE[0]}")/bench.sh" zoo "$@"
