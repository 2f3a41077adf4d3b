// The house's optimizers (optim/sgd.hpp, optim/adam.hpp) against torch::optim on the same
// parameters and gradients, over steps with a learning-rate change:
//   host scalars (the CPU default)   bit for bit torch::optim's parameters and state
//   device scalars (a captured step's path, forced here on the CPU)   within rel. err 1e-6
// and what only they do: parameter groups with their own rate and decay, a step skipped on the
// device (parameters, state and count untouched), the state in checkpoints under PyTorch's names
// (a round trip continues exactly), and the refusals by exact text. The fused CUDA kernels are
// checked on the GPU (tests/graphs/captured_step_test.cpp).

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>

#include "ddp/io/checkpoint_state.hpp"
#include "ddp/models/registry.hpp"
#include "ddp/optim/adam.hpp"
#include "ddp/optim/param_groups.hpp"
#include "ddp/optim/sgd.hpp"
#include "support/error_text.hpp"

namespace ddp::testing {
namespace {

constexpr int kSteps = 8;
constexpr int kLrChange = 4;  // steps before it use the first lr, from it on the second

using Make = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;

struct Case {
  std::string name;
  Make ours, theirs;
  double lr = 0;
};

void PrintTo(const Case& c, std::ostream* out) { *out << c.name; }

std::vector<torch::Tensor> make_params() {
  torch::manual_seed(0);
  return {torch::randn({5, 3}).requires_grad_(), torch::randn({3}).requires_grad_(),
          torch::randn({2, 2, 2}).requires_grad_()};
}

Case sgd(std::string name, torch::optim::SGDOptions o) {
  return {std::move(name), [o](auto p) { return std::make_unique<optim::Sgd>(std::move(p), o); },
          [o](auto p) { return std::make_unique<torch::optim::SGD>(std::move(p), o); }, o.lr()};
}

Case adam(std::string name, torch::optim::AdamOptions o) {
  return {std::move(name), [o](auto p) { return std::make_unique<optim::Adam>(std::move(p), o); },
          [o](auto p) { return std::make_unique<torch::optim::Adam>(std::move(p), o); }, o.lr()};
}

// AdamW in the recipe's two weight-decay groups (dim >= 2 decayed, the rest not).
Case adamw(std::string name, torch::optim::AdamWOptions o) {
  return {
      std::move(name),
      [o](auto p) { return std::make_unique<optim::AdamW>(optim::weight_decay_groups(p, o), o); },
      [o](auto p) {
        return std::make_unique<torch::optim::AdamW>(optim::weight_decay_groups(p, o), o);
      },
      o.lr()};
}

std::vector<Case> cases() {
  using torch::optim::SGDOptions;
  return {
      sgd("sgd_plain", SGDOptions(0.1)),
      sgd("sgd_momentum", SGDOptions(0.1).momentum(0.9)),
      sgd("sgd_dampening_decay", SGDOptions(0.05).momentum(0.9).dampening(0.1).weight_decay(1e-2)),
      sgd("sgd_nesterov", SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(1e-3)),
      adam("adam", torch::optim::AdamOptions(1e-2)),
      adam("adam_decay", torch::optim::AdamOptions(1e-2).weight_decay(1e-2)),
      adam("adam_amsgrad", torch::optim::AdamOptions(1e-2).betas({0.8, 0.99}).amsgrad(true)),
      adamw("adamw_groups", torch::optim::AdamWOptions(1e-2).betas({0.9, 0.95}).weight_decay(0.1)),
  };
}

// Steps both optimizers kSteps times on the same gradients (which depend on the parameters, so
// updates feed back), the rate changed halfway through optim::set_lr; returns the largest
// relative difference of the parameters.
double run_both(const Case& c, bool device_scalars, std::vector<torch::Tensor>* out = nullptr) {
  auto ours_params = make_params();
  auto theirs_params = make_params();
  auto ours = c.ours(ours_params);
  auto theirs = c.theirs(theirs_params);
  if (device_scalars) dynamic_cast<optim::DeviceStep&>(*ours).use_host_scalars(false);
  torch::manual_seed(1);
  for (int s = 0; s < kSteps; ++s) {
    if (s == kLrChange) {
      optim::set_lr(*ours, c.lr / 3);
      optim::set_lr(*theirs, c.lr / 3);
    }
    for (size_t i = 0; i < ours_params.size(); ++i) {
      const auto noise = torch::randn(ours_params[i].sizes());
      for (auto* p : {&ours_params[i], &theirs_params[i]}) {
        (p->pow(2).sum() * 0.5 + (*p * noise).sum()).backward();
      }
    }
    ours->step();
    theirs->step();
    optim::zero_grad(*ours, /*set_to_none=*/false);
    optim::zero_grad(*theirs, /*set_to_none=*/false);
  }
  double worst = 0;
  for (size_t i = 0; i < ours_params.size(); ++i) {
    worst = std::max(
        worst,
        ((ours_params[i] - theirs_params[i]).norm() / theirs_params[i].norm()).item<double>());
    // Moved from the start: the comparison is not between two untouched tensors.
    EXPECT_GT((theirs_params[i] - make_params()[i]).abs().max().item<double>(), 1e-3);
  }
  const auto& device = dynamic_cast<optim::DeviceStep&>(*ours);
  EXPECT_EQ(device.steps_taken(), kSteps);
  EXPECT_EQ(device.lr(0).item<double>(), c.lr / 3);
  if (out != nullptr) *out = ours_params;
  return worst;
}

class Optimizers : public ::testing::TestWithParam<Case> {};

TEST_P(Optimizers, EqualTorchOptimBitForBitWithHostScalars) {
  EXPECT_EQ(run_both(GetParam(), /*device_scalars=*/false), 0.0) << GetParam().name;
}

TEST_P(Optimizers, EqualTorchOptimWithDeviceScalars) {
  EXPECT_LT(run_both(GetParam(), /*device_scalars=*/true), 1e-6) << GetParam().name;
}

INSTANTIATE_TEST_SUITE_P(Kinds, Optimizers, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// Groups keep their own rate and decay: a group with weight decay 0 and rate 0 does not move,
// the other moves as torch's AdamW of that group alone.
TEST(OptimizerGroups, KeepTheirOwnRateAndDecay) {
  auto params = make_params();
  auto alone = make_params();
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{params[0]},
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(1e-2).weight_decay(0.3)));
  groups.emplace_back(std::vector<torch::Tensor>{params[1], params[2]},
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(0.0).weight_decay(0.0)));
  optim::AdamW ours(std::move(groups), torch::optim::AdamWOptions(1e-2));
  torch::optim::AdamW theirs(std::vector<torch::Tensor>{alone[0]},
                             torch::optim::AdamWOptions(1e-2).weight_decay(0.3));
  for (int s = 0; s < 3; ++s) {
    for (auto* p : {&params[0], &params[1], &params[2], &alone[0]}) p->pow(3).sum().backward();
    ours.step();
    theirs.step();
    optim::zero_grad(ours, true);
    optim::zero_grad(theirs, true);
  }
  EXPECT_TRUE(torch::equal(params[0], alone[0]));
  EXPECT_TRUE(torch::equal(params[1], make_params()[1]));
  EXPECT_TRUE(torch::equal(params[2], make_params()[2]));
  EXPECT_EQ(ours.lr(1).item<double>(), 0.0);
}

