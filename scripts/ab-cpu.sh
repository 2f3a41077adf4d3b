#!/usr/bin/env bash
# A/B on a CPU, ours only, alternated in one sitting: an older commit's ddp-bench (built from
# ab-base/, see scripts/ab-onegpu.sh for how to make it) against this tree's, every style at world
# 2 on Gloo: DDP, FULLY_SHARD per unit, DEFAULT, on mlp-deep and gpt-tiny.
#   bash scripts/ab-cpu.sh PAIRS     (OUT=dir for the logs; default /tmp/ab-cpu)
# NEW=build/ddp-bench and BASE_BUILD=ab-base/build-cpu by default; on the device machine's CPUs,
# against its torch: NEW=build-gpu/ddp-bench BASE_BUILD=ab-base/build-gpu (built there with
# CMAKE_PREFIX_PATH at torch's).
set -uo pipefail
OUT="${OUT:-/tmp/ab-cpu}"; mkdir -p "$OUT"
BASE="${BASE:-ab-base}"
BASE_BUILD="${BASE_BUILD:-$BASE/build-cpu}"
NEW="${NEW:-build/ddp-bench}"
export OMP_NUM_THREADS=1
if [ ! -x "$BASE_BUILD/ddp-bench" ]; then
  cmake -S "$BASE" -B "$BASE_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDDP_BUILD_TESTS=OFF \
    >"$OUT/base-configure.log" 2>&1
  cmake --build "$BASE_BUILD" -j "$(nproc)" --target ddp-bench >"$OUT/base-build.log" 2>&1 ||
    { tail -20 "$OUT/base-build.log"; exit 1; }
fi
median() { grep -oE 'median_ms=[0-9.]+' "$1" | head -1 | cut -d= -f2; }
for model in "mlp-deep:64" "gpt-tiny:8"; do
  name=${model%%:*}; batch=${model#*:}
  for style in "ddp:--ddp" "fsdp:--fsdp --fsdp-wrap" "default:--style default --fsdp-wrap"; do
    kind=${style%%:*}; flags=${style#*:}
    for pair in $(seq 1 "${1:-3}"); do
      for which in base new; do
        bench=$NEW; [ $which = base ] && bench=$BASE_BUILD/ddp-bench
        log="$OUT/$name-$kind-$which-$pair.log"
        timeout 300 $bench --model "$name" --batch-size "$batch" --nproc 2 --repeat 10 --warmup 3 \
          --threads 1 $flags >"$log" 2>&1
        printf '%-9s %-8s pair %s %-4s rc=%s %9s ms\n' "$name" "$kind" "$pair" "$which" "$?" \
          "$(median "$log")" | tee -a "$OUT/ab.txt"
      done
    done
  done
done
