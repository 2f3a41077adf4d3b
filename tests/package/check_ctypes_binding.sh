#!/usr/bin/env bash
# The C ABI from a second language, as a binding loads it: installs the built tree into a temporary
# prefix, finds the shared library where pkg-config says it is, and runs tests/c/ctypes_binding.py
# (Python's ctypes over python3-torch's tensors; nothing but a dlopen of libddp_c) at worlds 1, 2
# and 3 through the installed ddp-run. Each rank checks the oracle, the bad handles and that every
# function of tests/c/abi_symbols.txt was called.
# Usage: check_ctypes_binding.sh BUILD_DIR SOURCE_DIR PYTHON
set -euo pipefail
src="$2" python="$3"
# shellcheck source=temp_install.sh
source "$(dirname "$0")/temp_install.sh" "$1"
export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig"
libs="$(pkg-config --libs ddp)"
[[ " $libs " == *" -lddp_c "* ]] || { echo "pkg-config --libs ddp does not name -lddp_c: $libs"; exit 1; }
lib="$(pkg-config --variable=libdir ddp)/libddp_c.so.1"
soname="$(objdump -p "$lib" | awk '$1 == "SONAME" {print $2}')"
[[ "$soname" == libddp_c.so.1 ]] || { echo "SONAME '$soname', expected libddp_c.so.1"; exit 1; }
for world in 1 2 3; do
  "$tmp/prefix/bin/ddp-run" --nproc-per-node "$world" -- "$python" \
    "$src/tests/c/ctypes_binding.py" "$lib" "$src/tests/c/abi_symbols.txt" "$tmp/ckpt-$world"
done
echo "ctypes binding passed at worlds 1-3"
