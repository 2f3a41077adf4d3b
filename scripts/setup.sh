#!/usr/bin/env bash
# Installs what libddp needs on Debian 12 (apt) and builds it into build/. Idempotent: packages
# already present are not reinstalled, and the build is incremental.
#   setup.sh [--tests] [CMAKE_ARGS...]    --tests: also the packages only the tests use (test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
with_tests=0
if [[ "${1:-}" == "--tests" ]]; then
  with_tests=1
  shift
fi

PACKAGES=(
  build-essential cmake ninja-build ccache
  libtorch-dev        # libtorch 1.13 (CPU): tensors, autograd, nn, optim, c10d
  libgloo-dev         # Gloo headers, needed by c10d's ProcessGroupGloo.hpp
  libopenblas0-pthread  # without it Debian's libtorch uses the reference BLAS, ~20x slower
  libgtest-dev libcli11-dev nlohmann-json3-dev
  libssl-dev          # OpenSSL's libcrypto: SHA-256 of checkpoint files (docs/dependencies.md)
  iproute2            # `ip netns`: the two-node test's network namespaces (skipped without root)
  python3-torch       # PyTorch 1.13 itself: the oracle of every comparison test (torch.save files,
                      # torchrun, bench/compare --parity), so they run on every fresh machine
)
# Only the tests use these; the main job (scripts/train.sh) does not install them.
TEST_PACKAGES=(
  openmpi-bin         # mpirun: the test that launches ddp-train through OpenMPI for real
  pkgconf             # pkg-config: the test that builds a C program from an install with ddp.pc
)
if ((with_tests)); then PACKAGES+=("${TEST_PACKAGES[@]}"); fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

BUILD_DIR="${BUILD_DIR:-build}"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
# Two jobs: a libtorch translation unit needs ~1.5 GB of memory and the machine has 2 cores.
cmake --build "$BUILD_DIR" -j "${DDP_BUILD_JOBS:-2}"
