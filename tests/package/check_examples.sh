#!/usr/bin/env bash
# The examples/ projects as a user builds them: installs the built tree into a prefix, configures
# and builds each example against it (find_package(ddp)), runs each at world 2 through the
# installed ddp-run and checks what they print.
#   check_examples.sh BUILD_DIR SOURCE_DIR WORK_DIR
# WORK_DIR is emptied first. It is a fixed path (in the build tree) rather than a mktemp one so
# that ccache, given the same include paths, hits on the next run: the example builds then take
# seconds instead of a libtorch translation unit's ~25 s each.
set -euo pipefail
build=$1 src=$2 work=$3
examples=(minimal_ddp fsdp_checkpoint gpt_recipe vision_cnn)
[[ -n "$work" && "$work" != / ]] || { echo "check_examples.sh: bad WORK_DIR '$work'"; exit 2; }
rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix
t0=$SECONDS
cmake --install "$build" --prefix "$prefix" >"$work/install.log" ||
  { cat "$work/install.log"; exit 1; }

launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
for ex in "${examples[@]}"; do
  # Warnings are errors here: a tensor passed to printf's %f (issue 46) is a -Wformat warning that
  # printed "grad norm 0.000" on every line. The libraries' headers come in as system headers.
  # Build type None (no -O): an example's own code is a loop around libtorch's and libddp's
  # optimised calls, and -O3 cost a fifth more of each ~20 s compile (libtorch's headers).
  { cmake -S "$src/examples/$ex" -B "$work/$ex" -G Ninja -DCMAKE_BUILD_TYPE=None \
      -DCMAKE_CXX_FLAGS="-Wall -Wextra -Werror" \
      -DCMAKE_PREFIX_PATH="$prefix" "${launcher[@]}" && cmake --build "$work/$ex"; } \
    >"$work/$ex.build.log" 2>&1 ||
    { echo "building $ex failed:"; cat "$work/$ex.build.log"; exit 1; }
done
echo "installed and built ${examples[*]} in $((SECONDS - t0)) s"

# run2 LOG PROGRAM ARGS...: PROGRAM at world 2 through the installed ddp-run, bounded.
run2() {
  local log=$1
  shift
  timeout 120 "$prefix/bin/ddp-run" --nproc-per-node 2 -- "$@" >"$log" 2>&1 ||
    { echo "failed: ddp-run --nproc-per-node 2 -- $*"; cat "$log"; exit 1; }
}
# field LOG RANK NAME: the number after "NAME " in rank RANK's "rank R: ..." line of LOG.
field() {
  sed -n "s/^\[rank $2\] rank $2: .*$3 \([-+0-9.eE]*\).*/\1/p" "$1" | tail -1
}
# close A B WHAT: |A - B| <= 1e-5 * max(|A|, |B|), else fails naming WHAT.
close() {
  awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; m = (a < 0 ? -a : a);
    n = (b < 0 ? -b : b); if (n > m) m = n; exit !(a != "" && b != "" && d <= 1e-5 * m) }' ||
    { echo "$3: $1 and $2 differ by more than 1e-5 relative"; exit 1; }
}

check_minimal_ddp() {
  run2 "$work/minimal.log" "$work/minimal_ddp/minimal_ddp"
  local initial final0 final1
  initial=$(field "$work/minimal.log" 0 "initial loss")
  final0=$(field "$work/minimal.log" 0 "final loss")
  final1=$(field "$work/minimal.log" 1 "final loss")
  grep -q "rank 1: world size 2," "$work/minimal.log" ||
    { echo "minimal_ddp did not run at world size 2:"; cat "$work/minimal.log"; exit 1; }
  # DDP keeps the replicas equal: both ranks' models have the same loss on the whole data set.
  close "$final0" "$final1" "minimal_ddp final loss, rank 0 vs rank 1"
  awk -v a="$initial" -v b="$final0" 'BEGIN { exit !(b < 0.2 * a) }' ||
    { echo "minimal_ddp: the loss did not fall enough: $initial -> $final0"; exit 1; }
  echo "minimal_ddp: both ranks end with loss $final0 (from $initial)"
}

