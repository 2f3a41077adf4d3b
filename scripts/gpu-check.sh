#!/usr/bin/env bash
# On the GPU machine (the device tool's nvidia-h200-x2): build libddp against its torch 2.x libtorch
# (CUDA, NCCL), run the tests that need no Gloo (its torch ships no Gloo headers) including the GPU
# equivalence tests, then the benchmarks. Everything is logged under $OUT; a short summary is
# printed last.
#
#   bash scripts/gpu-check.sh                 # build, tests, levers, table
#   bash scripts/gpu-check.sh build tests     # only those stages
#
# Stages: build, tests, restart62 (issue 62: a failed rank restarted on NCCL, a slot dropped, world 1 resumes), async62 (issue 62: the step's blocked time per save, sync against --checkpoint-async, gpt2-medium and llama-8b), hybrid63 (issue 63, 4 GPUs: hybrid 2x2 against FSDP2's HSDP and both flat; ddp-train --dp-replicate 2 against DDP), llama (issue 60: the Llama rows, ours against FSDP2 per block), syncbn61 (issue 61: resnet-small with and without SyncBatchNorm, ours and PyTorch's DDP), check61 (issue 61: the replica check's cost), vision61 (issue 61: examples/vision_cnn installed and run on GPUs), ctas60 (issue 60: NCCL's CTA levers at the batch-1 regime, alternated rounds), floors60 (issue 60: the batch-1 regime against its compute-only and communication-only floors, and FSDP2), train60 (issue 60: ddp-train --data with llama-1b, a save and a resume), fit (issue 60: the memory plan refuses DDP of llama-8b), attr60 (issue 60: kernel traces of the llama step, ours and FSDP2's, read by bench/trace_attribution.py), ac59 (issue 59: the FULLY_SHARD x activation checkpointing rows, and gpt2-medium per block with checkpointing against FSDP2), forensics (issue 49: a rank SIGSTOPped in eager and in captured training on NCCL, the dumps read by ddp-forensics), graphs (issue 25: captured steps, ours and PyTorch's recipe), recipe (issue 26:
# the GPT recipe, ours and PyTorch's in one bench/compare run, and ddp-train --data with MFU), text (ddp-train --data on the GPU), tpref (PyTorch's --tp reference checked on CPU Gloo), onegpu (ours vs PyTorch with one GPU: bare, DDP and FULLY_SHARD at world 1), sharded (FULLY_SHARD vs FSDP2), fsdpbest (issue 36: FULLY_SHARD vs FSDP2 under its reshard, prefetch and bf16 knobs), capture35 (issue 35: the GPT recipe as one captured step, ours and PyTorch's; GPT2=1 adds gpt2-small bare vs recipe, TRAIN=1 ddp-train --data eager vs captured, 3 epochs, a resume), attribution (issue 13: noop hook, --no-overlap), tp (issue 15: --tp 2), final (the documented table), overlap, levers (ours only: each tuning lever against our default), table (bench/compare,
# ours vs PyTorch in the same run, with the 1-GPU baselines), parity (C++ vs PyTorch parameters).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpu-check}"
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0  # NVLink multicast off, as the device notes require
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# fp32 means fp32: an image may force TF32 on for cuBLAS; the equivalence tests need it off, and both
# benchmark sides run with the same (default) setting.
unset TORCH_ALLOW_TF32_CUBLAS_OVERRIDE
stages="${*:-build tests levers table}"
has() { [[ " $stages " == *" $1 "* ]]; }
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
PY=python3
BENCH=build-gpu/ddp-bench
# The large models' fast initialisation (FAST_INIT=1, the default): ours draws only each rank's
# shards (--local-init), FSDP2 builds on the meta device (--meta-init). The steps do not depend on
# it (other numbers, the same distributions); each llama-8b run then starts in seconds instead of
# ~100 s of every rank drawing the whole model on the CPU: device time the stages below spend on
# measuring. FAST_INIT=0: the single process's numbers on both sides.
OURS_INIT="" TORCH_INIT=""
[[ ${FAST_INIT:-1} == 1 ]] && OURS_INIT="--local-init" TORCH_INIT="--meta-init"
# The multi-process runs of the tests stage use every GPU up to 4 (NCCL refuses two ranks on one
# device); the GPU tests themselves skip the world sizes the machine cannot hold.
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
NP=$((NGPU >= 4 ? 4 : (NGPU >= 1 ? NGPU : 1)))

{
  nvidia-smi -L
  nvidia-smi topo -m
  $PY -c 'import torch;print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "tf32", torch.backends.cuda.matmul.allow_tf32)'
  env | grep -E '^(NCCL|TORCH|CUDA)' | sort
} >"$OUT/machine.log" 2>&1

if has build; then
  TORCH_PREFIX="$($PY -c 'import torch;print(torch.utils.cmake_prefix_path)')"
  start=$(date +%s)
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" \
    >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
  cmake --build build-gpu -j "$(nproc)" >"$OUT/build.log" 2>&1 ||
    { grep -E "error" -A5 "$OUT/build.log" | head -80; exit 1; }
  note "build: $(($(date +%s) - start)) s; warnings: $(grep -c 'warning:' "$OUT/build.log")"
  grep -E "libddp:" "$OUT/configure.log" | tee -a "$SUMMARY"
fi

if has tests; then
  # TESTS_FILTER narrows the run (one issue's GPU tests in a short device call).
  build-gpu/tests/ddp_tests \
    --gtest_filter="${TESTS_FILTER:-BucketPlan.*:Env.*:ReplicaCheck.*:Spawn.*:AutocastGuard.*:Models/GpuEquivalence.*:WorldSizes/FlatCollectivesNccl.*:DeviceMeshNccl.*:PosixFile.*:Checkpoint.*:CheckpointSha256.*:Safetensors.*:AllDtypes/*:Cases/*:ActivationCheckpoint.*:ActivationCheckpointGpu.*:GptModel.*:Layout*:TakeLocal.*:BackwardNode.*:ModuleIntake.*:Options.*:ShardedGradientPathGpu.*:CAbiGpu.*:CapturedStep*:StepRng*:DdpTrainTextGpu.*:Kinds/Optimizers.*:OptimizerGroups.*:OptimizerSkip.*:OptimizerCheckpoint.*:OptimizerRefuses.*:OptimizerAdamW.*:CopyIntoReduceInput.*:EndOfBackward.*:AccumulationHook.*:Styles/CheckpointMatrixGpu.*:PublicApi.AGatherSetting*:FlightRing.*:FlightDumpRead.*:FlightDivergence.*:CollectiveCheck.*:StylesWorlds/SyncBatchNormStylesGpu.*:ParamDtypeGpu.*:-Spawn.DdpTrainNprocWorkersArePrefixed}" \
    >"$OUT/tests.log" 2>&1
  note "tests rc=$?: $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/tests.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]|relative error' "$OUT/tests.log" | head -20 | tee -a "$SUMMARY"
  for model in net gpt; do
    timeout 300 build-gpu/ddp-train --nproc $NP --device cuda --model "$model" --steps 50 \
      --timeout-s 120 >"$OUT/train-$model.log" 2>&1
    note "ddp-train $model nccl world $NP rc=$? ($(grep -ciE 'warn|error' "$OUT/train-$model.log") warning/error lines): $(tail -1 "$OUT/train-$model.log")"
  done
  # The checkpoint coordinator's control scalars on NCCL, and pruning (keep 2 of 6 saves) in a
  # process that links the wheel's libtorch (posix_file.hpp, remove_tree): saves every 5 steps.
  rm -rf "$OUT/ckpt"
  timeout 300 build-gpu/ddp-train --nproc $NP --device cuda --model net --steps 20 --timeout-s 120 \
    --checkpoint-dir "$OUT/ckpt" --checkpoint-every 5 --keep-checkpoints 2 >"$OUT/train-ckpt.log" 2>&1
  rc=$?
  timeout 300 build-gpu/ddp-train --nproc $NP --device cuda --model net --steps 30 --timeout-s 120 \
    --checkpoint-dir "$OUT/ckpt" --checkpoint-every 5 --keep-checkpoints 2 --resume --verbose >>"$OUT/train-ckpt.log" 2>&1
  note "ddp-train checkpoint+resume nccl rc=$rc,$?: $(grep -m1 'resumed from' "$OUT/train-ckpt.log"); left: $(ls "$OUT/ckpt" | tr '\n' ' ')"
  rm -rf "$OUT/ckpt"  # 64 MB per checkpoint: too big to bring back
  # The C ABI's shared library from a second language (issue 47): Python's ctypes over this
  # machine's torch dlopens build-gpu/libddp_c.so.1 and trains on NCCL, one GPU per rank.
  for world in $(printf '%s\n' 1 "$NP" | sort -u); do
    rm -rf "$OUT/ctypes-ckpt"
    DDP_TEST_DEVICE=cuda timeout 300 build-gpu/ddp-run --nproc-per-node "$world" -- $PY \
      tests/c/ctypes_binding.py "$PWD/build-gpu/libddp_c.so.1" tests/c/abi_symbols.txt \
      "$OUT/ctypes-ckpt" >"$OUT/ctypes-$world.log" 2>&1
    note "ctypes binding nccl world $world rc=$?: $(tail -1 "$OUT/ctypes-$world.log")"
  done
  rm -rf "$OUT/ctypes-ckpt"
