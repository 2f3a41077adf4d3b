#!/usr/bin/env bash
# The main job: set up, build, and train the byte-level GPT on the GNU GPL (on every Debian system)
# with 2 local CPU workers (Gloo on loopback): the bucket table, progress with tokens per second,
# the validation loss every 25 steps, a text sample at the end and the loss curve in
# build/loss.svg (docs/text.md). Arguments, when given, replace the job's flags:
# `scripts/train.sh --data my.txt --steps 1000 --plot my.svg`, `scripts/train.sh --model net --verbose`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh -DDDP_BUILD_TESTS=OFF
if (($#)); then exec build/ddp-train --nproc 2 "$@"; fi
exec build/ddp-train --nproc 2 --data --steps 600 --verbose --plot build/loss.svg