check_fsdp_checkpoint() {
  local exe=$work/fsdp_checkpoint/fsdp_checkpoint
  run2 "$work/straight.log" "$exe" --dir "$work/ckpt-straight" --steps 20
  run2 "$work/first.log" "$exe" --dir "$work/ckpt-resumed" --steps 10
  run2 "$work/resumed.log" "$exe" --dir "$work/ckpt-resumed" --steps 20 --resume
  grep -q "resumed from $work/ckpt-resumed/step-10 at step 10" "$work/resumed.log" ||
    { echo "the second run did not resume at step 10:"; cat "$work/resumed.log"; exit 1; }
  for r in 0 1; do
    for what in "final loss" "parameter checksum"; do
      close "$(field "$work/straight.log" $r "$what")" "$(field "$work/resumed.log" $r "$what")" \
        "fsdp_checkpoint rank $r $what, uninterrupted vs resumed"
    done
  done
  echo "fsdp_checkpoint: resumed at step 10, ends where the uninterrupted run ends:" \
    "loss $(field "$work/resumed.log" 0 "final loss")," \
    "checksum $(field "$work/resumed.log" 0 "parameter checksum")"
}

# The GPT recipe (AdamW groups, warmup-cosine, clipping, accumulation) under FULLY_SHARD per
# block: both ranks report the same mean loss, and 60 steps take it well below the first step's.
check_gpt_recipe() {
  run2 "$work/recipe.log" "$work/gpt_recipe/gpt_recipe" --steps 60 --style fully_shard
  local first final0 final1
  first=$(field "$work/recipe.log" 0 "first loss")
  final0=$(field "$work/recipe.log" 0 "final loss")
  final1=$(field "$work/recipe.log" 1 "final loss")
  close "$final0" "$final1" "gpt_recipe final loss, rank 0 vs rank 1"
  awk -v a="$first" -v b="$final0" 'BEGIN { exit !(b < 0.75 * a) }' ||
    { echo "gpt_recipe: the loss did not fall enough: $first -> $final0"; cat "$work/recipe.log"; exit 1; }
  # Every printed gradient norm is a real one: positive and finite (it printed 0.000 once).
  local norms
  norms=$(sed -n 's/^\[rank 0\] step .* grad norm \([-+0-9.eEinfa]*\).*/\1/p' "$work/recipe.log")
  [[ -n "$norms" ]] || { echo "gpt_recipe printed no grad norm:"; cat "$work/recipe.log"; exit 1; }
  awk '{ if (!($1 > 0 && $1 < 1e30)) bad = 1 } END { exit bad }' <<<"$norms" ||
    { echo "gpt_recipe: a grad norm that is not a norm:"; echo "$norms"; exit 1; }
  echo "gpt_recipe: fully_shard at world 2, loss $first -> $final0 in 60 steps"
}

# A CNN with SyncBatchNorm under DDP and FULLY_SHARD, evaluated inside model.evaluation() every 20
# steps: both ranks report the same validation loss (one reduced metric), over all 400 samples,
# and the trained model classifies far better than chance (1 in 10).
check_vision_cnn() {
  local style log loss0 loss1 acc
  for style in replicate fully_shard; do
    log=$work/vision-$style.log
    run2 "$log" "$work/vision_cnn/vision_cnn" --style "$style" --steps 60 --eval-every 20
    loss0=$(field "$log" 0 "final: step 60 validation loss")
    loss1=$(field "$log" 1 "final: step 60 validation loss")
    close "$loss0" "$loss1" "vision_cnn $style validation loss, rank 0 vs rank 1"
    acc=$(field "$log" 0 "accuracy")
    grep -q "rank 0: final: step 60 .*(400 samples)" "$log" ||
      { echo "vision_cnn $style did not evaluate all 400 samples:"; cat "$log"; exit 1; }
    awk -v a="$acc" 'BEGIN { exit !(a > 0.5) }' ||
      { echo "vision_cnn $style: accuracy $acc"; cat "$log"; exit 1; }
    echo "vision_cnn: $style at world 2, validation loss $loss0, accuracy $acc"
  done
}

for ex in "${examples[@]}"; do "check_$ex"; done
echo "examples passed in $((SECONDS - t0)) s"