fi

if has forensics; then
  # A hung NCCL job, eager and as replays of a captured step: rank 1 is SIGSTOPped mid-training;
  # rank 0 times out (10 s) and dumps; the launcher ends the job; ddp-forensics names rank 1 and
  # where rank 0 waited. Needs 2 GPUs (NCCL refuses two ranks on one).
  rank1_pid() {  # the ddp-train worker whose environment says RANK=1
    for p in $(pgrep -x ddp-train); do
      tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx 'RANK=1' && { echo "$p"; return; }
    done
  }
  if ((NGPU < 2)); then
    note "forensics: skipped, $NGPU GPU(s) (NCCL needs one per rank)"
  else
    for mode in eager captured; do
      dir="$OUT/forensics-$mode"
      rm -rf "$dir" && mkdir -p "$dir"
      graph=$([[ $mode == captured ]] && echo --cuda-graph || true)
      timeout 120 build-gpu/ddp-train --nproc 2 --device cuda --model gpt --steps 1000000 \
        --timeout-s 10 --flight-recorder "$dir" $graph >"$OUT/forensics-$mode.log" 2>&1 &
      job=$!
      for _ in $(seq 60); do  # until step 100 is logged (or a minute passes)
        grep -qE 'step [0-9]{3,}/' "$OUT/forensics-$mode.log" 2>/dev/null && break
        sleep 1
      done
      pid=$(rank1_pid)
      [[ -n $pid ]] && kill -STOP "$pid"
      start=$(date +%s)
      wait $job
      rc=$?
      [[ -n $pid ]] && kill -KILL "$pid" 2>/dev/null
      build-gpu/ddp-forensics "$dir" >"$OUT/forensics-$mode.txt" 2>&1
      frc=$?
      note "forensics $mode: rank 1 (pid ${pid:-none}) stopped; job rc=$rc after $(($(date +%s) - start)) s; dumps: $(ls "$dir" | tr '\n' ' '); ddp-forensics rc=$frc: $(head -1 "$OUT/forensics-$mode.txt")"
      tail -3 "$OUT/forensics-$mode.log" >>"$SUMMARY"
    done
  fi
fi

if has restart62; then
  # Issue 62: restarts without a human on NCCL. Rank 1 fails at step 15 (test hook); the launcher
  # restarts both, the workers resume from step-10; on the restart slot 1 fails at start-up
  # (--unavailable-slot, as a GPU gone), is dropped (--min-nproc 1), and the run ends at world 1
  # with the global batch kept.
  rm -rf "$OUT/restart-ckpt"
  timeout 300 build-gpu/ddp-train --nproc 2 --device cuda --model net --steps 30 --timeout-s 60 \
    --checkpoint-dir "$OUT/restart-ckpt" --checkpoint-every 5 --max-restarts 2 --min-nproc 1 \
    --fail-at-step 15 --fail-rank 1 --unavailable-slot 1 >"$OUT/restart62.log" 2>&1
  note "restart62 rc=$?: $(grep -E 'restarting|start-up|keep the global|resumed from|world size' "$OUT/restart62.log" | tr '\n' '|')"
  tail -2 "$OUT/restart62.log" >>"$SUMMARY"
  rm -rf "$OUT/restart-ckpt"
fi

if has async62; then
  # Issue 62 item 1: the time a step is blocked per save, synchronous (save_and_barrier) against
  # --checkpoint-async (host copy, then a writer thread), FULLY_SHARD per block with AdamW, bf16
  # autocast and gathers, at world NP. gpt2-medium saves twice (the second may wait for the
  # first); llama-8b once (96 GB a checkpoint: two would not fit the disk).
  for model in ${ASYNC62_MODELS:-gpt2-medium llama-8b}; do
    every=4; steps=8
    [ "$model" = llama-8b ] && steps=4
    for mode in sync async; do
      flags=""
      [ "$mode" = async ] && flags="--checkpoint-async"
      rm -rf /tmp/ckpt62
      timeout 500 build-gpu/ddp-train --nproc "$NP" --device cuda --model "$model" --batch-size 1 \
        --seq-len 1024 --fsdp --fsdp-wrap --autocast-bf16 --param-dtype bf16 --reduce-dtype fp32 \
        --optimizer adamw --steps "$steps" --checkpoint-every "$every" --keep-checkpoints 1 \
        --checkpoint-dir /tmp/ckpt62 --timeout-s 300 $flags $OURS_INIT >"$OUT/async62-$model-$mode.log" 2>&1
      note "async62 $model $mode world $NP rc=$?: $(grep -E 'blocked|background|waited|error' "$OUT/async62-$model-$mode.log" | cut -c1-220 | tr '\n' '|')"
      du -sb /tmp/ckpt62 2>/dev/null | tee -a "$SUMMARY"
    done
  done
  rm -rf /tmp/ckpt62
fi

if has hybrid63; then
  # Issue 63 on 4 GPUs: hybrid sharding (2 replicas of 2 shards) against FSDP2's HSDP
  # (fully_shard over the 2-D mesh), and both flat, per block, bf16 gathers, fp32 reduce, ours then
  # PyTorch's in turn; then ddp-train's weights under --dp-replicate 2 against DDP's (same seed and
  # batches), and the bytes each group sent per step.
  if [ "$NGPU" -lt 4 ]; then
    note "hybrid63: needs 4 GPUs, this machine has $NGPU"
  else
    for model in ${HYBRID63_MODELS:-gpt2-medium}; do
      flags="${FLAGS[$model]} --device cuda --repeat ${HYBRID63_REPEAT:-20} --warmup 5 --json --nproc 4"
      flags="$flags --fsdp --fsdp-wrap --param-dtype bf16 --reduce-dtype fp32"
      for mesh in "--dp-replicate 2" ""; do
        name=$([ -n "$mesh" ] && echo hybrid || echo flat)
        timeout 240 "$BENCH" $flags $mesh >"$OUT/hybrid63-$model-ours-$name.log" 2>&1
        note "hybrid63 $model ours $name rc=$?: $(grep -m1 '^{' "$OUT/hybrid63-$model-ours-$name.log" | cut -c1-400)"
        timeout 240 $PY bench/reference/torch_ddp.py $flags $mesh >"$OUT/hybrid63-$model-torch-$name.log" 2>&1
        note "hybrid63 $model torch $name rc=$?: $(grep -m1 '^{' "$OUT/hybrid63-$model-torch-$name.log" | cut -c1-400)"
      done
    done
    common="--nproc 4 --device cuda --model gpt --steps 30 --batch-size 4 --optimizer sgd --timeout-s 120"
    timeout 300 build-gpu/ddp-train $common --save-weights /tmp/w63-ddp.safetensors >"$OUT/hybrid63-train.log" 2>&1
    timeout 300 build-gpu/ddp-train $common --fsdp --fsdp-wrap --dp-replicate 2 \
      --save-weights /tmp/w63-hybrid.safetensors >>"$OUT/hybrid63-train.log" 2>&1
    note "hybrid63 ddp-train rc=$?: $(grep -m1 'hybrid' "$OUT/hybrid63-train.log"); $($PY -c '
