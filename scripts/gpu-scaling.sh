#!/usr/bin/env bash
# Issues 36 and 44 on several GPUs (the device tool's nvidia-h200-x2 / -x4): faults under NCCL,
# where a DDP step's communication goes (kernel traces), the levers, captured steps, and the final
# alternations against PyTorch, at every world size the machine holds: 1, 2 and NP = min(4, GPUs)
# (WORLDS overrides). Builds with scripts/gpu-check.sh's build stage when build-gpu has no
# ddp-bench yet (a warm machine keeps it). Logs under $OUT; a summary is printed last.
#
#   bash scripts/gpu-scaling.sh faults trace levers graphs     # stages, in the order given
#
# Stages:
#   faults  one rank of ddp-train SIGSTOPped or SIGKILLed, eager and captured (--timeout-s 10):
#           seconds from the signal to the launcher's exit, the named error, processes left
#   trace   kernel traces (ddp-bench --kernel-trace) of gpt2-medium eager (one GPU bare, DDP at
#           each world of WORLDS) and, with TRACE_SMALL=1, gpt2-small DDP captured; each read by
#           bench/trace_attribution.py against the one-GPU trace (summary, slowdown by kernel class,
#           the idle gaps named, per bucket, SVG); the traces kept gzipped (trace-*.json.gz);
#           TRACE_DDP1=1 adds DDP at world 1, TRACE_THREADS=1 each worker thread's CPU time
#   levers  gpt2-medium DDP, ours: the default and one lever at a time, alternated, at each world of
#           LEVER_WORLDS (default NP)
#           (LEVER_ENV: levers that are an environment variable); each run's device peak noted
#   crowd   NP bare one-GPU runs at once (no communication) against one alone: the host's share
#   memory  issue 45: step time and device peak per style (MEM_WORLDS, MEM_RUNS), ours and PyTorch's
#   affinity  gpt2-medium DDP at world NP, ours: each worker pinned (taskset) to an equal share of
#           the CPUs against the unpinned default, alternated; the machine's NUMA layout logged
#   graphs  captured whole steps at each world of GRAPH_WORLDS (default "2 NP"), ours and PyTorch's,
#           toy / gpt-char / gpt2-small; ours with NCCL_GRAPH_MIXING_SUPPORT=0 and
#           NCCL_GRAPH_REGISTER=0/1
#   final   gpt2-medium and gpt2-small: one GPU, then at each world of FINAL_WORLDS (default
#           "2 NP") ours DDP, PyTorch DDP default and tuned, alternated FINAL_ROUNDS times
#           (default 3); OURS_ARGS adds flags to ours (a lever made default for the run);
#           FINAL_FSDP=1 adds ours FULLY_SHARD per block at each world; the table
#           (bench/scaling_table.py) is printed last and kept as scaling-table.md
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
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
NP=${NP:-$((NGPU >= 4 ? 4 : NGPU))}
# 2 and NP, each once (the multi-GPU worlds of the graphs and final stages).
MULTI="$(printf '%s\n' 2 "$NP" | awk -v n="$NGPU" '$1 <= n && !seen[$1]++' | tr '\n' ' ')"
# The world sizes this machine can run: 1, 2 and NP, each once.
WORLDS="${WORLDS:-$(printf '%s\n' 1 2 "$NP" | awk -v n="$NGPU" '$1 <= n && !seen[$1]++' | tr '\n' ' ')}"
note "machine: $NGPU GPUs; worlds: $WORLDS"
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
      # Where a worker's host time goes (issue 44: the world-4 forward's host is twice as slow
      # per op as one GPU's): the container's CPU quota, and each worker thread's CPU time.
      { cat /sys/fs/cgroup/cpu.max 2>/dev/null; nproc; } >"$OUT/trace-host.log" 2>&1
      # One GPU bare first: the reference every multi-GPU trace is read against. TRACE_DDP1=1 adds
      # DDP at world 1 (the wrapper without peers), to tell the wrapper's cost from the peers'.
      # TRACE_WORLDS: which worlds (default WORLDS; world 1 is the bare model, the reference);
      # TRACE_ARGS: flags for the multi-GPU runs (a lever), TRACE_TAG names their files.
      for w in ${TRACE_WORLDS:-$WORLDS}; do
        dist=""; ((w > 1)) && dist="--ddp --nproc $w ${TRACE_ARGS:-}"
        name="trace-medium${TRACE_TAG:-}-w$w"; ((w == 1)) && name="trace-medium-w1"
        timeout 240 $BENCH ${FLAGS[gpt2-medium]} --device cuda $dist --repeat 10 --warmup 5 \
          --verbose --kernel-trace "$OUT/$name.json" >"$OUT/$name.log" 2>&1
        note "trace gpt2-medium world $w ${TRACE_ARGS:-} rc=$? median $(median "$OUT/$name.log") ms"
        base=""; ((w > 1)) && [[ -f $OUT/trace-medium-w1.json ]] && base="--baseline $OUT/trace-medium-w1.json"
        $PY bench/trace_attribution.py "$OUT/$name.json" $base --svg "$OUT/$name.svg" 2>&1 |
          tee -a "$SUMMARY"
      done
      if [[ ${TRACE_DDP1:-0} == 1 ]]; then
        timeout 240 $BENCH ${FLAGS[gpt2-medium]} --device cuda --ddp --nproc 1 ${TRACE_ARGS:-} \
          --repeat 10 --warmup 5 --kernel-trace "$OUT/trace-medium-ddp-w1.json" \
          >"$OUT/trace-medium-ddp-w1.log" 2>&1
        note "trace gpt2-medium DDP world 1 rc=$? median $(median "$OUT/trace-medium-ddp-w1.log") ms"
        $PY bench/trace_attribution.py "$OUT/trace-medium-ddp-w1.json" \
          --baseline "$OUT/trace-medium-w1.json" 2>&1 | head -20 | tee -a "$SUMMARY"
      fi
      # Each worker's threads and their CPU time during a world-NP run (ps after 12 s).
      if [[ ${TRACE_THREADS:-0} == 1 ]]; then
        timeout 240 $BENCH ${FLAGS[gpt2-medium]} --device cuda --ddp --nproc "$NP" --repeat 200 \
          --warmup 5 >/dev/null 2>&1 &
        sleep 12
        ps -eLo pid,tid,pcpu,time,comm | grep -E 'ddp-bench|PID' >"$OUT/trace-threads.log"
        wait
      fi
      if [[ ${TRACE_SMALL:-0} == 1 ]]; then
        for w in $WORLDS; do
          dist=""; ((w > 1)) && dist="--ddp --nproc $w"
          timeout 200 $BENCH ${FLAGS[gpt2-small]} --device cuda $dist --repeat 20 --warmup 5 \
            --cuda-graph --verbose --kernel-trace "$OUT/trace-small-graph-w$w.json" \
            >"$OUT/trace-small-graph-w$w.log" 2>&1
          note "trace gpt2-small captured world $w rc=$? median $(median "$OUT/trace-small-graph-w$w.log") ms"
          base=""; ((w > 1)) && base="--baseline $OUT/trace-small-graph-w1.json"
          $PY bench/trace_attribution.py "$OUT/trace-small-graph-w$w.json" $base \
            --svg "$OUT/trace-small-graph-w$w.svg" 2>&1 | tee -a "$SUMMARY"
        done
      fi
      # Tens of MB each: kept gzipped (rank 0's), the other ranks' dropped.
      rm -f "$OUT"/trace-*.json.rank*
      gzip -f "$OUT"/trace-*.json
      ;;
    levers)
      flags="${FLAGS[gpt2-medium]} --device cuda --repeat 20 --warmup 5"
      declare -A LEVER=([default]="" [highprio]="--nccl-high-priority-stream"
        [cap100]="--bucket-cap-mb 100" [cap50]="--bucket-cap-mb 50" [cta-eff]="--nccl-cta-policy 1"
        [cta-zero]="--nccl-cta-policy 2" [first-cap25]="--first-bucket-cap-mb 25"
        [highprio-cap100]="--nccl-high-priority-stream --bucket-cap-mb 100"
        [opt-overlap]="--optimizer-overlap" [noop]="--comm-hook noop" [no-overlap]="--no-overlap"
        [no-in-place]="--no-reduce-in-place"
        [opt-overlap-cap100]="--optimizer-overlap --bucket-cap-mb 100"
        [in-place-cap100]="--reduce-in-place --bucket-cap-mb 100"
        [ctas8]="--nccl-max-ctas 8" [ctas16]="--nccl-max-ctas 16")
      # Levers that are an environment variable of NCCL or c10d rather than a flag of ours:
      # reg-hook registers every segment of the caching allocator with the communicators
      # (ncclCommRegister), so NCCL reads and writes the gradients in place instead of staging
      # them through its own buffers (fewer HBM passes beside the GEMMs).
      declare -A LEVER_ENV=([reg-hook]="TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1")
      for w in ${LEVER_WORLDS:-$NP}; do
        for round in $(seq 1 "${LEVER_ROUNDS:-2}"); do
          for name in ${LEVERS:-default no-in-place ctas16 cap100}; do
            log="$OUT/lever-w$w-$name-$round.log"
            env ${LEVER_ENV[$name]:-} timeout 200 $BENCH $flags --ddp --nproc "$w" --verbose \
              ${LEVER[$name]:-} >"$log" 2>&1
            note "lever gpt2-medium world $w round $round $name: $(median "$log") ms, $(grep -o 'device peak allocated [0-9]*' "$log" | head -1)"
          done
        done
      done
      ;;
    crowd)
      # Is the host of a world-NP step slower only because NP processes share it? NP bare one-GPU
      # runs at once (each on its own GPU, no communication) against one alone, alternated.
      flags="${FLAGS[gpt2-medium]} --device cuda --repeat 20 --warmup 5"
      for round in $(seq 1 "${CROWD_ROUNDS:-2}"); do
        timeout 200 $BENCH $flags >"$OUT/crowd-alone-$round.log" 2>&1
        note "crowd gpt2-medium round $round one run alone: $(median "$OUT/crowd-alone-$round.log") ms"
        pids=()
        for r in $(seq 0 $((NP - 1))); do
          CUDA_VISIBLE_DEVICES=$r timeout 200 $BENCH $flags >"$OUT/crowd-$round.log.rank$r" 2>&1 &
          pids+=($!)
        done
        wait "${pids[@]}"
        note "crowd gpt2-medium round $round $NP runs at once: $(for r in $(seq 0 $((NP - 1))); do median "$OUT/crowd-$round.log.rank$r"; done | tr '\n' ' ')ms"
      done
      ;;
    memory)
      # Issue 45: each style's step time and device peak (the caching allocator's, over the timed
      # steps) at each world of MEM_WORLDS (default "2 NP"), ours and PyTorch's, per block.
      flags="${FLAGS[gpt2-medium]} --device cuda --repeat 10 --warmup 4 --json"
      peak() { grep -oE '"device_peak_allocated_bytes":[0-9]+' "$1" | head -1 | cut -d: -f2; }
      jmedian() { grep -oE '"median_ms":[0-9.]+' "$1" | head -1 | cut -d: -f2; }
      for w in ${MEM_WORLDS:-$MULTI}; do
        for name in ${MEM_RUNS:-ours-ddp ours-fsdp ours-fsdp-keep torch-ddp fsdp2 fsdp2-keep}; do
          case "$name" in
            ours-ddp) cmd="$BENCH --ddp" ;;
            ours-fsdp) cmd="$BENCH --fsdp --fsdp-wrap" ;;
            ours-fsdp-keep) cmd="$BENCH --fsdp --fsdp-wrap --reshard-after-forward 0" ;;
            torch-ddp) cmd="$PY bench/reference/torch_ddp.py --ddp" ;;
            fsdp2) cmd="$PY bench/reference/torch_ddp.py --fsdp --fsdp-wrap" ;;
            fsdp2-keep) cmd="$PY bench/reference/torch_ddp.py --fsdp --fsdp-wrap --reshard-after-forward false" ;;
            ours-fsdp-bf16) cmd="$BENCH --fsdp --fsdp-wrap --param-dtype bf16" ;;
            fsdp2-bf16) cmd="$PY bench/reference/torch_ddp.py --fsdp --fsdp-wrap --param-dtype bf16" ;;
            ours-ddp-graph) cmd="$BENCH --ddp --cuda-graph" ;;
            ours-fsdp-graph) cmd="$BENCH --fsdp --fsdp-wrap --cuda-graph" ;;
          esac
          log="$OUT/memory-w$w-$name.log"
          timeout 200 $cmd $flags --nproc "$w" >"$log" 2>&1
          note "memory gpt2-medium world $w $name: $(jmedian "$log") ms, peak $(peak "$log") B"
        done
      done
      ;;
    affinity)
      # Workers started by hand (DDP_BENCH_WORKER and the launcher's variables), so each can run
      # under taskset: rank r on CPUs [r * share, (r + 1) * share).
      { lscpu | grep -E 'NUMA|^CPU\(s\)'; nvidia-smi topo -m; } >"$OUT/affinity-machine.log" 2>&1
      flags="${FLAGS[gpt2-medium]} --device cuda --repeat 20 --warmup 5 --ddp"
      share=$(($(nproc) / NP))
      pinned() {
        local log="$1" port=$((29600 + RANDOM % 1000)) pids=()
        for r in $(seq 0 $((NP - 1))); do
          DDP_BENCH_WORKER=1 RANK=$r LOCAL_RANK=$r WORLD_SIZE=$NP LOCAL_WORLD_SIZE=$NP \
            MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            timeout 200 taskset -c $((r * share))-$((r * share + share - 1)) $BENCH $flags \
            >"$log.rank$r" 2>&1 &
          pids+=($!)
        done
        wait "${pids[@]}"
        cp "$log.rank0" "$log"
      }
      for round in $(seq 1 "${AFFINITY_ROUNDS:-2}"); do
        timeout 200 $BENCH $flags --nproc "$NP" >"$OUT/affinity-free-$round.log" 2>&1
        note "affinity gpt2-medium world $NP round $round unpinned: $(median "$OUT/affinity-free-$round.log") ms"
        pinned "$OUT/affinity-pinned-$round.log"
        note "affinity gpt2-medium world $NP round $round pinned ($share CPUs each): $(median "$OUT/affinity-pinned-$round.log") ms"
      done
      ;;
    graphs)
      for w in ${GRAPH_WORLDS:-$MULTI}; do
      for model in ${GRAPH_MODELS:-toy gpt-char gpt2-small}; do
        flags="${FLAGS[$model]} --device cuda --repeat 50 --warmup 12 --ddp --nproc $w"
        g() {
          local name="$1"; shift
          timeout 200 "$@" $flags >"$OUT/graph$w-$model-$name.log" 2>&1
          note "graphs world $w $model $name: $(median "$OUT/graph$w-$model-$name.log") ms $(grep -o 'cuda graph .*' "$OUT/graph$w-$model-$name.log" | head -1 | cut -c1-120)"
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
          for w in ${FINAL_WORLDS:-$MULTI}; do
            f "ours-ddp-w$w" $BENCH --ddp --nproc "$w" ${OURS_ARGS:-}
            f "torch-ddp-w$w" $PY bench/reference/torch_ddp.py --ddp --nproc "$w"
            f "torch-ddp-tuned-w$w" $PY bench/reference/torch_ddp.py --ddp --nproc "$w" \
              --bucket-cap-mb 100 --bucket-view --static-graph
            if [[ ${FINAL_FSDP:-0} == 1 ]]; then
              f "ours-fsdp-w$w" $BENCH --fsdp --fsdp-wrap --nproc "$w"
            fi
          done
        done
      done
      ;;
    *) note "unknown stage $stage"; exit 2 ;;
  esac
done
echo "==== summary"
cat "$SUMMARY"
# The final stage's table (medians over the rounds, scaling and the ratios to PyTorch).
if grep -q '^final ' "$SUMMARY"; then
  $PY bench/scaling_table.py "$SUMMARY" | tee "$OUT/scaling-table.md"
fi
