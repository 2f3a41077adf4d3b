#!/usr/bin/env bash
# The shared C ABI library's exported symbols (every defined symbol of its dynamic table) against
# the committed list tests/c/abi_symbols.txt: the ddp_* functions and nothing else (no C++ symbol
# of libddp or of what it links statically), so that an accidental change of the ABI shows.
# Usage: check_symbols.sh LIBDDP_C_SO LIST
set -euo pipefail
got="$(nm -D --defined-only "$1" | awk '{print $NF}' | sed 's/@.*//' | sort -u)"
if ! diff <(echo "$got") <(sort -u "$2"); then
  echo "the C ABI's symbols differ from $2 (< built, > listed): change the list, and"
  echo "DDP_ABI_VERSION when a function's signature or meaning changed"
  exit 1
fi
echo "c abi symbols: $(echo "$got" | wc -l) as listed"
