#!/usr/bin/env bash
# The main job: set up, build, and train the seed Net on 2 local CPU workers (Gloo on loopback).
# Extra arguments go to ddp-train, e.g. `scripts/train.sh --model gpt --steps 100`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh -DDDP_BUILD_TESTS=OFF
exec build/ddp-train --nproc 2 --model net --verbose "$@"
