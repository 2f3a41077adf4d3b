#pragma once
// Names for parameterized test instances. gtest numbers them (/0, /1, ...) unless the last
// INSTANTIATE_TEST_SUITE_P argument names them, and ctest lists exactly what gtest names, so a
// name that says what varies is what a reader of a failure (or of `ctest -N`) sees.

#include <gtest/gtest.h>

#include <string>

namespace ddp::testing {

// A world-size parameter: WorldSizes/Unused.FindsUnusedParameters/world2.
inline std::string world_name(const ::testing::TestParamInfo<int>& info) {
  return "world" + std::to_string(info.param);
}

}  // namespace ddp::testing
