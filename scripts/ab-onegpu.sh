#!/usr/bin/env bash
# A/B on one GPU, ours only, alternated in one sitting: an older commit's ddp-bench against this
# tree's (build-gpu/, from scripts/gpu-check.sh build), gpt2-medium at world 1 bare, DDP,
# FULLY_SHARD per block, with bf16 gathers, and DEFAULT per block (at world 1 every parameter divides
# evenly, so DEFAULT shards all of them: its sharded path, not its mix). Prepare the older tree here (it travels with the
# working tree to the device machine, so it must not be ignored, nor committed; build-*/ inside
# it is ignored and kept between calls):
#   git archive <commit> | (mkdir -p ab-base && tar -x -C ab-base)   (BASE=dir for another place)
# then, on the device: OUT=$OUT bash scripts/ab-onegpu.sh ROUNDS   (ONLY=fsdp: one run kind)
set -uo pipefail
export NCCL_NVLS_ENABLE=0
unset TORCH_ALLOW_TF32_CUBLAS_OVERRIDE
OUT="${OUT:-/tmp/ab}"; mkdir -p "$OUT"
BASE="${BASE:-ab-base}"
if [ ! -x ${BASE}/build-gpu/ddp-bench ]; then
  P="$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')"
  cmake -S ${BASE} -B ${BASE}/build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDDP_BUILD_TESTS=OFF -DCMAKE_PREFIX_PATH="$P" >"$OUT/base-configure.log" 2>&1
  cmake --build ${BASE}/build-gpu -j "$(nproc)" --target ddp-bench >"$OUT/base-build.log" 2>&1 || { tail -20 "$OUT/base-build.log"; exit 1; }
fi
median() { grep -oE 'median_ms=[0-9.]+' "$1" | head -1 | cut -d= -f2; }
flags="--model gpt2-medium --batch-size 8 --autocast-bf16 --device cuda --repeat 20 --warmup 5"
for round in $(seq 1 "${1:-1}"); do
  for which in base new; do
    bench=build-gpu/ddp-bench; [ $which = base ] && bench=${BASE}/build-gpu/ddp-bench
    for run in bare "ddp:--ddp --nproc 1" "fsdp:--fsdp --fsdp-wrap --nproc 1" "fsdp-bf16:--fsdp --fsdp-wrap --nproc 1 --param-dtype bf16 --reduce-dtype fp32" "default:--style default --fsdp-wrap --nproc 1"; do
      [ -n "${ONLY:-}" ] && [ "${run%%:*}" != "$ONLY" ] && continue
      name=${run%%:*}; extra=""; [[ $run == *:* ]] && extra=${run#*:}
      log="$OUT/$which-$name-$round.log"
      timeout 200 $bench $flags $extra >"$log" 2>&1
      printf 'round %s %-5s %-10s rc=%s %8s ms\n' "$round" "$which" "$name" "$?" "$(median "$log")" | tee -a "$OUT/ab.txt"
    done
  done
done
