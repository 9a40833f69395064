#!/usr/bin/env bash
# The cluster testbed: hosts as network namespaces, a shaped link per host, one torchrun agent
# per host (benchmarks/harness/testbed.py; Note [The testbed's network]). Needs root.
#   scripts/cluster.sh run --hosts H --ranks-per-host G --rate 10gbit [--delay 50us] -- JOB...
#   scripts/cluster.sh down [--prefix P]
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
exec "$PY" -m benchmarks.harness.testbed "$@"
