# Sourced (not run) by the benchmark scripts after their `set -euo pipefail`: moves to the
# repository root (ROOT), sets it up if needed (scripts/setup.sh) and exports the environment
# every benchmark job runs under.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
scripts/setup.sh
export OMP_NUM_THREADS=1 PYTHONWARNINGS="ignore::UserWarning,ignore::FutureWarning"
# Horovod's own Gloo waits 30 s for a message by default; its baseline on 3 ranks of a shaped
# loopback, at up to 2.9 s per iteration, once exceeded that and ended the whole job. Horovod's
# wait then matches commsched's (COMMSCHED_TIMEOUT, 300 s); it changes no measured time.
export HOROVOD_GLOO_TIMEOUT_SECONDS="${HOROVOD_GLOO_TIMEOUT_SECONDS:-300}"

# Filter for a horovodrun job's combined output: rank 0's stdout lines, without their prefix.
# BENCH_LOG=path keeps the whole output (every rank's stderr too) there, appended.
rank0_stdout() {
  tee -a "${BENCH_LOG:-/dev/null}" | grep '\[0\]<stdout>' | sed 's/^\[0\]<stdout>://'
}
