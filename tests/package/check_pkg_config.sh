#!/usr/bin/env bash
# Installs the built tree into a temporary prefix, then compiles the C ABI's C program
# (tests/c/every_function.c) with the C compiler and nothing but `pkg-config --cflags --libs ddp`,
# as a C project or another language's build tool would, and runs it.
# Usage: check_pkg_config.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
src="$2"
# shellcheck source=temp_install.sh
source "$(dirname "$0")/temp_install.sh" "$1"
export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig"
echo "pkg-config ddp $(pkg-config --modversion ddp): $(pkg-config --cflags --libs ddp)"
# shellcheck disable=SC2046
cc -std=c11 -Wall -Wextra -pedantic "$src/tests/c/every_function.c" -o "$tmp/c_consumer" \
  $(pkg-config --cflags --libs ddp)
"$tmp/c_consumer"
