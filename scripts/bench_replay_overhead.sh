#!/usr/bin/env bash
# The benchmark job 'replay_overhead' (benchmarks/harness/bench_jobs.py): a world of one replaying ResNet-50, BERT and GPT-2 at a GPU's pace (the testbed's profiles): every policy, its engine kept, beside the plain optimizer.
# Knobs (environment, default): OUT (benchmarks/cluster/overhead), MODELS (resnet50 bert gpt2), K (256: the byte scale), INSTANCES (2), ROUNDS (10), WARMUP (110). Arguments go to scripts/bench.sh.
exec "$(dirname "${BASH_SOURCE[0]}")/bench.sh" replay_overhead "$@"
