#!/usr/bin/env bash
# The benchmark driver: runs one job of the table in benchmarks/harness/bench_jobs.py (shape the
# link, launch its runs, write its README; Note [One driver, a table of jobs] in
# benchmarks/harness/driver.py). Each job's knobs are environment variables:
#   scripts/bench.sh --list                  the jobs
#   CNN_RATE=2gbit scripts/bench.sh overlap  one job
#   scripts/bench.sh overlap --dry-run       its commands, nothing run
# The scripts/bench_<job>.sh of a job in the table call this.
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
exec .venv/bin/python -m benchmarks.harness.driver "$@"