import sys; sys.path.insert(0, "bench/reference")
from safetensors_io import load_file as load
a, b = load("/tmp/w63-ddp.safetensors"), load("/tmp/w63-hybrid.safetensors")
print("max relative difference to DDP", max(float((a[k] - b[k]).norm() / a[k].norm()) for k in a))' 2>&1 | tail -1)"
    rm -f /tmp/w63-*.safetensors
  fi
fi

if has text; then
  # ddp-train --data on the GPU: the byte-level GPT on GPL-3 under DDP and under FULLY_SHARD, whose
  # validation and sample forwards are collective; the validation all-reduce runs on NCCL.
  for style in ddp fsdp; do
    extra=""; [[ $style == fsdp ]] && extra="--fsdp --fsdp-wrap"
    timeout 300 build-gpu/ddp-train --nproc $NP --device cuda --data --steps 200 --eval-every 50 \
      --sample-bytes 80 --timeout-s 120 --plot "$OUT/loss-$style.svg" $extra >"$OUT/train-text-$style.log" 2>&1
    note "ddp-train --data $style nccl world $NP rc=$?: $(grep 'validation loss' "$OUT/train-text-$style.log" | tail -1)"
  done
  # A FULLY_SHARD checkpoint on the GPU (each rank's pieces saved from device memory, loaded back
  # into it): 100 steps and a save, then a resume to 200; its last validation loss is the
  # uninterrupted fsdp run's above.
  common="--nproc $NP --device cuda --data --eval-every 50 --timeout-s 120 --fsdp --fsdp-wrap --checkpoint-dir $OUT/ckpt"
  timeout 300 build-gpu/ddp-train $common --steps 100 --checkpoint-every 100 >"$OUT/train-text-ckpt.log" 2>&1
  rc=$?
  timeout 300 build-gpu/ddp-train $common --steps 200 --resume >>"$OUT/train-text-ckpt.log" 2>&1
  note "ddp-train --data fsdp saved at 100, resumed to 200 rc=$rc,$?: $(grep 'validation loss' "$OUT/train-text-ckpt.log" | tail -1)"
fi

# model -> flags shared by both sides
declare -A FLAGS=(
  [toy]="--model toy --batch-size 64"
  [toy8k]="--model toy8k --batch-size 256"
  [gpt2-small]="--model gpt2-small --batch-size 8 --autocast-bf16"
  [gpt2-medium]="--model gpt2-medium --batch-size 8 --autocast-bf16"
  [gpt-char]="--model gpt-char --batch-size 16 --autocast-bf16"
)
median() { grep -oE 'median_ms=[0-9.]+' "$1" | head -1 | cut -d= -f2; }

if has onegpu; then
  # What one GPU can measure: the step with no wrapper, and DDP and FULLY_SHARD (per block) at world
  # 1, ours then PyTorch's in turn. At world 1 no bytes cross a link, so the gap to the bare step is
  # each wrapper's own cost: hooks, bucket copies, gathers into full buffers, the bf16 casts.
  for model in ${ONE_MODELS:-gpt2-medium gpt2-small}; do
    flags="${FLAGS[$model]} --device cuda --repeat ${ONE_REPEAT:-20} --warmup 5"
    one() {  # name, then the command
      local name="$1"; shift
      timeout 200 "$@" $flags >"$OUT/one-$model-$name.log" 2>&1
      printf '  %-26s rc=%s %8s ms\n' "$name" "$?" "$(median "$OUT/one-$model-$name.log")" | tee -a "$SUMMARY"
    }
    note "one GPU $model (median step ms)"
    one ours-bare "$BENCH"
    one torch-bare $PY bench/reference/torch_ddp.py
    one ours-ddp "$BENCH" --ddp --nproc 1
    one torch-ddp $PY bench/reference/torch_ddp.py --ddp --nproc 1
    one ours-fsdp-wrap "$BENCH" --fsdp --fsdp-wrap --nproc 1
    one torch-fsdp2-wrap $PY bench/reference/torch_ddp.py --fsdp --fsdp-wrap --nproc 1
    mp="--param-dtype bf16 --reduce-dtype fp32"
    one ours-fsdp-wrap-bf16 "$BENCH" --fsdp --fsdp-wrap --nproc 1 $mp
    one torch-fsdp2-wrap-bf16 $PY bench/reference/torch_ddp.py --fsdp --fsdp-wrap --nproc 1 $mp
  done
fi

if has graphs; then
  # Issue 25: whole steps captured in CUDA graphs at world 1, ours (graphs/captured_step.hpp, the
  # capturable SGD) and PyTorch's recipe (bench/reference/torch_ddp.py --cuda-graph), eager and
  # captured, bare and DDP, in turn in one run. At world 1 NCCL runs no kernel for the in-place
  # sum: the DDP rows measure each side's bookkeeping and copies, not NCCL inside a graph.
  for model in ${GRAPH_MODELS:-toy gpt-char}; do
    flags="${FLAGS[$model]} --device cuda --repeat ${GRAPH_REPEAT:-50} --warmup 12"
    g() {  # name, then the command
      local name="$1"; shift
      timeout 200 "$@" $flags >"$OUT/graph-$model-$name.log" 2>&1
      printf '  %-24s rc=%s %8s ms %s\n' "$name" "$?" "$(median "$OUT/graph-$model-$name.log")" \
        "$(grep -o 'cuda graph .*' "$OUT/graph-$model-$name.log" | head -1 | cut -c1-150)" | tee -a "$SUMMARY"
    }
    note "CUDA graphs, $model (median step ms)"
    g ours-bare "$BENCH" --verbose
    g torch-bare $PY bench/reference/torch_ddp.py
    g ours-bare-graph "$BENCH" --cuda-graph --verbose
    g torch-bare-graph $PY bench/reference/torch_ddp.py --cuda-graph
    g ours-ddp "$BENCH" --ddp --nproc 1 --verbose
    g torch-ddp $PY bench/reference/torch_ddp.py --ddp --nproc 1
    g ours-ddp-graph "$BENCH" --ddp --nproc 1 --cuda-graph --verbose
    g torch-ddp-graph $PY bench/reference/torch_ddp.py --ddp --nproc 1 --cuda-graph
    g ours-fsdp-wrap "$BENCH" --fsdp --fsdp-wrap --nproc 1 --verbose
    g ours-fsdp-wrap-graph "$BENCH" --fsdp --fsdp-wrap --nproc 1 --cuda-graph --verbose
    # Attribution of the captured DDP step: no communication (noop hook).
    g ours-ddp-graph-noop "$BENCH" --ddp --nproc 1 --cuda-graph --verbose --comm-hook noop
  done
  # ddp-train --data (the 135 k-parameter byte GPT: launch-bound), eager and captured, DDP and
  # FULLY_SHARD per block: steps/s and the last validation loss (the same within rounding).
  for style in ddp fsdp; do
    extra=""; [[ $style == fsdp ]] && extra="--fsdp --fsdp-wrap"
    for mode in eager graph; do
      flag=""; [[ $mode == graph ]] && flag="--cuda-graph"
      timeout 300 build-gpu/ddp-train --nproc 1 --device cuda --data --steps 400 --eval-every 100 \
        --timeout-s 120 --verbose $extra $flag >"$OUT/train-graph-$style-$mode.log" 2>&1
      note "ddp-train --data $style $mode rc=$?: $(grep -oE '[0-9.]+ steps/s' "$OUT/train-graph-$style-$mode.log" | tail -1); $(grep 'validation loss' "$OUT/train-graph-$style-$mode.log" | tail -1); $(grep -o 'cuda graph .*' "$OUT/train-graph-$style-$mode.log" | head -1 | cut -c1-150)"
    done
  done
  # With SGD the eager (torch::optim) and captured (capturable) updates round alike: the same loss.
  for mode in eager graph; do
    flag=""; [[ $mode == graph ]] && flag="--cuda-graph"
    timeout 300 build-gpu/ddp-train --nproc 1 --device cuda --data --steps 400 --eval-every 100 \
      --optimizer sgd --timeout-s 120 --verbose $flag >"$OUT/train-graph-sgd-$mode.log" 2>&1
    note "ddp-train --data ddp --optimizer sgd $mode rc=$?: $(grep -oE '[0-9.]+ steps/s' "$OUT/train-graph-sgd-$mode.log" | tail -1); $(grep 'validation loss' "$OUT/train-graph-sgd-$mode.log" | tail -1)"
  done