// An inf gradient with the skip flag set: that step changes nothing (parameters, moments, the
// count), on both paths; the next finite step goes on as if the bad one had never been.
TEST(OptimizerSkip, ANonFiniteStepChangesNothingAndIsNotCounted) {
  for (const bool device_scalars : {false, true}) {
    for (const std::string kind : {"sgd", "adamw"}) {
      auto params = make_params();
      auto clean = make_params();
      const auto make =
          [&](std::vector<torch::Tensor> p) -> std::unique_ptr<torch::optim::Optimizer> {
        if (kind == "sgd") {
          return std::make_unique<optim::Sgd>(p, torch::optim::SGDOptions(0.1).momentum(0.9));
        }
        return std::make_unique<optim::AdamW>(p, torch::optim::AdamWOptions(1e-2));
      };
      auto ours = make(params);
      auto reference = make(clean);
      auto& device = dynamic_cast<optim::DeviceStep&>(*ours);
      device.use_host_scalars(!device_scalars);
      dynamic_cast<optim::DeviceStep&>(*reference).use_host_scalars(!device_scalars);
      const auto flag = torch::zeros({});
      device.skip_when(flag);
      const auto grads = [](std::vector<torch::Tensor>& ps, int s) {
        for (auto& p : ps) p.mutable_grad() = torch::full(p.sizes(), 0.1 * (s + 1));
      };
      for (int s = 0; s < 4; ++s) {
        grads(params, s);
        if (s != 2) grads(clean, s);
        if (s == 2) {
          params[0].mutable_grad()[0][0] = INFINITY;
          flag.fill_(1);
        }
        const auto before = params[0].clone();
        ours->step();
        if (s == 2) {
          EXPECT_TRUE(torch::equal(params[0], before)) << kind << " " << device_scalars;
          flag.fill_(0);
        } else {
          reference->step();
        }
      }
      EXPECT_EQ(device.steps_taken(), 3) << kind;
      for (size_t i = 0; i < params.size(); ++i) {
        EXPECT_TRUE(torch::allclose(params[i], clean[i], 1e-6, 0)) << kind << " parameter " << i;
      }
    }
  }
}

