#!/usr/bin/env bash
# Scale measured at 4 and 8 ranks (issue 55, item 4), the validation rows that this 2-core
# machine cannot give, on a machine of 16 cores that has neither ip, tc nor Horovod (a lent GPU
# machine: torch, no package registry). torchrun only.
#
#   scripts/device_scale.sh fetch   where apt works: download iproute2 and the libraries its
#                                   ip and tc link into .iproute2/ (git-ignored; carry it)
#   scripts/device_scale.sh         measure and write $OUT (default benchmarks/scale/device/)
#
# For each model in $MODELS (default "resnet50 gpt2") and each rank count in $RANKS (default
# "4 8"), one torchrun job of commsched.bench.compare times `local (no comm)`, commsched's
# `horovod`, `ddp` and `dear` side by side with --predict-dir: each candidate's own profile
# predicts its measured iteration, and the profiles are kept for `python -m commsched simulate`.
# The jobs run inside a network namespace whose loopback is shaped to $RATE (default 10gbit,
# scripts/netem.sh) when ip and tc can make one; ip and tc come from PATH, else from the
# packages in $IPROUTE2_DEBS (default .iproute2), unpacked into a temporary folder. Where the
# kernel refuses (gVisor has no tc), the jobs run on the plain loopback and the report says so.
# A job starts only while $BUDGET_S (default 450) seconds have not passed and runs under what is
# left of them, so the script ends within about 8 minutes; a job cut short leaves no rows.
#
# Where torch sees a GPU, each model in $GPU_MODELS (default all four) is first recorded on it
# (benchmarks.harness.device_profile: a world of one at the inputs the model trains on, its plain
# step timed beside the profile's compute, Note [Device time on the host's clock]) and the
# simulator predicts 8 to 256 workers at 10, 25 and 100 Gbit/s from that profile:
# $OUT/gpu/<model>/{profile,recording,results}.json, table.md (scaling.png where matplotlib is).
# These go first, within $GPU_BUDGET_S (default 200) of $BUDGET_S. Where both of a model's rank
# counts finished, each is predicted from the other's profiles: $OUT/cross_size/.
#
# Python: .venv/bin/python where scripts/setup.sh made one, else python3 (the GPU machines'
# image), whose build of commsched._C goes in place, as in scripts/gpu_check.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
DEBS="${IPROUTE2_DEBS:-.iproute2}"
PACKAGES="iproute2 libbpf1 libelf1 libmnl0 libbsd0 libmd0 libcap2 libxtables12 zlib1g"

if [ "${1:-}" = fetch ]; then
  mkdir -p "$DEBS"
  (cd "$DEBS" && apt-get download $PACKAGES)
  echo "device_scale: $(ls "$DEBS" | wc -l) packages in $DEBS; carry it" >&2
  exit 0
fi

OUT="${OUT:-benchmarks/scale/device}"
MODELS="${MODELS:-resnet50 gpt2}"
GPU_MODELS="${GPU_MODELS:-resnet50 vgg16 bert gpt2}"
GPU_BUDGET_S="${GPU_BUDGET_S:-200}"
RANKS="${RANKS:-4 8}"
RATE="${RATE:-10gbit}"
BUDGET_S="${BUDGET_S:-450}"
WARMUP="${WARMUP:-6}" ROUND_COUNT="${ROUND_COUNT:-2}" STEPS="${STEPS:-3}"
# A candidate is timed once its plan has settled (optimizer.plan_settled): by default after 5
# profiling steps and 10 of its first plan. Here 3 and 3, so that the settled plans run from the
# warm-up's end: with every rank's traffic on one shaped loopback, a step of GPT-2 on 8 ranks
# moves about 7 GB, and 9 more steps per candidate would not fit the budget.
SETTLE="profile_steps=3&refine_steps=3"
CANDIDATES="local (no comm),commsched:horovod?$SETTLE,commsched:ddp?$SETTLE"
CANDIDATES="$CANDIDATES,commsched:dear?fusion_threshold=4MiB&$SETTLE"
declare -A BATCH=([resnet50]=8 [vgg16]=8 [bert]=4 [gpt2]=1 [cnn]=32 [transformer]=16 [mlp]=64)
START=$SECONDS
export NETNS="${NETNS:-csscale}"  # not bench_*'s csnet: a benchmark may be running beside
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1 PYTHONWARNINGS="ignore::UserWarning,ignore::FutureWarning"