fi

if has levers; then
  # Ours only, one run each: the default, then one lever at a time, and the 1-GPU baseline.
  for model in ${LEVER_MODELS:-toy toy8k gpt2-small gpt2-medium}; do
    flags="${FLAGS[$model]} --device cuda --repeat 20 --warmup 5"
    run() {  # name, then extra flags; env may be set by the caller
      local name="$1"; shift
      timeout 240 "$BENCH" $flags "$@" >"$OUT/lever-$model-$name.log" 2>&1
      printf '  %-16s %8s ms\n' "$name" "$(median "$OUT/lever-$model-$name.log")" | tee -a "$SUMMARY"
    }
    note "levers $model (median step ms, ours, 2 GPUs unless 1gpu)"
    run 1gpu
    run default --ddp --nproc 2
    run cap100 --ddp --nproc 2 --bucket-cap-mb 100
    run cap10 --ddp --nproc 2 --bucket-cap-mb 10
    run bf16hook --ddp --nproc 2 --comm-hook bf16
    run fp16hook --ddp --nproc 2 --comm-hook fp16
    run overlap --ddp --nproc 2 --optimizer-overlap
    NCCL_MAX_NCHANNELS=8 run nccl-ch8 --ddp --nproc 2
    NCCL_MIN_NCHANNELS=32 run nccl-ch32 --ddp --nproc 2
  done
fi

if has recipe; then
  # Issue 26: AdamW in weight-decay groups, warmup-cosine, clip 1.0, 2 micro-batches of 16 on both
  # sides, bf16 autocast on gpt-char (fused attention), ours and PyTorch's alternately; then
  # ddp-train --data with MFU.
  R="--optimizer adamw --weight-decay 0.1 --beta2 0.95 --warmup-steps 10 --lr-decay-steps 100"
  R="$R --min-lr 0.0001 --grad-clip 1.0 --grad-accum 2"
  $PY bench/compare --device cuda --models gpt-char --nproc "$NP" --batch-size 16 --autocast-bf16 \
    --pairs 3 --repeat 20 --warmup 5 --ours "$BENCH" --recipe-args="$R" --markdown \
    >"$OUT/recipe-compare.log" 2>&1
  note "recipe compare rc=$?"
  tail -12 "$OUT/recipe-compare.log" | tee -a "$SUMMARY"
  timeout 300 build-gpu/ddp-train --nproc "$NP" --device cuda --data --model gpt-char \
    --batch-size 32 --steps 300 --eval-every 100 --sample-bytes 0 --autocast-bf16 $R --lr 0.001 \
    --json >"$OUT/recipe-train.log" 2>&1
  note "recipe train rc=$?"
  grep -E '"step":(1|100|200|300),|val_loss|steps/s' "$OUT/recipe-train.log" | tail -8 |
    tee -a "$SUMMARY"
fi
if has table; then
  # The GPU table of docs/benchmarks.md: ours vs PyTorch in one run, A B alternated, with 1-GPU
  # baselines (--single) for the scaling efficiency.
  for model in ${TABLE_MODELS:-toy toy8k gpt2-small gpt2-medium}; do
    timeout 580 $PY bench/compare --device cuda --nproc 2 --single --markdown \
      --pairs "${PAIRS:-3}" --repeat 30 --warmup 5 --ours "$BENCH" --python $PY \
      ${FLAGS[$model]} ${TABLE_ARGS:-} >"$OUT/table-$model.log" 2>&1
    note "table $model rc=$?"; grep -E '^\|' "$OUT/table-$model.log" | tee -a "$SUMMARY"
  done
fi

if has final; then
  # What the GPU table of docs/benchmarks.md was made from, in priority order; a stage that would
  # not finish before DEADLINE_S (seconds since this script started) is skipped.
  t0=$SECONDS
  compare() {  # log name, expected seconds, then compare flags
    local name="$1" need="$2"; shift 2
    if ((SECONDS - t0 + need > ${DEADLINE_S:-480})); then note "skipped $name (deadline)"; return; fi
    timeout "$need" $PY bench/compare --device cuda --nproc 2 --markdown --repeat 30 --warmup 5 \
      --ours "$BENCH" --python $PY "$@" >"$OUT/$name.log" 2>&1
    note "$name rc=$?"; grep -E '^\| [a-z]' "$OUT/$name.log" | tee -a "$SUMMARY"
  }
  compare table-gpt2-medium 170 --pairs 2 --single ${FLAGS[gpt2-medium]}
  compare table-gpt2-small 120 --pairs 2 --single ${FLAGS[gpt2-small]}
  # toy8k in the regime of the issue's anchors (1 GPU 2.8 ms: TF32 on for fp32 products), both
  # sides through libtorch's own override, then ours with the bf16 hook against PyTorch's fp32.
  TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 compare table-toy8k-tf32 70 --pairs 2 --single ${FLAGS[toy8k]}
  TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 compare table-toy8k-tf32-bf16 50 --pairs 2 ${FLAGS[toy8k]} \
    --ours-args="--comm-hook bf16"
  compare table-toy8k-bf16 50 --pairs 2 ${FLAGS[toy8k]} --ours-args="--comm-hook bf16"
fi

if has attribution; then
  # Issue 13's attribution, ours and PyTorch's alternated: the 1-GPU step, DDP, DDP with its
  # communication skipped (noop hook: what the bookkeeping costs), and ours with every bucket
  # launched after backward (--no-overlap: how much the overlap hides).
  for model in ${ATTR_MODELS:-gpt2-medium gpt2-small}; do
    flags="${FLAGS[$model]} --device cuda --repeat ${ATTR_REPEAT:-20} --warmup 5"
    attr() {  # name, then the command
      local name="$1"; shift
      timeout 240 "$@" $flags >"$OUT/attr-$model-$name.log" 2>&1
      printf '  %-22s %8s ms\n' "$name" "$(median "$OUT/attr-$model-$name.log")" | tee -a "$SUMMARY"
    }
    note "attribution $model (median step ms; 2 GPUs unless 1gpu)"
    attr ours-1gpu "$BENCH"
    attr torch-1gpu $PY bench/reference/torch_ddp.py
    attr ours-ddp "$BENCH" --ddp --nproc 2
    attr torch-ddp $PY bench/reference/torch_ddp.py --ddp --nproc 2
    attr ours-ddp-noop "$BENCH" --ddp --nproc 2 --comm-hook noop
    attr torch-ddp-noop $PY bench/reference/torch_ddp.py --ddp --nproc 2 --comm-hook noop
    attr ours-ddp-no-overlap "$BENCH" --ddp --nproc 2 --no-overlap
  done
fi

