#!/usr/bin/env bash
# Installs the built tree into a temporary prefix, then configures, builds and runs a downstream
# project that does find_package(ddp): a C++ target on ddp::ddp and a C target on ddp::ddp_c.
# Usage: check_package.sh BUILD_DIR SOURCE_DIR
# Build type None (no -O), as check_examples.sh says why.
set -euo pipefail
src="$2"
# shellcheck source=temp_install.sh
source "$(dirname "$0")/temp_install.sh" "$1"
cmake -S "$src/tests/package/consumer" -B "$tmp/build" -G Ninja -DCMAKE_BUILD_TYPE=None \
  -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/build" >/dev/null
out="$("$tmp/build/consumer")"
echo "$out"
[[ "$out" == *"consumer: 1 bucket(s)"* ]] || { echo "the C++ consumer did not find 1 bucket"; exit 1; }
"$tmp/build/c_consumer"
echo "package: the C++ and the C consumer passed"