if [ -x .venv/bin/python ]; then
  PY=.venv/bin/python
else
  PY=python3
  if ! "$PY" -c "import commsched._C" 2>/dev/null; then
    echo "== device_scale: build commsched._C in place ($PY)" >&2
    MAX_JOBS="$(nproc --all)" "$PY" setup.py -q build_ext --inplace >/dev/null
  fi
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PY" -c "import commsched._C"

# ip and tc: from PATH where they run, else unpacked from the packages. The libraries they link
# are loaded through wrappers, so Python never sees the unpacked zlib. Sets TOOLS to what was
# found, or to why nothing was.
unpack_deb() {  # deb root
  if command -v dpkg-deb >/dev/null 2>&1; then dpkg-deb -x "$1" "$2"; return; fi
  local work; work="$(mktemp -d)"
  (cd "$work" && ar x "$ROOT/$1" && tar -xf data.tar.* -C "$2")
}
iproute2() {
  if [ -z "${IPROUTE2_UNPACK:-}" ] && ip -V >/dev/null 2>&1 && tc -V >/dev/null 2>&1; then
    TOOLS="ip and tc from PATH"; return 0
  fi
  if ! compgen -G "$DEBS/*.deb" >/dev/null; then
    TOOLS="no ip or tc, and no packages in $DEBS (scripts/device_scale.sh fetch)"; return 1
  fi
  local root deb tool bin libs
  root="$(mktemp -d)"
  for deb in "$DEBS"/*.deb; do unpack_deb "$deb" "$root"; done
  mkdir -p "$root/wrap"
  libs="$root/usr/lib/x86_64-linux-gnu:$root/lib/x86_64-linux-gnu"
  for tool in ip tc; do
    bin="$(ls "$root"/{bin,sbin,usr/bin,usr/sbin}/"$tool" 2>/dev/null | head -n 1)"
    [ -n "$bin" ] || { TOOLS="$tool is not in the packages of $DEBS"; return 1; }
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$libs" "$bin" > "$root/wrap/$tool"
    chmod +x "$root/wrap/$tool"
  done
  export PATH="$root/wrap:$PATH"
  if ! { ip -V && tc -V; } >/dev/null 2>&1; then
    TOOLS="the ip or tc unpacked from $DEBS does not run"; return 1
  fi
  TOOLS="ip and tc unpacked from $DEBS"
}

LAUNCH=()
TOOLS=""
SHAPE_ERROR=""
if iproute2 && SHAPE_ERROR="$(scripts/netem.sh up "$RATE" 2>&1)"; then
  LAUNCH=(scripts/netem.sh run)
  LINK="loopback of a network namespace shaped to $RATE ($TOOLS)"
  trap 'scripts/netem.sh down' EXIT
else
  LINK="loopback, unshaped (no shaping: $(echo "${SHAPE_ERROR:-$TOOLS}" | tail -n 1))"
fi
echo "== device_scale: $LINK" >&2

mkdir -p "$OUT"
# Seconds left of budget $1 counted from $2, or a line saying $4 was skipped (at most $3 left).
time_left() {  # budget since minimum what
  local left=$(($1 - (SECONDS - $2)))
  if [ "$left" -le "$3" ]; then
    echo "== device_scale: $4 skipped: $1 s spent" >&2; return 1
  fi
  echo "$left"
}
# Runs the rest of the line with its output in log; when it fails, says so with the log's tail.
logged() {  # what log command...
  local what="$1" log="$2"; shift 2
  echo "== device_scale: $what" >&2
  "$@" > "$log" 2>&1 && return 0
  echo "== device_scale: $what failed or ran out of time; see $log" >&2
  tail -n 5 "$log" >&2; return 1
}
gpu_profile() {  # model dir seconds: the recording and the sweep, both within the seconds
  local end=$((SECONDS + $3))
  timeout --kill-after=10 "$3" "$PY" -m benchmarks.harness.device_profile --model "$1" \
    --device cuda --out "$2" \
  && timeout --kill-after=10 "$((end - SECONDS))" "$PY" -m commsched simulate \
    --profile "$2/profile.json" \
    --workers 8,16,32,64,128,256 --bandwidth 10gbit,25gbit,100gbit --latency 20us \
    --algorithm ring --policy all --compression 1,powersgd:4 --json "$2/results.json" \
    --markdown "$2/table.md" ${PLOT[@]+"${PLOT[@]}" "$2/scaling.png"}
}

GPU_DONE=()
if "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  PLOT=()
  "$PY" -c "import matplotlib" 2>/dev/null && PLOT=(--plot)
  GPU_START=$SECONDS
  for model in $GPU_MODELS; do
    # Within both budgets: the GPU profiles' own, and what the build left of the whole run's.
    left="$(time_left "$GPU_BUDGET_S" "$GPU_START" 60 "$model's GPU profile")" || continue
    whole="$(time_left "$BUDGET_S" "$START" 60 "$model's GPU profile")" || continue
    [ "$whole" -lt "$left" ] && left="$whole"
    rm -rf "$OUT/gpu/$model"
    logged "$model's GPU profile (at most $left s)" "$OUT/gpu-$model.log" \
      gpu_profile "$model" "$OUT/gpu/$model" "$left" && GPU_DONE+=("$model")
  done
else
  echo "== device_scale: no GPU: no GPU profiles" >&2
fi

JOBS=()
for model in $MODELS; do
  for n in $RANKS; do
    left="$(time_left "$BUDGET_S" "$START" 30 "$model on $n ranks")" || continue
    dir="$OUT/$model-${n}ranks"
    rm -rf "$dir"
    logged "$model on $n ranks (at most $left s)" "$OUT/$model-${n}ranks.log" \
      timeout --kill-after=10 "$left" ${LAUNCH[@]+"${LAUNCH[@]}"} "$PY" -m torch.distributed.run \
        --standalone --nproc_per_node="$n" -m benchmarks.harness.compare_predict --model "$model" \
        --batch-size "${BATCH[$model]}" --candidates "$CANDIDATES" --warmup "$WARMUP" \
        --rounds "$ROUND_COUNT" --steps "$STEPS" --predict-dir "$dir/profiles" \
        --link-note "$LINK" --out "$dir" && JOBS+=("$model-${n}ranks")
  done
done
# Each model's neighbouring rank counts, both measured: each predicted from the other's profiles
# (scripts/cross_size_report.py; Note [Ranks on one shaped loopback]), into $OUT/cross_size/.
PAIRS=()
read -r -a COUNTS <<< "$RANKS"
for model in $MODELS; do
  for ((i = 1; i < ${#COUNTS[@]}; i++)); do
    few="$model-${COUNTS[i-1]}ranks" many="$model-${COUNTS[i]}ranks"
    if [[ " ${JOBS[*]-} " == *" $few "* && " ${JOBS[*]-} " == *" $many "* ]]; then
      PAIRS+=(--pair "$model" "$OUT/$few" "$OUT/$many" profiles)
    fi
  done
done
if [ ${#PAIRS[@]} -gt 0 ]; then
  logged "one size predicted from the other" "$OUT/cross_size.log" \
    "$PY" scripts/cross_size_report.py "${PAIRS[@]}" --out "$OUT/cross_size" \
    --command "scripts/device_scale.sh (its last step: ${PAIRS[*]})" || true
fi
"$PY" scripts/scale_report.py "$OUT" ${JOBS[@]+"${JOBS[@]}"} --measured-only \
  --gpu ${GPU_DONE[@]+"${GPU_DONE[@]}"} \
  --command "MODELS='$MODELS' RANKS='$RANKS' RATE=$RATE BUDGET_S=$BUDGET_S scripts/device_scale.sh" \
  --machine "$(nproc --all) cores; $("$PY" -c 'import torch; print("torch " + torch.__version__ + (", " + torch.cuda.get_device_name(0) if torch.cuda.is_available() else ", no GPU"))')"
echo "device_scale: wrote $OUT/README.md in $((SECONDS - START)) s" >&2
