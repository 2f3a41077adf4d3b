// wrap::WrappedModel, the base every style's runtime shares, asked through DataParallel::wrapped()
// as a tool asks it: the same calls answer under DDP, FULLY_SHARD and DEFAULT at world 2 on Gloo
// (the plan summary, zero_grad refused while a backward runs and then zeroing every gradient, the
// optimizer in backward refused after the first backward, gathered memory), and the runtime's
// phases appear as profiler ranges (RecordFunction, USER_SCOPE) for a kernel trace to show.

#include "ddp/wrap/wrapped_model.hpp"

#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mutex>
#include <set>
#include <string>

#include "ddp/models/mlp.hpp"
#include "ddp/parallel/data_parallel.hpp"
#include "support/error_text.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

// The names of the USER_SCOPE ranges run since the last clear (the callback is a plain function:
// RecordFunctionCallback takes no captures).
std::mutex ranges_mutex;
std::set<std::string> ranges;

std::unique_ptr<at::ObserverContext> on_range(const at::RecordFunction& fn) {
  std::lock_guard<std::mutex> lock(ranges_mutex);
  ranges.insert(fn.name());
  return nullptr;
}

struct StyleCase {
  std::string style;
  DDP_CASE_FIELDS(style)
};

DDP_TEST_WORKER_WITH(wrapped_model_styles, StyleCase, c) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const auto style = shard::parse_style(c.style);
  // hidden 6 divides by 2: DEFAULT shards the hidden layers, replicates the 5-row last
  const models::MLPOptions shape{/*in=*/4, /*hidden=*/6, /*out=*/5, /*depth=*/3};
  torch::manual_seed(0);
  models::MLP net(shape);
  DataParallelOptions options;
  options.shard.units = {"layers.0", "layers.1", "layers.2"};
  auto model = data_parallel(net, pg, style, options);
  wrap::WrappedModel& base = model.wrapped();
  const std::string summary = base.plan_summary();
  const std::string want_summary =
      style == DataParallelStyle::kReplicate
          ? "1 bucket"
          : "3 units (" + std::string(shard::style_name(style)) + ")";  // the root holds nothing
  require(summary == want_summary,
          "plan summary '" + summary + "', expected '" + want_summary + "'");
  require(!base.plan_table().empty(), "the plan table");

  const auto handle = at::addGlobalCallback(
      at::RecordFunctionCallback(&on_range).scopes({at::RecordScope::USER_SCOPE}));
  base.set_optimizer_in_backward([](const torch::Tensor& p) {
    return std::make_unique<torch::optim::SGD>(std::vector<torch::Tensor>{p},
                                               torch::optim::SGDOptions(0.1));
  });
  // zero_grad inside the backward (a hook on the input's gradient runs while it is under way).
  std::string inside;
  const auto x = torch::randn({3, 4}).requires_grad_();
  const auto out = model(x * 1.0);
  x.register_hook([&](const torch::Tensor& g) {
    inside = error_of([&] { base.zero_grad(); });
    return g;
  });
  out.sum().backward();
  at::removeCallback(handle);
  require(inside.rfind("ddp: zero_grad() while a backward is running", 0) == 0,
          "zero_grad inside backward: '" + inside + "'");
  // Every phase the style runs shows as a range.
  std::set<std::string> want = {"ddp::pre_forward", "ddp::post_forward", "ddp::reduce_bucket",
                                "ddp::finish_backward", "ddp::optimizer_in_backward"};
  if (style != DataParallelStyle::kReplicate) want.insert("ddp::gather_unit");
  for (const auto& name : want) {
    require(ranges.count(name) == 1, "no profiler range " + name);
  }
  // Between steps: every reduced gradient zeroed, whichever runtime holds it.
  base.zero_grad();
  for (const auto& p : net->parameters()) {
    require(!p.grad().defined() || p.grad().abs().max().item<double>() == 0, "a gradient left");
  }
  require(error_of([&] {
            base.set_optimizer_in_backward([](const torch::Tensor&) { return nullptr; });
          }) == "ddp: the optimizer in backward is already set",
          "a second optimizer in backward");
  // Gathered memory: nothing under DDP; the units' buffers under the sharded styles.
  const bool gathers = base.peak_gathered_bytes() > 0;
  require(gathers == (style != DataParallelStyle::kReplicate),
          "peak gathered " + std::to_string(base.peak_gathered_bytes()));
}

// A second model of the same style: the optimizer in backward after its first backward is refused
// by both runtimes alike (only DDP's checked before).
DDP_TEST_WORKER_WITH(wrapped_model_late_optimizer, StyleCase, c) {
  auto pg = worker_process_group(std::chrono::seconds(60));
  const auto style = shard::parse_style(c.style);
  torch::manual_seed(0);
  models::MLP net(models::MLPOptions{4, 6, 5, 2});
  auto model = data_parallel(net, pg, style);
  model(torch::randn({3, 4})).sum().backward();
  const std::string error = error_of(
      [&] { model.set_optimizer_in_backward([](const torch::Tensor&) { return nullptr; }); });
  require(error == "ddp: set_optimizer_in_backward must be called before the first backward",
          "late optimizer in backward: '" + error + "'");
}

class WrappedModelStyles : public ::testing::TestWithParam<std::string> {};

TEST_P(WrappedModelStyles, EveryStyleAnswersTheSameCalls) {
  EXPECT_WORKERS_PASS(run_workers(wrapped_model_styles, 2, StyleCase{GetParam()}));
}

TEST_P(WrappedModelStyles, TheOptimizerInBackwardAfterABackwardIsRefused) {
  EXPECT_WORKERS_PASS(run_workers(wrapped_model_late_optimizer, 2, StyleCase{GetParam()}));
}

INSTANTIATE_TEST_SUITE_P(Styles, WrappedModelStyles,
                         ::testing::Values("replicate", "fully_shard", "default"));

}  // namespace
}  // namespace ddp::testing
