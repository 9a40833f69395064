#!/usr/bin/env bash
# The chaos run (issue 58, item 2): TRIALS (20) trials, each killing a random rank at a random
# point (forward, backward, inside step(), during a checkpoint save) of a training job under
# elastic Horovod (3 workers, --min-np 2) or torchrun --max-restarts with commsched.checkpoint,
# across every policy. Bounded: at most TRIALS trials, none started after DEADLINE_S (1800)
# seconds, each killed after TRIAL_TIMEOUT_S (240); it stops by itself. Each trial must end
# resumed and equal to a one-process replay of its committed history, or (no restart left)
# failed with the killed rank named within COMMSCHED_TIMEOUT + 10 s; the exit status says
# whether every one did. Writes benchmarks/chaos/results.{json,md,png}; a trial that did not
# end as it must keeps its folder under /tmp/commsched-chaos. Unshaped: nothing is timed.
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
export HOROVOD_GLOO_TIMEOUT_SECONDS=20  # a survivor's Horovod notices the dead peer sooner
.venv/bin/python -m benchmarks.harness.chaos --trials "${TRIALS:-20}" --seed "${SEED:-0}" \
  --deadline-s "${DEADLINE_S:-1800}" --trial-timeout-s "${TRIAL_TIMEOUT_S:-240}" \
  --out "${OUT:-benchmarks/chaos}"
