#!/usr/bin/env bash
# On the GPU machine: build libddp against its torch 2.x libtorch (CUDA, NCCL), run the tests that
# need no Gloo (its torch ships no Gloo headers), and a 2-GPU NCCL training run. Logs go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpu-check}"
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0  # NVLink multicast off, as the device notes require
TORCH_PREFIX="$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')"
{
  nvidia-smi -L
  python3 -c 'import torch;print("torch", torch.__version__, "cuda", torch.version.cuda)'
} >"$OUT/machine.log" 2>&1
start=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" \
  >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build build-gpu -j "$(nproc)" >"$OUT/build.log" 2>&1 || { grep -E "error" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "build: $(( $(date +%s) - start )) s; warnings: $(grep -c 'warning:' "$OUT/build.log")"
grep -E "libddp:" "$OUT/configure.log"
build-gpu/tests/ddp_tests --gtest_filter='BucketPlan.*:Env.*:ReplicaCheck.*:Spawn.*' \
  >"$OUT/unit-tests.log" 2>&1; echo "unit tests rc=$?"; tail -3 "$OUT/unit-tests.log"
for model in net gpt; do
  timeout 300 build-gpu/ddp-train --nproc 2 --device cuda --model "$model" --steps 50 \
    --timeout-s 120 >"$OUT/train-$model.log" 2>&1
  echo "ddp-train $model nccl rc=$?"; tail -2 "$OUT/train-$model.log"
done