if has tp; then
  # Tensor parallelism (issue 15): gpt2-medium split over the 2 GPUs (--tp 2, the Megatron plan),
  # ours then PyTorch's parallelize_module (torch_tp.py), then DDP both sides and our 1-GPU step,
  # same flags. 2x2 DP x TP needs 4 GPUs: docs/benchmarks.md has its command.
  for model in ${TP_MODELS:-gpt2-medium}; do
    flags="${FLAGS[$model]} --device cuda --repeat 20 --warmup 5"
    for run in "ours-tp2:$BENCH --nproc 2 --tp 2" "torch-tp2:$PY bench/reference/torch_ddp.py --nproc 2 --tp 2" \
      "ours-ddp:$BENCH --nproc 2 --ddp" "torch-ddp:$PY bench/reference/torch_ddp.py --nproc 2 --ddp" \
      "ours-1gpu:$BENCH"; do
      name="${run%%:*}"
      timeout 240 ${run#*:} $flags >"$OUT/tp-$model-$name.log" 2>&1
      printf '  tp %-10s %8s ms\n' "$name" "$(median "$OUT/tp-$model-$name.log")" | tee -a "$SUMMARY"
    done
  done
fi

if has tpref; then
  # PyTorch's side of --tp (bench/reference/torch_tp.py: parallelize_module + DDP over "dp") checked
  # for correctness on CPU Gloo (torch >= 2.2 only; Debian's 1.13 refuses --tp): at 1x2 it must end
  # where one process ends, at 2x2 where DDP at world 2 ends, same batches (rel. err < 1e-5).
  T="$OUT/tpref"; mkdir -p "$T"
  ref() { timeout 200 $PY bench/reference/torch_ddp.py --model "${TPREF_MODEL:-gpt-tiny}" \
    --batch-size 2 --repeat 3 --warmup 0 --lr 0.05 --timeout-s 60 "$@" >>"$T/runs.log" 2>&1; }
  ref --save-params "$T/plain.safetensors"
  ref --tp 2 --nproc 2 --save-params "$T/tp1x2.safetensors"
  ref --ddp --nproc 2 --save-params "$T/ddp2.safetensors"
  ref --ddp --tp 2 --nproc 4 --save-params "$T/tp2x2.safetensors"
  (cd bench/reference && $PY - "$T" <<'PYEOF'
import sys, safetensors_io
t = sys.argv[1]
for a, b in (("plain", "tp1x2"), ("ddp2", "tp2x2")):
    try:
        x = safetensors_io.load_file(f"{t}/{a}.safetensors")
        y = safetensors_io.load_file(f"{t}/{b}.safetensors")
    except Exception as e:
        print(f"tpref {b} vs {a}: missing ({e})"); continue
    if set(x) != set(y):
        print(f"tpref {b} vs {a}: names differ: only in {a}: {sorted(set(x) - set(y))[:4]}, "
              f"only in {b}: {sorted(set(y) - set(x))[:4]}"); continue
    worst = max(((x[k] - y[k]).norm() / x[k].norm()).item() for k in x)
    print(f"tpref {b} vs {a}: {len(x)} tensors, max rel. err {worst:.3g}", "ok" if worst < 1e-5 else "MISMATCH")
PYEOF
  ) 2>&1 | tee -a "$SUMMARY"
  grep -iE "error|Traceback" "$T/runs.log" | head -5 | tee -a "$SUMMARY"
  rm -f "$T"/*.safetensors
fi

if has overlap; then
  # The optimizer-overlap lever where communication is exposed (toy8k with TF32): each bucket's SGD
  # runs on the compute stream as soon as its all-reduce's event fires, while later buckets are
  # still on the wire.
  t0=$SECONDS
  for hook in allreduce bf16; do
    TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 timeout 80 $PY bench/compare --device cuda --nproc 2 \
      --markdown --repeat 30 --warmup 5 --pairs 2 --ours "$BENCH" --python $PY ${FLAGS[toy8k]} \
      --ours-args="--optimizer-overlap --comm-hook $hook" >"$OUT/overlap-toy8k-tf32-$hook.log" 2>&1
    note "overlap-toy8k-tf32-$hook rc=$?"
    grep -E '^\| [a-z]' "$OUT/overlap-toy8k-tf32-$hook.log" | tee -a "$SUMMARY"
  done
fi

if has ac59; then
  # Issue 59: every row of the issue's table (FULLY_SHARD per block with activation checkpointing,
  # each failed at the first backward on CUDA before the fix), then the benchmark row: gpt2-medium
  # per block with checkpointing, ours against FSDP2 with checkpoint_wrapper per block, at world 2
  # and NP (4 where lent), in pairs (ours, then PyTorch's), AC59_PAIRS times.
  for row in "gpt-tiny 4 " "gpt-tiny 4 --autocast-bf16" \
    "gpt-tiny 4 --autocast-bf16 --param-dtype bf16 --reduce-dtype fp32" "gpt2-medium 2 " \
    "gpt2-medium 2 --autocast-bf16" "gpt2-medium 2 --autocast-bf16 --param-dtype bf16 --reduce-dtype fp32" \
    "gpt2-medium 1 --optimizer adamw --param-dtype bf16 --reduce-dtype fp32 --n-embd 4096 --n-head 32 --n-layer 24"; do
    read -r model batch extra <<<"$row"
    timeout 300 "$BENCH" --model "$model" --batch-size "$batch" --device cuda --nproc $NP --fsdp \
      --fsdp-wrap --fsdp-checkpoint --repeat 3 --warmup 1 $extra >"$OUT/ac59-row.log" 2>&1
    note "ac59 row '$row' world $NP rc=$?: $(grep -m1 -E 'median|error|ddp:' "$OUT/ac59-row.log")"
  done
  flags="${FLAGS[gpt2-medium]} --device cuda --repeat ${AC59_REPEAT:-20} --warmup 5 --json"
  mp="--param-dtype bf16 --reduce-dtype fp32"
  for world in $(printf '%s\n' 2 "$NP" | sort -u); do
    for pair in $(seq "${AC59_PAIRS:-2}"); do
      for side in ${LLAMA_SIDES:-ours torch}; do
        cmd="$BENCH"
        [[ $side == torch ]] && cmd="$PY bench/reference/torch_ddp.py"
        for extra in "" "$mp"; do
          log="$OUT/ac59-$side-w$world-${extra:+bf16-}$pair.log"
          timeout 300 $cmd $flags --nproc "$world" --fsdp --fsdp-wrap --fsdp-checkpoint $extra \
            >"$log" 2>&1
          note "ac59 gpt2-medium per block + AC $side world $world ${extra:-fp32 params} pair $pair rc=$?: $(grep -m1 '^{' "$log")"
        done
      done
    done
  done
fi

if has llama; then
  # Issue 60: the Llama rows, ours (FULLY_SHARD per block) against FSDP2 (fully_shard per block
  # and the root), both with activation checkpointing per block, AdamW, bf16 autocast, bf16
  # gathers and fp32 reduce-scatters, at world NP, in pairs (ours, then PyTorch's). LLAMA_MODELS:
  # "model:batch:seq_len" items (default llama-1b at 8192 tokens); LLAMA_PAIRS pairs; LLAMA_SIDES
  # of ours, registered (--nccl-register-buffers --nccl-cta-policy 2) and torch; FAST_INIT.
  for item in ${LLAMA_MODELS:-llama-1b:1:8192}; do
    IFS=: read -r model batch seq <<<"$item"
    flags="--model $model --batch-size $batch --seq-len $seq --device cuda --nproc $NP --fsdp"
    flags="$flags --fsdp-wrap --fsdp-checkpoint --autocast-bf16 --param-dtype bf16"
    flags="$flags --reduce-dtype fp32 --optimizer adamw --repeat ${LLAMA_REPEAT:-10} --warmup 3 --json"
    for pair in $(seq "${LLAMA_PAIRS:-2}"); do
      for side in ${LLAMA_SIDES:-ours torch}; do
        cmd="$BENCH"
        [[ $side == torch ]] && cmd="$PY bench/reference/torch_ddp.py"
        # registered: ours with the gather buffer registered and NCCL's copy-engine all-gathers.
        [[ $side == registered ]] && cmd="$BENCH --nccl-register-buffers --nccl-cta-policy 2"
        if [[ $side == torch ]]; then cmd="$cmd $TORCH_INIT"; else cmd="$cmd $OURS_INIT"; fi
        log="$OUT/llama-$model-b$batch-s$seq-$side-$pair.log"
        start=$(date +%s)
        timeout 480 $cmd $flags >"$log" 2>&1
        note "llama $model b$batch x $seq world $NP $side pair $pair rc=$? ($(($(date +%s) - start)) s): $(grep -m1 '^{' "$log" || tail -2 "$log")"
      done
    done
  done
fi

if has attr60; then
  # Issue 60 item 4: where the llama step goes, ours and FSDP2's, from kernel traces of three
  # steps each (not timed: the timing pairs are the llama stage's). ATTR_MODEL "model:batch:seq".
  IFS=: read -r model batch seq <<<"${ATTR_MODEL:-llama-8b:1:8192}"
  flags="--model $model --batch-size $batch --seq-len $seq --device cuda --nproc $NP --fsdp"
  flags="$flags --fsdp-wrap --fsdp-checkpoint --autocast-bf16 --param-dtype bf16"
  flags="$flags --reduce-dtype fp32 --optimizer adamw --warmup 2"
  timeout 480 $BENCH $flags --repeat 2 --kernel-trace "$OUT/attr-ours.json" >"$OUT/attr-ours.log" 2>&1
  note "attr60 ours $model b$batch x $seq rc=$?"
  $PY bench/trace_attribution.py "$OUT/attr-ours.json" >"$OUT/attr-ours.txt" 2>&1
  head -12 "$OUT/attr-ours.txt" | tee -a "$SUMMARY"
  timeout 480 $PY bench/reference/torch_ddp.py $flags --repeat 3 --trace-file "$OUT/attr-torch.json" \
    >"$OUT/attr-torch.log" 2>&1
  note "attr60 torch $model b$batch x $seq rc=$?"
  $PY bench/trace_attribution.py "$OUT/attr-torch.json" >"$OUT/attr-torch.txt" 2>&1
  head -12 "$OUT/attr-torch.txt" | tee -a "$SUMMARY"
fi

if has ctas60; then
  # Issue 60 item 4: the SM share NCCL takes from the overlapped compute, one lever at a time
  # against the default, alternated rounds (CTAS_ROUNDS), the floors60 flags at llama-8b.
  flags="--model llama-8b --batch-size 1 --seq-len 1024 --device cuda --nproc $NP --fsdp --fsdp-wrap"
  flags="$flags --fsdp-checkpoint --autocast-bf16 --param-dtype bf16 --reduce-dtype fp32"
  flags="$flags --optimizer adamw --repeat ${FLOOR_REPEAT:-6} --warmup 3 --json"
  IFS=';' read -ra levers <<<"${CTAS_LEVERS:-default;--nccl-max-ctas 8;--nccl-max-ctas 4;--nccl-cta-policy 1}"
  for round in $(seq "${CTAS_ROUNDS:-2}"); do
    for lever in "${levers[@]}"; do
      extra=$lever
      [[ $lever == default ]] && extra=""
      log="$OUT/ctas60-r$round-${lever// /_}.log"
      start=$(date +%s)
      timeout 240 $BENCH $flags $extra $OURS_INIT >"$log" 2>&1
      note "ctas60 round $round [$lever] rc=$? ($(($(date +%s) - start)) s): $(grep -m1 '^{' "$log" | grep -o '"median_ms":[0-9.]*')"
    done
  done
fi

if has floors60; then
  # Issue 60 item 4 / done means: the batch-1 regime (1024 tokens a rank, communication-bound)
  # against its floors at world NP, the llama stage's flags: ours with the last timed step's
  # collectives replayed alone afterwards (--comm-floor: the communication-only floor), ours with
  # every collective a no-op (--no-comm: the compute-only floor, the same shards and kernels), and
  # FSDP2. FLOOR_MODELS: llama-8b, gpt5b (the issue's 5.2 B GPT: gpt2-medium at 4096 x 24).
  for name in ${FLOOR_MODELS:-llama-8b gpt5b}; do
    shape="--model $name"
    [[ $name == gpt5b ]] && shape="--model gpt2-medium --n-embd 4096 --n-head 32 --n-layer 24"
    flags="$shape --batch-size 1 --seq-len 1024 --device cuda --nproc $NP --fsdp --fsdp-wrap"
    flags="$flags --fsdp-checkpoint --autocast-bf16 --param-dtype bf16 --reduce-dtype fp32"
    flags="$flags --optimizer adamw --repeat ${FLOOR_REPEAT:-8} --warmup 3 --json"
    for side in ${FLOOR_SIDES:-ours nocomm torch}; do
      case $side in
        ours) cmd="$BENCH $flags --comm-floor 5 $OURS_INIT" ;;
        nocomm) cmd="$BENCH $flags --no-comm $OURS_INIT" ;;
        torch) cmd="$PY bench/reference/torch_ddp.py $flags $TORCH_INIT" ;;
      esac
      log="$OUT/floors-$name-$side.log"
      start=$(date +%s)
      timeout 400 $cmd >"$log" 2>&1
      note "floors $name b1 x 1024 world $NP $side rc=$? ($(($(date +%s) - start)) s): $(grep -m1 '^{' "$log" | cut -c1-200) $(grep -o '"comm_floor":{[^}]*}' "$log")"
    done
  done
fi
if has syncbn61; then
  # Issue 61 item 1: resnet-small (ResNet-18 at 32x32) under DDP, bf16 autocast, SYNCBN_BATCH
  # images a rank, ours and PyTorch's in the same call, with per-rank BatchNorm and with
  # SyncBatchNorm (--sync-bn: ours, and PyTorch's convert_sync_batchnorm).
  flags="--model resnet-small --batch-size ${SYNCBN_BATCH:-128} --device cuda --nproc $NP --ddp"
  flags="$flags --autocast-bf16 --repeat ${SYNCBN_REPEAT:-30} --warmup 5 --json"
  for bn in "" "--sync-bn"; do
    for side in ours torch; do
      case $side in
        ours) cmd="$BENCH $flags $bn" ;;
        torch) cmd="$PY bench/reference/torch_ddp.py $flags $bn" ;;
      esac
      log="$OUT/syncbn-$side${bn:+-sync}.log"
      start=$(date +%s)
      timeout 300 $cmd >"$log" 2>&1
      note "resnet-small b${SYNCBN_BATCH:-128} world $NP bf16 ${bn:-per-rank-bn} $side rc=$? ($(($(date +%s) - start)) s): $(grep -m1 '^{' "$log" | cut -c1-220)"
    done
  done
fi
if has check61; then
  # Issue 61 item 4: the replica check's cost, gpt2-small under DDP (bf16 autocast, 8 x 1024 tokens
  # a rank), checked every forward (--check-replicas-every 1: its worst case) and never.
  flags="--model gpt2-small --batch-size 8 --device cuda --nproc $NP --ddp --autocast-bf16"
  flags="$flags --repeat 20 --warmup 5 --json"
  for every in 0 1 10; do
    log="$OUT/check61-every$every.log"
    timeout 300 $BENCH $flags --check-replicas-every $every >"$log" 2>&1
    note "gpt2-small b8 world $NP --check-replicas-every $every rc=$?: $(grep -m1 '^{' "$log" | cut -c1-160)"
  done
fi
if has vision61; then
  # Issue 61 item 6: examples/vision_cnn as a user builds it (installed libddp, find_package) and
  # runs it on GPUs (NCCL, channels_last, bf16 autocast) at world 2, DDP and FULLY_SHARD.
  TORCH_PREFIX="$($PY -c 'import torch;print(torch.utils.cmake_prefix_path)')"
  prefix=/tmp/ddp-prefix
  rm -rf "$prefix" /tmp/vision-build
  { cmake --install build-gpu --prefix "$prefix" &&
    cmake -S examples/vision_cnn -B /tmp/vision-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$prefix;$TORCH_PREFIX" && cmake --build /tmp/vision-build; } \
    >"$OUT/vision-build.log" 2>&1 || { note "vision_cnn build failed"; tail -20 "$OUT/vision-build.log"; }
  for style in replicate fully_shard; do
    log="$OUT/vision-$style.log"
    timeout 300 "$prefix/bin/ddp-run" --nproc-per-node 2 -- /tmp/vision-build/vision_cnn \
      --device cuda --style $style --steps 200 --eval-every 100 >"$log" 2>&1
    note "vision_cnn cuda world 2 $style rc=$?: $(grep 'final:' "$log" | tr '\n' ' ')"
  done
fi
if has train60; then
  # Issue 60 item 5: llama-1b trained for real on bytes (ddp-train --data) at world NP:
  # FULLY_SHARD per block, activation checkpointing, AdamW in decay groups, warmup-cosine, clip,
  # bf16 autocast and gathers; a save at the end and a resume that goes on (TRAIN60_STEPS).
  steps=${TRAIN60_STEPS:-200}
  common="--nproc $NP --device cuda --data --model llama-1b --batch-size 4 --seq-len 1024"
  common="$common --fsdp --fsdp-wrap --fsdp-checkpoint --autocast-bf16 --param-dtype bf16 --reduce-dtype fp32"
  common="$common --optimizer adamw --weight-decay 0.1 --beta2 0.95 --lr 0.0003 --warmup-steps 20"
  common="$common --lr-decay-steps $((2 * steps)) --min-lr 0.00003 --grad-clip 1.0 --eval-every 50"
  common="$common --sample-bytes 0 --timeout-s 300 --checkpoint-dir /tmp/ckpt60"
  rm -rf /tmp/ckpt60
  start=$(date +%s)
  timeout 500 build-gpu/ddp-train $common --steps "$steps" --checkpoint-every "$steps" --json \
    >"$OUT/train60.log" 2>&1
  note "train60 llama-1b --data world $NP $steps steps rc=$? ($(($(date +%s) - start)) s): $(grep -c '"step"' "$OUT/train60.log") step lines; $(grep -E 'val_loss|validation' "$OUT/train60.log" | tail -2 | tr '\n' ' ')"
  grep -E '"step":(1|50|100|150|200),' "$OUT/train60.log" | cut -c1-300 | tee -a "$SUMMARY"
  du -sb /tmp/ckpt60 2>/dev/null | tee -a "$SUMMARY"
  start=$(date +%s)
  timeout 300 build-gpu/ddp-train $common --steps $((steps + 20)) --resume --json \
    >"$OUT/train60-resume.log" 2>&1
  note "train60 resumed at $steps to $((steps + 20)) rc=$? ($(($(date +%s) - start)) s): $(grep -m1 'resumed from' "$OUT/train60-resume.log") $(grep -E '"step":'$((steps + 20))',' "$OUT/train60-resume.log" | cut -c1-200)"
  rm -rf /tmp/ckpt60
fi
if has fit; then
  # Issue 60 item 3: llama-8b under DDP on 80 GB GPUs is refused before the wrap by the memory
  # plan, naming the numbers and the style that fits; under fully_shard the plan is printed.
  timeout 400 $BENCH --model llama-8b --nproc $NP --device cuda --ddp --optimizer adamw \
    --batch-size 1 --seq-len 1024 --repeat 1 --warmup 0 >"$OUT/fit-ddp.log" 2>&1
  note "fit llama-8b ddp rc=$? (a refusal expected): $(grep -m1 'needs an estimated' "$OUT/fit-ddp.log")"
fi

if has sharded; then
  # FULLY_SHARD on NCCL. Correctness: ddp-train's loss curve under fully_shard per block equals
  # DDP's (same seed, same batches). Speed and memory: ours (fully_shard per block, and DDP) against
  # PyTorch FSDP2 (fully_shard per block + root), same flags, one after the other in this run.
  for style in "" "--fsdp --fsdp-wrap" "--fsdp --fsdp-wrap --param-dtype bf16 --reduce-dtype fp32"; do
    timeout 300 build-gpu/ddp-train --nproc 2 --device cuda --model gpt --steps 30 --timeout-s 120 \
      $style >"$OUT/train-style.log" 2>&1
    note "ddp-train gpt nccl ${style:-ddp} rc=$?: $(tail -1 "$OUT/train-style.log")"
  done
  # Sharded checkpoints on NCCL: saved by both ranks every 10 steps, then resumed.
  rm -rf "$OUT/sckpt"
  timeout 300 build-gpu/ddp-train --nproc 2 --device cuda --model gpt --steps 20 --timeout-s 120 \
    --fsdp --fsdp-wrap --checkpoint-dir "$OUT/sckpt" --checkpoint-every 10 >"$OUT/train-sckpt.log" 2>&1
  rc=$?
  timeout 300 build-gpu/ddp-train --nproc 2 --device cuda --model gpt --steps 30 --timeout-s 120 \
    --fsdp --fsdp-wrap --checkpoint-dir "$OUT/sckpt" --resume >>"$OUT/train-sckpt.log" 2>&1
  note "ddp-train fully_shard sharded checkpoint+resume nccl rc=$rc,$?: $(grep -m1 'resumed from' "$OUT/train-sckpt.log"); $(tail -1 "$OUT/train-sckpt.log")"
  rm -rf "$OUT/sckpt"
  for model in ${SHARD_MODELS:-gpt2-medium}; do
    flags="${FLAGS[$model]} --device cuda --repeat ${SHARD_REPEAT:-20} --warmup 5 --json"
    run_side() {  # name, then the command (2 ranks unless the name ends in -1gpu)
      local name="$1" nproc=2; shift
      [[ "$name" == *-1gpu ]] && nproc=1
      timeout 240 "$@" $flags --nproc $nproc >"$OUT/sharded-$model-$name.log" 2>&1
      note "sharded $model $name rc=$?: $(grep -m1 '^{' "$OUT/sharded-$model-$name.log")"
    }
    # Pairs, ours then PyTorch's, so that a drift of the shared machine hits both alike.
    run_side ours-fsdp-wrap "$BENCH" --fsdp --fsdp-wrap
    run_side torch-fsdp2-wrap $PY bench/reference/torch_ddp.py --fsdp --fsdp-wrap
    mp="--param-dtype bf16 --reduce-dtype fp32"  # FSDP2's recommended policy
    run_side ours-fsdp-wrap-bf16 "$BENCH" --fsdp --fsdp-wrap $mp
    run_side torch-fsdp2-wrap-bf16 $PY bench/reference/torch_ddp.py --fsdp --fsdp-wrap $mp
    run_side ours-fsdp-wrap-bf16-reduce-bf16 "$BENCH" --fsdp --fsdp-wrap --param-dtype bf16
    run_side torch-fsdp2-wrap-bf16-reduce-bf16 $PY bench/reference/torch_ddp.py --fsdp --fsdp-wrap --param-dtype bf16
    run_side ours-ddp "$BENCH" --ddp
    run_side torch-ddp $PY bench/reference/torch_ddp.py --ddp
    run_side ours-1gpu "$BENCH"
    if [[ -n "${SHARD_EXTRA:-}" ]]; then  # measured 2026-11-22 (docs/benchmarks.md); on request
      run_side ours-fsdp-wrap-keep "$BENCH" --fsdp --fsdp-wrap --reshard-after-forward false
      run_side ours-fsdp-one-unit "$BENCH" --fsdp
      run_side ours-fsdp-wrap-checkpoint "$BENCH" --fsdp --fsdp-wrap --fsdp-checkpoint
    fi
  done
fi

if has fsdpbest; then
  # Issue 36 item 4, FSDP2 at its best: our FULLY_SHARD per block against FSDP2 per block under its
  # documented knobs (bench/reference/torch_fsdp.py), on $NP GPUs. FSDP2's default already keeps
  # the root gathered after forward, so root-false (torchtitan's) runs the same schedule and its
  # row shows the noise; true reshards the root too where this torch honours it (the log's "FSDP2
  # as run" line says which). Ours before and after PyTorch's rows, so that a drift of the machine
  # shows; ours in bf16 for the row with FSDP2's recommended bf16/fp32 policy.
  for model in ${BEST_MODELS:-gpt2-medium}; do
    flags="${FLAGS[$model]} --device cuda --repeat ${BEST_REPEAT:-20} --warmup 5 --json --verbose"
    best() {  # name, then the command
      local name="$1" log="$OUT/fsdpbest-$model-$1.log" rc result peak; shift
      timeout 200 "$@" $flags --nproc $NP >"$log" 2>&1
      rc=$?
      result=$(grep -m1 '^{.*"median_ms":' "$log")
      peak=$(grep -oE '"device_peak_allocated_bytes":[0-9]+' <<<"$result" | cut -d: -f2)
      printf '  %-40s rc=%s %8s ms  device peak %s\n' "$name" "$rc" \
        "$(grep -oE '"median_ms":[0-9.]+' <<<"$result" | cut -d: -f2)" \
        "${peak:+$(awk -v b="$peak" 'BEGIN { printf "%.2f GiB", b / 2^30 }')}" | tee -a "$SUMMARY"
      grep -m1 -o 'FSDP2 as run: .*' "$log" | sed 's/^/    /' | tee -a "$SUMMARY"
      [[ -n "$result" ]] || tail -1 "$log" | cut -c1-200 | sed 's/^/    /' | tee -a "$SUMMARY"
    }
    ours() {
      best "ours-fsdp-wrap$1" "$BENCH" --fsdp --fsdp-wrap
      best "ours-fsdp-wrap-bf16$1" "$BENCH" --fsdp --fsdp-wrap --param-dtype bf16 --reduce-dtype fp32
      best "ours-ddp$1" "$BENCH" --ddp
    }
    ref="$PY bench/reference/torch_ddp.py --fsdp --fsdp-wrap"
    note "fsdpbest $model, $NP GPU(s) (median step ms, device peak allocated on rank 0)"
    ours ""
    best torch-fsdp2-default $ref
    best torch-fsdp2-root-false $ref --reshard-after-forward root-false
    best torch-fsdp2-root-false-prefetch1 $ref --reshard-after-forward root-false --fsdp-prefetch 1
    best torch-fsdp2-keep $ref --reshard-after-forward false
    best torch-fsdp2-true $ref --reshard-after-forward true
    best torch-fsdp2-bf16-root-false-prefetch1 $ref --param-dtype bf16 --reduce-dtype fp32 \
      --reshard-after-forward root-false --fsdp-prefetch 1
    ours "-again"
  done
fi

if has capture35; then
  # Issue 35: the whole GPT recipe as one captured step. gpt-char with AdamW in weight-decay groups,
  # warmup-cosine, clip 1.0, 2 micro-batches of 8 (16 sequences a step per rank on both sides:
  # --batch-size is the micro-batch), bf16: ours and PyTorch's, eager and captured, DDP at each
  # world of RECIPE_WORLDS, alternated ROUNDS times (median step ms).
  R="--optimizer adamw --weight-decay 0.1 --beta2 0.95 --warmup-steps 10 --lr-decay-steps 1000"
  R="$R --min-lr 0.0001 --grad-clip 1.0 --grad-accum 2"
  rec() {  # name, then the command
    local name="$1"; shift
    timeout 200 "$@" >"$OUT/c35-$name.log" 2>&1
    printf '  %-34s rc=%s %8s ms %s\n' "$name" "$?" "$(median "$OUT/c35-$name.log")" \
      "$(grep -o 'cuda graph .*' "$OUT/c35-$name.log" | head -1 | cut -c1-120)" | tee -a "$SUMMARY"
  }
  if [[ -z "${SKIP_GPTCHAR:-}" ]]; then
  for world in ${RECIPE_WORLDS:-1}; do
    f="--model gpt-char --batch-size 8 --autocast-bf16 --device cuda --repeat ${C35_REPEAT:-50}"
    f="$f --warmup 12 --ddp --nproc $world $R"
    note "gpt-char recipe, DDP world $world (median step ms)"
    for round in $(seq "${ROUNDS:-2}"); do
      rec "w$world-ours-eager-$round" "$BENCH" $f
      rec "w$world-ours-graph-$round" "$BENCH" $f --cuda-graph --verbose
      rec "w$world-torch-eager-$round" $PY bench/reference/torch_ddp.py $f
      rec "w$world-torch-graph-$round" $PY bench/reference/torch_ddp.py $f --cuda-graph --verbose
      [[ -n "${TORCH_FOREACH:-}" ]] && rec "w$world-torch-graph-foreach-$round" $PY \
        bench/reference/torch_ddp.py $f --cuda-graph --optim-impl foreach
    done
  done
  fi
  if [[ -n "${GPT2:-}" ]]; then
    # gpt2-small, batch 16 x 1024, world 1, captured: the bare step (forward, backward, plain SGD)
    # against the whole recipe.
    # 16 sequences a step on both: the bare step's one batch of 16, the recipe's 2 micro-batches of 8.
    f="--model gpt2-small --autocast-bf16 --device cuda --repeat 20 --warmup 12"
    note "gpt2-small b16 captured, world 1 (median step ms)"
    for round in 1 2; do
      rec "gpt2s-bare-graph-$round" "$BENCH" $f --batch-size 16 --cuda-graph --verbose
      rec "gpt2s-recipe-graph-$round" "$BENCH" $f --batch-size 8 --cuda-graph $R --verbose
    done
  fi
  if [[ -n "${TRAIN:-}" ]]; then
    # ddp-train --data gpt-char with the recipe, eager and captured: steps/s after the first step,
    # the validation loss at step 300; eager twice, to see how far two eager runs agree.
    for mode in eager graph eager-again; do
      flag=""; [[ $mode == graph ]] && flag="--cuda-graph"
      timeout 300 build-gpu/ddp-train --nproc 1 --device cuda --data --model gpt-char \
        --batch-size 32 --steps 300 --eval-every 100 --sample-bytes 0 --autocast-bf16 $R --lr 0.001 \
        --timeout-s 120 --verbose $flag >"$OUT/c35-train-$mode.log" 2>&1
      note "ddp-train --data gpt-char recipe $mode rc=$?: $(grep -oE '[0-9.]+ steps/s after the first step' "$OUT/c35-train-$mode.log" | tail -1); $(grep -i 'validation loss' "$OUT/c35-train-$mode.log" | tail -1); $(grep -o 'cuda graph .*' "$OUT/c35-train-$mode.log" | head -1 | cut -c1-100)"
    done
    # Three epochs captured at world $NP (batch 32: the partial batch at each epoch's end dropped),
    # against the same run eager; then the captured run checkpointed at 700 and resumed.
    for mode in eager graph; do
      flag=""; [[ $mode == graph ]] && flag="--cuda-graph"
      timeout 300 build-gpu/ddp-train --nproc "$NP" --device cuda --data --model gpt-char \
        --batch-size 32 --steps "${EPOCH_STEPS:-1500}" --eval-every 250 --sample-bytes 0 \
        --autocast-bf16 $R --lr 0.001 --timeout-s 120 $flag >"$OUT/c35-epochs-$mode.log" 2>&1
      note "ddp-train --data 3 epochs world $NP $mode rc=$?: $(grep -oE '[0-9.]+ steps/s after the first step' "$OUT/c35-epochs-$mode.log" | tail -1)"
      grep -iE 'validation loss|drop' "$OUT/c35-epochs-$mode.log" | tail -8 | tee -a "$SUMMARY"
    done
    rm -rf /tmp/c35-ckpt
    common="--nproc $NP --device cuda --data --model gpt-char --batch-size 32 --eval-every 250 --sample-bytes 0 --autocast-bf16 $R --lr 0.001 --timeout-s 120 --cuda-graph --checkpoint-dir /tmp/c35-ckpt"
    timeout 300 build-gpu/ddp-train $common --steps 700 --checkpoint-every 700 >"$OUT/c35-resume.log" 2>&1
    rc=$?
    timeout 300 build-gpu/ddp-train $common --steps "${EPOCH_STEPS:-1500}" --resume >>"$OUT/c35-resume.log" 2>&1
    note "captured, saved at 700 and resumed rc=$rc,$?: $(grep 'resumed from' "$OUT/c35-resume.log")"
    grep -iE 'validation loss' "$OUT/c35-resume.log" | tail -3 | tee -a "$SUMMARY"
    rm -rf /tmp/c35-ckpt
  fi
fi

if has parity; then
  timeout 300 $PY bench/compare --parity --device cuda --nproc 2 --ours "$BENCH" --python $PY \
    --model toy,gpt-tiny >"$OUT/parity.log" 2>&1
  note "parity rc=$?"; tail -6 "$OUT/parity.log" | tee -a "$SUMMARY"
fi
grep -E '^torch|max relative error' "$OUT/machine.log" "$OUT/tests.log" 2>/dev/null | sed 's/^[^:]*://' >>"$SUMMARY"
# The device tool returns a handful of files: everything goes back as one archive.
# Written outside $OUT first: tar reading the folder it writes into fails with "file changed".
tar -czf /tmp/gpu-check-logs.tgz -C "$OUT" . && mv /tmp/gpu-check-logs.tgz "$OUT/" &&
  find "$OUT" -type f ! -name gpu-check-logs.tgz ! -name summary.txt -delete
echo "=== summary ($SUMMARY)"
cat "$SUMMARY"