// The state saved through io/ under PyTorch's names ("<name>.step", ".exp_avg", ".exp_avg_sq"),
// the count read from the device; loaded into a fresh optimizer, the next steps equal the
// uninterrupted one's bit for bit.
TEST(OptimizerCheckpoint, RoundTripsUnderPyTorchsNamesAndContinuesExactly) {
  torch::manual_seed(3);
  torch::nn::Linear a(4, 3), b(4, 3);
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < a->parameters().size(); ++i)
      b->parameters()[i].copy_(a->parameters()[i]);
  }
  const auto options = torch::optim::AdamWOptions(1e-2).weight_decay(0.1);
  optim::AdamW first(optim::weight_decay_groups(a->parameters(), options), options);
  const auto x = torch::randn({6, 4});
  const auto train = [&](torch::nn::Linear& m, torch::optim::Optimizer& opt, int steps) {
    for (int s = 0; s < steps; ++s) {
      optim::zero_grad(opt, true);
      m->forward(x).pow(2).mean().backward();
      opt.step();
    }
  };
  train(a, first, 3);
  const io::TensorMap saved = io::optimizer_tensors(first, *a);
  ASSERT_EQ(saved.count("weight.step"), 1u);
  EXPECT_EQ(saved.at("weight.step").item<int64_t>(), 3);
  EXPECT_EQ(saved.count("bias.exp_avg_sq"), 1u);
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < a->parameters().size(); ++i)
      b->parameters()[i].copy_(a->parameters()[i]);
  }
  optim::AdamW second(optim::weight_decay_groups(b->parameters(), options), options);
  io::load_optimizer_tensors(second, *b, saved, "test");
  EXPECT_EQ(second.steps_taken(), 3);
  train(a, first, 2);
  train(b, second, 2);
  EXPECT_TRUE(torch::equal(a->weight, b->weight));
  EXPECT_TRUE(torch::equal(a->bias, b->bias));
  // torch::optim::AdamW reads the same file: our state is its state.
  torch::optim::AdamW theirs(optim::weight_decay_groups(b->parameters(), options), options);
  io::load_optimizer_tensors(theirs, *b, saved, "test");
  EXPECT_EQ(theirs.state().size(), 2u);
}

TEST(OptimizerRefuses, AParameterThatStopsGettingGradients) {
  auto params = make_params();
  optim::Adam adam(params, torch::optim::AdamOptions(1e-3));
  params[0].sum().backward();
  params[1].sum().backward();
  adam.step();
  params[1].mutable_grad().reset();
  EXPECT_EQ(error_of([&] { adam.step(); }),
            "ddp: optimizer: parameter 1 of group 0 (shape [3]) has no gradient in this step but "
            "had one in the first; one step count serves all parameters, so each must get a "
            "gradient in every step or in none");
}

TEST(OptimizerRefuses, NesterovWithoutMomentum) {
  EXPECT_EQ(
      error_of([&] { optim::Sgd(make_params(), torch::optim::SGDOptions(0.1).nesterov(true)); }),
      "Nesterov momentum requires a momentum and zero dampening");  // torch::optim's text
}

// A whole model from the zoo (the small GPT), AdamW both ways for 6 steps on its own task: bit for
// bit with host scalars.
TEST(OptimizerAdamW, EqualsTorchOptimBitForBitOnTheZooGpt) {
  auto ours_model = models::make_workload("gpt");
  auto theirs_model = models::make_workload("gpt");
  const auto options = torch::optim::AdamWOptions(1e-3).weight_decay(1e-2);
  optim::AdamW ours(ours_model.ptr->parameters(), options);
  torch::optim::AdamW theirs(theirs_model.ptr->parameters(), options);
  for (int s = 0; s < 6; ++s) {
    const auto [x, y] = ours_model.batch(s * 8, 8);
    optim::zero_grad(ours, true);
    optim::zero_grad(theirs, true);
    ours_model.loss(ours_model.module.forward(x), y).backward();
    theirs_model.loss(theirs_model.module.forward(x), y).backward();
    ours.step();
    theirs.step();
  }
  const auto a = ours_model.ptr->parameters();
  const auto b = theirs_model.ptr->parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << i;
}

}  // namespace
}  // namespace ddp::testing
