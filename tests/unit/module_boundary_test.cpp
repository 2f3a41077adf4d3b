// The module boundaries (unit/): the one custom-node helper, and misuse named instead of silent.
//   - attach_backward / on_backward: the node's function sees the gradient of the output and
//     what it returns reaches the input; on_backward runs before anything upstream.
//   - A tensor-parallel Linear the model calls directly (not through run_unit) would give one
//     rank's partial sums as gradients: its backward is an error naming the module and the fix,
//     at world 1 to 4, while the same model through run_unit trains (also two forwards, then
//     two backwards). Removing the detection makes the error test fail.
//   - A FULLY_SHARD unit the model never runs through run_unit: a warning on the first forward
//     naming it and the bytes it keeps gathered, once, at world 1 to 3.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ddp/autograd/backward_node.hpp"
#include "ddp/shard/sharded_module.hpp"
#include "ddp/tp/parallelize.hpp"
#include "ddp/unit/unit_scope.hpp"
#include "support/error_text.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

TEST(BackwardNode, TheFunctionMapsTheOutputsGradientToTheInputs) {
  const auto x = torch::ones({3}, torch::requires_grad());
  const auto y = autograd::attach_backward(
      (x * 1).detach(), x, [](const torch::Tensor& g) { return g * 3; }, "test::Triple");
  ASSERT_TRUE(y.requires_grad());
  EXPECT_EQ(y.grad_fn()->name(), "test::Triple");
  (y * 2).sum().backward();
  EXPECT_TRUE(x.grad().equal(torch::full({3}, 6.0)));  // d(2y)/dy = 2, tripled
}

TEST(BackwardNode, OnBackwardRunsBeforeTheGradientFlowsFurtherBack) {
  const auto w = torch::full({2}, 2.0, torch::requires_grad());
  std::vector<std::string> order;
  const auto square = w * w;
  square.register_hook([&](const torch::Tensor& g) {
    order.push_back("upstream");
    return g;
  });
  const auto out = autograd::on_backward(square, [&] { order.push_back("callback"); });
  out.sum().backward();
  EXPECT_EQ(order, (std::vector<std::string>{"callback", "upstream"}));
  EXPECT_TRUE(w.grad().equal(torch::full({2}, 4.0)));  // d(w^2)/dw = 2w, unchanged by the node
  torch::NoGradGuard no_grad;
  const auto plain = torch::ones({2});
  EXPECT_TRUE(autograd::on_backward(plain, [] {
                FAIL() << "no backward without grad mode";
              }).is_same(plain));
}

constexpr int64_t kWidth = 12;  // divides by 1, 2, 3 and 4

// fc1 colwise, fc2 rowwise; `direct` calls fc1's forward itself instead of through run_unit.
struct PairImpl : torch::nn::Module {
  explicit PairImpl(bool direct_) : direct(direct_) {
    fc1 = register_module("fc1", torch::nn::Linear(kWidth, kWidth));
    fc2 = register_module("fc2", torch::nn::Linear(kWidth, kWidth));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto call = [](torch::nn::Linear& fc, const torch::Tensor& in) {
      return unit::run_unit(
          *fc, [&fc](const torch::Tensor& t) { return fc->forward(t); }, in);
    };
    const auto h = torch::relu(direct ? fc1->forward(x) : call(fc1, x));
    return call(fc2, h);
  }
  bool direct;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Pair);

DDP_TEST_WORKER(tp_direct_call) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const tp::TpPlan plan{{"fc1", tp::ColwiseParallel()}, {"fc2", tp::RowwiseParallel()}};
  torch::manual_seed(0);
  const auto x = torch::randn({4, kWidth});
  {
    Pair good(false);
    auto tensor_parallel = tp::parallelize_module(good.ptr(), pg, plan);
    good->forward(x).sum().backward();
    // Two forwards, then two backwards: each backward uses up one forward.
    const auto a = good->forward(x).sum();
    const auto b = good->forward(2 * x).sum();
    a.backward();
    b.backward();
  }
  Pair direct(true);
  auto tensor_parallel = tp::parallelize_module(direct.ptr(), pg, plan);
  const std::string error = error_of([&] { direct->forward(x).sum().backward(); });
  require(error ==
              "ddp: tensor-parallel module 'fc1' (ColwiseParallel) got a gradient in a backward "
              "after no forward through ddp::unit::run_unit: called directly, it skips the "
              "tensor-parallel collectives and its gradients are one rank's partial sums. Call it "
              "as ddp::unit::run_unit(*module, [&](const at::Tensor& x) { return "
              "module->forward(x); }, input) in the model's forward",
          "the direct call's error, got: '" + error + "'");
}

class TensorParallelDirectCall : public ::testing::TestWithParam<int> {};

TEST_P(TensorParallelDirectCall, IsAnErrorNamingTheModuleAndTheFix) {
  EXPECT_WORKERS_PASS(run_workers(tp_direct_call, GetParam()));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, TensorParallelDirectCall, ::testing::Values(1, 2, 3, 4));

DDP_TEST_WORKER(sharded_unit_not_run) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  // fc2 runs through run_unit, fc1 is called directly by this model: only fc1 is named.
  Pair model(/*direct=*/true);
  shard::ShardOptions options;
  options.units = {"fc1", "fc2"};
  shard::FullyShardedDataParallel<Pair> sharded(model, pg, options);
  const auto x = torch::randn({2, kWidth});
  ::testing::internal::CaptureStderr();
  sharded(x).sum().backward();
  const std::string first = ::testing::internal::GetCapturedStderr();
  ::testing::internal::CaptureStderr();
  sharded(x).sum().backward();
  const std::string second = ::testing::internal::GetCapturedStderr();
  // fc1: [12, 12] + [12] gathered, 12 * 13 fp32 values at every world size that divides 12.
  const std::string want = "[ddp rank " + std::to_string(pg->rank()) +
                           "] ddp: warning: unit 'fc1' did not run through ddp::unit::run_unit in "
                           "the first forward, so it is gathered for the whole step (624 bytes "
                           "per rank) instead of around its own forward and backward; run it as "
                           "ddp::unit::run_unit(*module, fn, input) in the model's forward, or "
                           "leave it out of ShardOptions::units\n";
  require(first == want, "the first forward's warning, got: '" + first + "'");
  require(second.empty(), "no warning after the first forward, got: '" + second + "'");
}

class ShardedUnitNotRun : public ::testing::TestWithParam<int> {};

TEST_P(ShardedUnitNotRun, WarnsOnceNamingTheUnitAndWhatItCosts) {
  EXPECT_WORKERS_PASS(run_workers(sharded_unit_not_run, GetParam()));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ShardedUnitNotRun, ::testing::Values(1, 2, 3));

}  // namespace
}  // namespace ddp::testing
