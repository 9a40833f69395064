#!/usr/bin/env bash
# The real models (issue 55, item 2): ResNet-50, VGG-16, BERT-base and GPT-2 124M at full size
# with reduced inputs
# (commsched/bench/real_models.py), under horovodrun, inside a network namespace whose loopback
# is shaped so that `hvd` waits on communication for 40-70% of its iteration. Every policy
# against `hvd` and torch DDP, with the floor (benchmarks.harness.compare_predict --predict).
# A model over 100 M parameters holds a copy of itself, its gradients and SGD's momentum per
# candidate and rank (docs/examples.md), so its candidates run in groups of at most five,
# each group one job with `hvd` in it: every ratio is read against the `hvd` of its own job.
# MODELS (default "resnet50 gpt2"; also vgg16, bert) and RANKS (default 2; another count writes
# <model>-<N>ranks/) choose the jobs; JOBS (default all of them: "all synchronous overlap auto")
# keeps only the named groups, e.g. to re-measure the jobs a change can affect.
# Writes benchmarks/real/<model>/<group>/results.{json,md,png} and benchmarks/real/README.md.
set -euo pipefail
# shellcheck source=lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
OUT="${OUT:-benchmarks/real}"
MODELS="${MODELS:-resnet50 gpt2}"
RANKS="${RANKS:-2}"
RESNET50_RATE="${RESNET50_RATE:-2gbit}"
GPT2_RATE="${GPT2_RATE:-6gbit}"
VGG16_RATE="${VGG16_RATE:-10gbit}"
BERT_RATE="${BERT_RATE:-3gbit}"
ROUNDS="${ROUNDS:-4}"
JOBS="${JOBS:-all synchronous overlap auto}"
SYNC="commsched:horovod,commsched:mgwfbp"
OVERLAP="commsched:bytescheduler?partition_bytes=2MiB&credit_bytes=4MiB,commsched:prophet?partition_bytes=2MiB&credit_bytes=4MiB,commsched:dear?fusion_threshold=4MiB"
SUFFIX=""
[ "$RANKS" = 2 ] || SUFFIX="-${RANKS}ranks"
trap 'scripts/netem.sh down' EXIT
run() {  # model batch rate out candidates
  case " $JOBS " in *" ${4##*/} "*) ;; *) return 0 ;; esac
  scripts/netem.sh up "$3"
  mkdir -p "$OUT/$4"
  # 8 warm-up steps, then compare steps each commsched candidate on, untimed, until its plan
  # settles: its profiling steps, its re-plan ten steps later and `auto`'s checks and trials
  # (commsched.bench.compare.settling).
  scripts/netem.sh run .venv/bin/horovodrun -np "$RANKS" --gloo .venv/bin/python -m benchmarks.harness.compare_predict \
    --model "$1" --batch-size "$2" --rounds "$ROUNDS" --steps 4 --warmup 8 --candidates "$5" \
    --predict --link-note "loopback shaped to $3" --out "$OUT/$4" 2>&1 | rank0_stdout
}
for model in $MODELS; do
  case "$model" in
    resnet50)  # 25.6 M parameters: every candidate in one job.
      run resnet50 8 "$RESNET50_RATE" "resnet50$SUFFIX/all" \
        "local (no comm),hvd,torch-ddp,$SYNC,$OVERLAP,commsched:auto" ;;
    vgg16)  # 138 M: three jobs, like GPT-2's, but `auto` with its trials (some 400 steps of
      # about 1.3 s here at 10 Gbit/s): the one real model whose trials fit a run.
      run vgg16 8 "$VGG16_RATE" "vgg16$SUFFIX/synchronous" "local (no comm),hvd,torch-ddp,$SYNC"
      run vgg16 8 "$VGG16_RATE" "vgg16$SUFFIX/overlap" "hvd,$OVERLAP"
      run vgg16 8 "$VGG16_RATE" "vgg16$SUFFIX/auto" "hvd,commsched:dear?fusion_threshold=4MiB,commsched:auto" ;;
    bert)  # 110 M: three jobs; `auto` without trials, as for GPT-2.
      run bert 2 "$BERT_RATE" "bert$SUFFIX/synchronous" "local (no comm),hvd,torch-ddp,$SYNC"
      run bert 2 "$BERT_RATE" "bert$SUFFIX/overlap" "hvd,$OVERLAP"
      run bert 2 "$BERT_RATE" "bert$SUFFIX/auto" \
        "hvd,commsched:dear?fusion_threshold=4MiB,commsched:auto?auto_trials=0" ;;
    gpt2)  # 124 M: three jobs. `auto` without trials (auto_trials=0: the prediction alone
      # decides): its trials take some 400 steps, over 20 minutes at 3-4 s per step here.
      run gpt2 1 "$GPT2_RATE" "gpt2$SUFFIX/synchronous" "local (no comm),hvd,torch-ddp,$SYNC"
      run gpt2 1 "$GPT2_RATE" "gpt2$SUFFIX/overlap" "hvd,$OVERLAP"
      run gpt2 1 "$GPT2_RATE" "gpt2$SUFFIX/auto" \
        "hvd,commsched:dear?fusion_threshold=4MiB,commsched:auto?auto_trials=0" ;;
    *) echo "bench_real: no jobs for model '$model' (resnet50, vgg16, bert, gpt2)" >&2; exit 2 ;;
  esac
done
.venv/bin/python scripts/real_report.py "$OUT" \
  --command "MODELS='$MODELS' JOBS='$JOBS' RANKS=$RANKS RESNET50_RATE=$RESNET50_RATE GPT2_RATE=$GPT2_RATE VGG16_RATE=$VGG16_RATE BERT_RATE=$BERT_RATE ROUNDS=$ROUNDS scripts/bench_real.sh"
echo "bench_real: wrote $OUT/README.md" >&2
