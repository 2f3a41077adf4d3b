#!/usr/bin/env bash
# Issue 36 on two GPUs (the device tool's nvidia-h200-x2): faults under NCCL, where a DDP step's
# communication goes (kernel traces), the levers, captured steps at world 2, and the final
# alternations against PyTorch. Builds with scripts/gpu-check.sh's build stage when build-gpu has
# no ddp-bench yet (a warm machine keeps it). Logs under $OUT; a summary is printed last.
#
#   bash scripts/gpu-scaling.sh faults trace levers graphs     # stages, in the order given
#
# Stages:
#   faults  one rank of ddp-train SIGSTOPped or SIGKILLed, eager and captured (--timeout-s 10):
#           seconds from the signal to the launcher's exit, the named error, processes left
#   trace   kernel traces (ddp-bench --kernel-trace) of gpt2-medium DDP eager and gpt2-small DDP
#           captured at world 2, read by bench/trace_attribution.py (summary, per bucket, SVG)
#   levers  gpt2-medium DDP, ours: the default and one lever at a time, alternated
#   graphs  captured whole steps at world 2, ours and PyTorch's, toy / gpt-char / gpt2-small; ours
#           with NCCL_GRAPH_MIXING_SUPPORT=0 and NCCL_GRAPH_REGISTER=0/1
#   final   gpt2-medium and gpt2-small: one GPU, ours DDP, PyTorch DDP default and tuned, alternated
#           FINAL_ROUNDS times (default 3)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpu-scaling}"
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
unset TORCH_ALLOW_TF32_CUBLAS_OVERRIDE
SUMMARY="$OUT/summary.txt"
touch "$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
PY=python3
BENCH=build-gpu/ddp-bench
TRAIN=build-gpu/ddp-train
median() { grep -oE 'median_ms=[0-9.]+' "$1" | head -1 | cut -d= -f2; }
declare -A FLAGS=(
  [toy]="--model toy --batch-size 64"
  [gpt-char]="--model gpt-char --batch-size 16 --autocast-bf16"
  [gpt2-small]="--model gpt2-small --batch-size 8 --autocast-bf16"
  [gpt2-medium]="--model gpt2-medium --batch-size 8 --autocast-bf16"
)

if [[ ! -x $BENCH ]]; then
  OUT="$OUT/build" bash scripts/gpu-check.sh build || { note "build failed"; exit 1; }
  cat "$OUT/build/summary.txt" >>"$SUMMARY"
fi

# name, signal, then ddp-train's flags: start 2 workers, wait for the step-40 progress line, send
# the signal to the worker started last (rank 1), then time the launcher's exit.
fault() {
  local name="$1" sig="$2"; shift 2
  local log="$OUT/fault-$name.log"
  $TRAIN --nproc 2 --device cuda --timeout-s 10 --steps 1000000 "$@" >"$log" 2>&1 &
  local launcher=$!
  for _ in $(seq 1 900); do grep -q "step 40/" "$log" && break; sleep 0.1; done
  local victim
  victim=$(pgrep -P "$launcher" | sort -n | tail -1)
  local t0 t1
  t0=$(date +%s.%N)
  kill "-$sig" "$victim"
  wait "$launcher"
  local rc=$?
  t1=$(date +%s.%N)
  sleep 1  # let the kernel reap what the launcher killed before counting
  local left
  left=$(pgrep -fc 'build-gpu/ddp-train')
  note "fault $name: SIG$sig to pid $victim; launcher rc=$rc after $(awk "BEGIN{printf \"%.1f\", $t1 - $t0}") s; processes left: $left"
  grep -E 'did not finish|killed by|exited with|workers failed' "$log" | head -3 | cut -c1-600 | tee -a "$SUMMARY"
  pkill -9 -f 'build-gpu/ddp-train' 2>/dev/null
}

