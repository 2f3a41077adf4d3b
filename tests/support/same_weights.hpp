#pragma once
// The check behind every "ends where the other run ends" test of the tools: two safetensors files
// of whole weights hold the same names and shapes, and every tensor agrees within the fp32
// tolerance of the tests (rel. err < 1e-5).

#include <gtest/gtest.h>

#include <string>

#include "ddp/io/safetensors.hpp"

namespace ddp::testing {

// `context` prefixes each failure (a style, a flag set): which of several runs differed.
inline void expect_same_weights(const std::string& a_path, const std::string& b_path,
                                const std::string& context = "") {
  const auto a = ddp::io::load_safetensors(a_path);
  const auto b = ddp::io::load_safetensors(b_path);
  ASSERT_EQ(a.size(), b.size()) << context << a_path << " vs " << b_path;
  for (const auto& [name, t] : a) {
    ASSERT_EQ(b.count(name), 1u) << context << name << " is missing from " << b_path;
    const auto& u = b.at(name);
    ASSERT_EQ(t.sizes(), u.sizes()) << context << name;
    const double err = (t - u).norm().item<double>() / t.norm().item<double>();
    EXPECT_LT(err, 1e-5) << context << name;
  }
}

}  // namespace ddp::testing
