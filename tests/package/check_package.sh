#!/usr/bin/env bash
# Installs the built tree into a temporary prefix, then configures, builds and runs a downstream
# project that does find_package(ddp). Usage: check_package.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
src="$2"
# shellcheck source=temp_install.sh
source "$(dirname "$0")/temp_install.sh" "$1"
cmake -S "$src/tests/package/consumer" -B "$tmp/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/build" >/dev/null
"$tmp/build/consumer"
