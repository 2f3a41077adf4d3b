#!/usr/bin/env bash
# Runs the given command only where Debian's python3-torch is installed (the PyTorch side of the
# benchmarks). Without it: a skip for ctest (exit 77) on a developer's machine, a failure under
# CI=true, where a comparison with PyTorch that did not run counts as failed.
if ! /usr/bin/python3 -c 'import torch' >/dev/null 2>&1; then
  if [[ "${CI:-}" == true || "${CI:-}" == 1 ]]; then
    echo "FAILED: /usr/bin/python3 has no torch, and under CI=true a skipped PyTorch comparison" \
      "is a failure (scripts/setup.sh installs python3-torch)"
    exit 1
  fi
  echo "skipped: /usr/bin/python3 has no torch (apt-get install python3-torch)"
  exit 77
fi
if [ -n "${TMPDIR:-}" ]; then mkdir -p "$TMPDIR"; fi
exec "$@"
