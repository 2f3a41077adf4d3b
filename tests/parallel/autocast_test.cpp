// AutocastGuard on the CPU (bf16 autocast is what libtorch 1.13 has there): products run in bf16
// inside the scope, fp32 again after it, and the state is restored when scopes nest.

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ddp/parallel/autocast.hpp"

namespace {

TEST(AutocastGuard, ProductsRunInBf16InsideTheScopeOnly) {
  const auto a = torch::randn({8, 8});
  const auto b = torch::randn({8, 8});
  {
    ddp::parallel::AutocastGuard guard(c10::kCPU, torch::kBFloat16);
    EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kBFloat16);
    {
      ddp::parallel::AutocastGuard inner(c10::kCPU, torch::kBFloat16);
      EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kBFloat16);
    }
    // The inner guard restored "enabled", not "disabled".
    EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kBFloat16);
  }
  const auto out = torch::mm(a, b);
  EXPECT_EQ(out.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(out, torch::mm(a, b)));
}

TEST(AutocastGuard, RefusesADtypeThatIsNotLowerPrecision) {
  try {
    ddp::parallel::AutocastGuard guard(c10::kCPU, torch::kDouble);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("autocast dtype must be bfloat16 or float16, got Double"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
