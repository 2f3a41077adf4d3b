#!/usr/bin/env bash
# The flight recorder's and the collective check's cost on every zoo model (issue 49): ddp-bench
# --ddp at world 2 with the recorder on (the default, 4096 entries a group), off
# (DDP_FLIGHT_RECORDER_SIZE=0: collectives only numbered) and on with --check-collectives,
# alternated in one sitting, PAIRS rounds. Prints each run's median step and, per model, the
# median of the rounds' ratios on/off and check/off.
#   bash scripts/recorder-cost.sh PAIRS cpu    # Gloo, this machine's 2 cores, 1 thread a rank
#   bash scripts/recorder-cost.sh PAIRS cuda   # NCCL, one GPU a rank, bf16 autocast
# OUT=dir for the logs (default /tmp/recorder-cost); BENCH=path to ddp-bench; MODELS="a:b ..."
# (model:batch) to narrow the list.
set -uo pipefail
PAIRS="${1:-3}"; DEVICE="${2:-cpu}"
OUT="${OUT:-/tmp/recorder-cost}"; mkdir -p "$OUT"
export OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
if [ "$DEVICE" = cuda ]; then
  BENCH="${BENCH:-build-gpu/ddp-bench}"
  MODELS="${MODELS:-net:32 toy:32 toy8k:32 mlp:64 mlp-deep:64 resnet-small:32 gpt-tiny:8 gpt:32 gpt-char:32 gpt2-small:8 gpt2-medium:8}"
  EXTRA="--device cuda --autocast-bf16"
else
  BENCH="${BENCH:-build/ddp-bench}"
  # gpt2-small and gpt2-medium take minutes a step on 2 cores: measured on the GPU only.
  MODELS="${MODELS:-net:32 toy:32 toy8k:32 mlp:64 mlp-deep:64 resnet-small:8 gpt-tiny:8 gpt:8 gpt-char:8}"
  EXTRA="--threads 1"
fi
median() { grep -oE 'median_ms=[0-9.]+' "$1" | head -1 | cut -d= -f2; }
: >"$OUT/runs.txt"
for spec in $MODELS; do
  model=${spec%%:*}; batch=${spec#*:}
  for pair in $(seq 1 "$PAIRS"); do
    for which in off on check; do
      log="$OUT/$model-$which-$pair.log"
      size=4096; flags=""
      [ $which = off ] && size=0
      [ $which = check ] && flags="--check-collectives"
      DDP_FLIGHT_RECORDER_SIZE=$size timeout 600 "$BENCH" --model "$model" --batch-size "$batch" \
        --nproc 2 --ddp --repeat 20 --warmup 5 $EXTRA $flags >"$log" 2>&1
      printf '%-13s pair %s %-5s rc=%s %10s ms\n' "$model" "$pair" "$which" "$?" "$(median "$log")" |
        tee -a "$OUT/runs.txt"
    done
  done
done
# Per model: the median over rounds of on/off and check/off.
python3 - "$OUT/runs.txt" <<'PY' | tee "$OUT/ratios.txt"
import collections, statistics, sys
runs = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) < 6 or f[-2] == 'ms':
        continue
    try:
        runs[(f[0], f[2])][f[3]] = float(f[-2])
    except ValueError:
        pass
models = sorted({m for m, _ in runs}, key=lambda m: list(dict.fromkeys(k[0] for k in runs)).index(m))
print(f"{'model':13} {'off ms':>9} {'on ms':>9} {'on/off':>7} {'check ms':>9} {'check/off':>9}")
for m in models:
    rounds = [r for (mm, _), r in runs.items() if mm == m and {'off', 'on', 'check'} <= r.keys()]
    if not rounds:
        continue
    med = lambda k: statistics.median(r[k] for r in rounds)
    ratio = lambda k: statistics.median(r[k] / r['off'] for r in rounds)
    print(f"{m:13} {med('off'):9.2f} {med('on'):9.2f} {ratio('on'):7.3f} {med('check'):9.2f} {ratio('check'):9.3f}")
PY
