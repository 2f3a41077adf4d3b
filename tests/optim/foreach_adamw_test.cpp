// optim::ForeachAdamW: the multi-tensor AdamW equals torch::optim::AdamW bit for bit on the CPU
// (same operations, a foreach op looping the same kernels) over steps with the recipe's two
// weight-decay groups, a parameter that misses a step's gradient and a learning-rate change;
// AMSGrad takes AdamW's own step; checkpoints see it as AdamW. On a GPU (scripts/gpu-check.sh
// tests) the multi-tensor kernels match within 1e-6.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ddp/io/checkpoint_state.hpp"
#include "ddp/optim/foreach_adamw.hpp"
#include "ddp/optim/param_groups.hpp"

namespace ddp::testing {
namespace {

// Two copies of the same parameters, one stepped by AdamW, one by ForeachAdamW, on the same
// gradients; returns the largest relative difference of parameters and moments after `steps`.
double max_difference(const torch::Device& device, bool amsgrad, int steps) {
  torch::manual_seed(0);
  std::vector<torch::Tensor> a, b;
  for (const auto& shape : std::vector<std::vector<int64_t>>{{7, 5}, {5}, {3, 4, 2}, {11}}) {
    const auto t = torch::randn(shape).to(device);
    a.push_back(t.clone().requires_grad_());
    b.push_back(t.clone().requires_grad_());
  }
  const auto options =
      torch::optim::AdamWOptions(1e-2).betas({0.9, 0.95}).weight_decay(0.1).amsgrad(amsgrad);
  torch::optim::AdamW plain(optim::weight_decay_groups(a, options), options);
  optim::ForeachAdamW multi(optim::weight_decay_groups(b, options), options);
  for (int step = 0; step < steps; ++step) {
    if (step == 3) {
      optim::set_lr(plain, 3e-3);
      optim::set_lr(multi, 3e-3);
    }
    for (size_t i = 0; i < a.size(); ++i) {
      // Parameter 1 has no gradient at step 2: its step count falls behind the others'.
      if (i == 1 && step == 2) {
        a[i].mutable_grad() = torch::Tensor();
        b[i].mutable_grad() = torch::Tensor();
        continue;
      }
      const auto g = torch::randn(a[i].sizes()).to(device);
      a[i].mutable_grad() = g.clone();
      b[i].mutable_grad() = g.clone();
    }
    plain.step();
    multi.step();
  }
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, ((a[i] - b[i]).norm() / a[i].norm()).item<double>());
  }
  return worst;
}

TEST(ForeachAdamW, EqualsAdamWBitForBitOnTheCpu) {
  EXPECT_EQ(max_difference(torch::kCPU, /*amsgrad=*/false, 6), 0.0);
}

TEST(ForeachAdamW, AmsGradTakesAdamWsOwnStep) {
  EXPECT_EQ(max_difference(torch::kCPU, /*amsgrad=*/true, 6), 0.0);
}

TEST(ForeachAdamW, CheckpointsSeeAdamW) {
  auto p = torch::randn({3, 3}).requires_grad_();
  optim::ForeachAdamW opt(std::vector<torch::Tensor>{p});
  EXPECT_EQ(io::optimizer_kind(opt), "adamw");
  p.mutable_grad() = torch::ones({3, 3});
  opt.step();
  ASSERT_EQ(opt.state().size(), 1u);
  const auto& s = static_cast<const torch::optim::AdamWParamState&>(*opt.state().begin()->second);
  EXPECT_EQ(s.step(), 1);
  EXPECT_TRUE(torch::allclose(s.exp_avg(), torch::full({3, 3}, 0.1)));
}

TEST(ForeachAdamW, MatchesAdamWOnTheGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  EXPECT_LT(max_difference(torch::Device(torch::kCUDA, 0), /*amsgrad=*/false, 6), 1e-6);
}

}  // namespace
}  // namespace ddp::testing
