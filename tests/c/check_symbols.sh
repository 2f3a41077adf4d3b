#!/usr/bin/env bash
# The C ABI's exported functions (every defined text symbol of libddp named ddp_*: only extern "C"
# names are unmangled) against the committed list tests/c/abi_symbols.txt, so that an accidental
# change of the ABI shows. Usage: check_symbols.sh LIBDDP_ARCHIVE LIST
set -euo pipefail
got="$(nm -g --defined-only "$1" | awk '$2 == "T" && $3 ~ /^ddp_/ {print $3}' | sort -u)"
if ! diff <(echo "$got") <(sort -u "$2"); then
  echo "the C ABI's symbols differ from $2 (< built, > listed): change the list, and"
  echo "DDP_ABI_VERSION when a function's signature or meaning changed"
  exit 1
fi
echo "c abi symbols: $(echo "$got" | wc -l) as listed"
