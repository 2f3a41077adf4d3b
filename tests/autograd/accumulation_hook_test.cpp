// Accumulation hooks (autograd/accumulation_hook.hpp): gradient_is_captured says whether the
// running backward is a grad() that returns a leaf's gradient instead of accumulating it, and an
// accumulation hook runs once per backward() that reaches its leaf and never from such a grad().
// On libtorch 2.x a plain tensor hook also runs from the capture; these tests run in the CPU suite
// (1.13) and in the GPU stage (2.x), where they are what the sharded styles rely on.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "ddp/autograd/accumulation_hook.hpp"
#include "support/error_text.hpp"

namespace ddp::testing {
namespace {

// y = sum(w * x + v): a hook on the interior tensor w * x runs in every kind of backward and
// records what gradient_is_captured says of w and of v at that moment.
struct Probe {
  torch::Tensor w = torch::full({3}, 2.0, torch::requires_grad());
  torch::Tensor v = torch::full({3}, 1.0, torch::requires_grad());
  torch::Tensor x = torch::arange(3, torch::kFloat);
  std::vector<std::string> seen;
  torch::Tensor loss() {
    auto h = w * x;
    h.register_hook([this](const torch::Tensor&) {
      seen.push_back(std::string(autograd::gradient_is_captured(w) ? "w captured" : "w not") +
                     (autograd::gradient_is_captured(v) ? ", v captured" : ", v not"));
    });
    return (h + v).sum();
  }
};

TEST(AccumulationHook, CapturedOnlyInsideAGradThatReturnsTheLeaf) {
  Probe probe;
  EXPECT_FALSE(autograd::gradient_is_captured(probe.w));  // no backward running
  probe.loss().backward();
  torch::autograd::grad({probe.loss()}, {probe.w});
  torch::autograd::backward({probe.loss()}, {}, false, false, {probe.w});
  EXPECT_EQ(probe.seen,
            (std::vector<std::string>{"w not, v not", "w captured, v not", "w not, v not"}));
}

TEST(AccumulationHook, RunsOncePerBackwardWithTheAccumulatedGradientAndNeverForAGrad) {
  const auto w = torch::full({3}, 2.0, torch::requires_grad());
  const auto x = torch::tensor({1.0f, 2.0f, 3.0f});
  std::vector<torch::Tensor> got;
  const unsigned id = autograd::add_accumulation_hook(
      w, [&](const torch::Tensor& grad) { got.push_back(grad.clone()); });
  (w * x).sum().backward();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(got[0].equal(x));  // d/dw sum(w * x) = x
  const auto returned = torch::autograd::grad({(w * x * 3).sum()}, {w})[0];
  EXPECT_TRUE(returned.equal(x * 3));
  EXPECT_EQ(got.size(), 1u) << "a grad() over the leaf accumulates nothing";
  EXPECT_TRUE(w.grad().equal(x));
  w.remove_hook(id);
  (w * x).sum().backward();
  EXPECT_EQ(got.size(), 1u) << "removed";
}

TEST(AccumulationHook, RefusesATensorThatIsNotALeafRequiringGrad) {
  const auto w = torch::ones({2}, torch::requires_grad());
  EXPECT_EQ(error_of([&] { autograd::add_accumulation_hook(w * 2, [](const torch::Tensor&) {}); }),
            "ddp: an accumulation hook goes on a leaf that requires grad");
  EXPECT_EQ(error_of([&] {
              autograd::add_accumulation_hook(torch::ones({2}), [](const torch::Tensor&) {});
            }),
            "ddp: an accumulation hook goes on a leaf that requires grad");
}

}  // namespace
}  // namespace ddp::testing
