#!/usr/bin/env bash
# Runs the given command only where Debian's python3-torch is installed (the PyTorch side of the
# benchmarks); otherwise reports a skip to ctest (exit 77).
if ! /usr/bin/python3 -c 'import torch' >/dev/null 2>&1; then
  echo "skipped: /usr/bin/python3 has no torch (apt-get install python3-torch)"
  exit 77
fi
if [ -n "${TMPDIR:-}" ]; then mkdir -p "$TMPDIR"; fi
exec "$@"
