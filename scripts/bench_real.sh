#!/usr/bin/env bash
# The benchmark job 'real' (benchmarks/harness/bench_jobs.py): ResNet-50, VGG-16, BERT-base and GPT-2 at full size on a shaped loopback: every policy against hvd and DDP, with the floor.
# Knobs (environment, default): OUT (benchmarks/real), MODELS (resnet50 gpt2), RANKS (2), RESNET50_RATE (2gbit), GPT2_RATE (6gbit), VGG16_RATE (10gbit), BERT_RATE (3gbit), ROUNDS (4), JOBS (all synchronous overlap auto). Arguments go to scripts/bench.sh.
exec "$(dirname "${BASH_SOURCE[0]}")/bench.sh" real "$@"