for stage in "$@"; do
  case "$stage" in
    faults)
      for f in ${FAULTS:-eager-stop eager-kill graph-stop graph-kill}; do
        case "$f" in
          eager-stop) fault eager-stop STOP --data ;;
          eager-kill) fault eager-kill KILL --data ;;
          graph-stop) fault graph-stop STOP --model gpt --cuda-graph ;;
          graph-kill) fault graph-kill KILL --model gpt --cuda-graph ;;
        esac
      done
      ;;
    trace)
      timeout 200 $BENCH ${FLAGS[gpt2-medium]} --device cuda --ddp --nproc 2 --repeat 10 \
        --warmup 5 --verbose --kernel-trace "$OUT/trace-medium.json" >"$OUT/trace-medium.log" 2>&1
      note "trace gpt2-medium ddp eager rc=$? median $(median "$OUT/trace-medium.log") ms"
      $PY bench/trace_attribution.py "$OUT/trace-medium.json" --svg "$OUT/trace-medium.svg" \
        2>&1 | tee -a "$SUMMARY"
      timeout 200 $BENCH ${FLAGS[gpt2-small]} --device cuda --ddp --nproc 2 --repeat 20 \
        --warmup 5 --cuda-graph --verbose --kernel-trace "$OUT/trace-small-graph.json" \
        >"$OUT/trace-small-graph.log" 2>&1
      note "trace gpt2-small ddp captured rc=$? median $(median "$OUT/trace-small-graph.log") ms; $(grep -o 'cuda graph .*' "$OUT/trace-small-graph.log" | cut -c1-160)"
      $PY bench/trace_attribution.py "$OUT/trace-small-graph.json" --svg "$OUT/trace-small-graph.svg" \
        2>&1 | tee -a "$SUMMARY"
      rm -f "$OUT"/trace-*.json*  # tens of MB: the summaries and SVGs come back instead
      ;;
    levers)
      flags="${FLAGS[gpt2-medium]} --device cuda --repeat 20 --warmup 5"
      for round in $(seq 1 "${LEVER_ROUNDS:-2}"); do
        for name in ${LEVERS:-default highprio cap100 cta-eff first-cap25 highprio-cap100}; do
          declare -A LEVER=([default]="" [highprio]="--nccl-high-priority-stream"
            [cap100]="--bucket-cap-mb 100" [cap50]="--bucket-cap-mb 50" [cta-eff]="--nccl-cta-policy 1"
            [first-cap25]="--first-bucket-cap-mb 25"
            [highprio-cap100]="--nccl-high-priority-stream --bucket-cap-mb 100")
          timeout 200 $BENCH $flags --ddp --nproc 2 ${LEVER[$name]} >"$OUT/lever-$name-$round.log" 2>&1
          note "lever gpt2-medium round $round $name: $(median "$OUT/lever-$name-$round.log") ms"
        done
      done
      ;;
    graphs)
      for model in ${GRAPH_MODELS:-toy gpt-char gpt2-small}; do
        flags="${FLAGS[$model]} --device cuda --repeat 50 --warmup 12 --ddp --nproc 2"
        g() {
          local name="$1"; shift
          timeout 200 "$@" $flags >"$OUT/graph2-$model-$name.log" 2>&1
          note "graphs world 2 $model $name: $(median "$OUT/graph2-$model-$name.log") ms $(grep -o 'cuda graph .*' "$OUT/graph2-$model-$name.log" | head -1 | cut -c1-120)"
        }
        for round in $(seq 1 "${GRAPH_ROUNDS:-2}"); do
          g "ours-graph-$round" $BENCH --cuda-graph --verbose
          g "torch-graph-$round" $PY bench/reference/torch_ddp.py --cuda-graph
        done
        if [[ " ${GRAPH_VARIANTS:-gpt2-small toy} " == *" $model "* ]]; then
          NCCL_GRAPH_MIXING_SUPPORT=0 g ours-graph-mixing0 $BENCH --cuda-graph
          NCCL_GRAPH_REGISTER=0 g ours-graph-register0 $BENCH --cuda-graph
          NCCL_GRAPH_REGISTER=1 g ours-graph-register1 $BENCH --cuda-graph
          g ours-graph-highprio $BENCH --cuda-graph --nccl-high-priority-stream
        fi
      done
      ;;
    final)
      for model in ${FINAL_MODELS:-gpt2-medium gpt2-small}; do
        flags="${FLAGS[$model]} --device cuda --repeat 20 --warmup 5"
        for round in $(seq 1 "${FINAL_ROUNDS:-3}"); do
          f() {
            local name="$1"; shift
            timeout 200 "$@" $flags >"$OUT/final-$model-$name-$round.log" 2>&1
            note "final $model round $round $name: $(median "$OUT/final-$model-$name-$round.log") ms"
          }
          f ours-1gpu $BENCH
          f ours-ddp $BENCH --ddp --nproc 2 ${FINAL_OURS_ARGS:-}
          f torch-ddp $PY bench/reference/torch_ddp.py --ddp --nproc 2
          f torch-ddp-tuned $PY bench/reference/torch_ddp.py --ddp --nproc 2 --bucket-cap-mb 100 \
            --bucket-view --static-graph
        done
      done
      ;;
    *) note "unknown stage $stage"; exit 2 ;;
  esac
done
echo "==== summary"
cat "$SUMMARY"
