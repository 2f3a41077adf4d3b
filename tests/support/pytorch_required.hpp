#pragma once
// Tests that compare with PyTorch itself (Debian's python3-torch, torchrun) need it installed.
// The README's test command installs it, so on a machine set up that way they always run. Where
// it is missing, a developer's run skips them with the reason; under CI=true a missing PyTorch is
// a failure, because a comparison that silently did not run is no evidence at all.

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include <unistd.h>

#include "support/run_command.hpp"

namespace ddp::testing {

inline bool in_ci() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && (std::strcmp(ci, "true") == 0 || std::strcmp(ci, "1") == 0);
}

// /usr/bin/python3 can import torch (checked once per process).
inline bool python_has_torch() {
  static const bool has = ::access("/usr/bin/python3", X_OK) == 0 &&
                          run_command("/usr/bin/python3 -c 'import torch'").second == 0;
  return has;
}

}  // namespace ddp::testing

// In a TEST body: skip (developer machine) or fail (CI=true) when `available` is false.
#define DDP_REQUIRE_PYTORCH(available, reason)                                         \
  do {                                                                                 \
    if (!(available)) {                                                                \
      if (::ddp::testing::in_ci()) {                                                   \
        FAIL() << (reason) << " (CI=true: a skipped PyTorch comparison is a failure; " \
               << "scripts/setup.sh installs python3-torch)";                          \
      }                                                                                \
      GTEST_SKIP() << (reason);                                                        \
    }                                                                                  \
  } while (0)
