#!/usr/bin/env bash
# Every C++ block of README.md and docs/ compiled as a user would, against an install of the built
# tree (find_package(ddp)), with -Wall -Wextra -Werror (issue 46: snippets that did not compile,
# names the install lacks). doc_snippets.py gathers them into one translation unit.
#   check_doc_snippets.sh BUILD_DIR SOURCE_DIR WORK_DIR
# WORK_DIR is emptied first; a fixed path, so that ccache hits on the next run. Build type None
# (no -O), as check_examples.sh says why.
set -euo pipefail
build=$1 src=$2 work=$3
[[ -n "$work" && "$work" != / ]] || { echo "check_doc_snippets.sh: bad WORK_DIR '$work'"; exit 2; }
rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" >"$work/install.log" || { cat "$work/install.log"; exit 1; }
python3 "$src/tests/package/doc_snippets.py" "$src" "$work/project"
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
{ cmake -S "$work/project" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=None \
    -DCMAKE_CXX_FLAGS="-Wall -Wextra -Werror" -DCMAKE_PREFIX_PATH="$prefix" "${launcher[@]}" &&
    cmake --build "$work/build"; } >"$work/build.log" 2>&1 ||
  { echo "the docs' C++ blocks do not compile (each block is namespace <file>_line<N>):";
    grep -E "error|snippets.cpp" "$work/build.log" | head -40; exit 1; }
echo "doc snippets compiled"

# The guide walked (docs/guide.md): each style's program, run 20 steps straight and 10 + 10 with a
# resume in between, must end on the same loss, bit for bit, below its loss at step 10, and
# within 1e-5 of DDP's at world 2 (the same global batch).
loss_at() {  # LOG STEP: rank 0's loss at the end of a run that ended at STEP
  sed -n "s/^\[rank 0\] rank 0: .*: step $2 loss \([-+0-9.eE]*\) weights .*$/\1/p" "$1" | tail -1
}
weights_of() {  # LOG: rank 0's sum of |w| over the exported whole weights
  sed -n "s/^\[rank 0\] rank 0: .* weights \([-+0-9.eE]*\)$/\1/p" "$1" | tail -1
}
# close A B: |A - B| <= 1e-5 |B|
close() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" &&
  d <= 1e-5 * (b < 0 ? -b : b)) }'; }
walk() {  # NPROC STYLE TP
  local n=$1 style=$2 tp=$3 tag="$2-tp$3" log
  for run in straight:20 first:10 resumed:20; do
    log="$work/guide-$tag-${run%%:*}.log"
    local dir="$work/ckpt-$tag-${run%%:*}"
    [[ ${run%%:*} == resumed ]] && dir="$work/ckpt-$tag-first"
    timeout 120 "$prefix/bin/ddp-run" --nproc-per-node "$n" -- "$work/build/guide" "$style" "$tp" \
      "$dir" "${run##*:}" >"$log" 2>&1 || { echo "guide $tag ${run%%:*} failed:"; cat "$log"; exit 1; }
  done
  local straight first resumed
  straight=$(loss_at "$work/guide-$tag-straight.log" 20)
  first=$(loss_at "$work/guide-$tag-first.log" 10)
  resumed=$(loss_at "$work/guide-$tag-resumed.log" 20)
  grep -q "resumed from $work/ckpt-$tag-first/step-10 at step 10" "$work/guide-$tag-resumed.log" ||
    { echo "guide $tag did not resume at step 10:"; cat "$work/guide-$tag-resumed.log"; exit 1; }
  [[ -n "$straight" && "$straight" == "$resumed" ]] ||
    { echo "guide $tag: resumed loss '$resumed' != straight '$straight'"; exit 1; }
  awk -v a="$straight" -v b="$first" 'BEGIN { exit !(a < b) }' ||
    { echo "guide $tag: loss $straight at step 20 is not below $first at step 10"; exit 1; }
  # Every style and mesh trains on the same global batch: DDP at world 2 is the reference, for
  # the loss and the exported whole weights.
  local weights
  weights=$(weights_of "$work/guide-$tag-straight.log")
  reference=${reference:-$straight} reference_weights=${reference_weights:-$weights}
  close "$straight" "$reference" ||
    { echo "guide $tag: loss $straight differs from DDP's $reference by more than 1e-5"; exit 1; }
  close "$weights" "$reference_weights" ||
    { echo "guide $tag: exported weights $weights differ from DDP's $reference_weights"; exit 1; }
  [[ -s "$work/ckpt-$tag-straight/weights.safetensors" ]] ||
    { echo "guide $tag: no exported weights"; exit 1; }
  echo "guide $tag: loss $first at step 10, $straight at step 20, resumed the same; weights $weights"
}
reference= reference_weights=
walk 2 replicate 1
walk 2 fully_shard 1
walk 4 replicate 2
walk 4 fully_shard 2
echo "the guide walked"
