// model.evaluation() (wrap/evaluation.hpp) in every style, worlds 2 and 3: after training (each
// rank's BatchNorm statistics its own), the module itself and the wrapper inside the scope compute
// what an evaluation forward through the wrapper computes (whole parameters, rank 0's buffers),
// with the whole head's 10 logits, communicating nothing inside; after it the module is back in
// training mode on its shards and trains on. Outside the scope, a sharded unit run through the
// module itself is refused by name.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "ddp/parallel/data_parallel.hpp"
#include "ddp/unit/unit_scope.hpp"
#include "support/error_text.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

// A unit (body: Linear + BatchNorm, run through run_unit) and a root head: a sharded style
// gathers the body per unit and the head with the root.
struct EvalNetImpl : torch::nn::Module {
  EvalNetImpl() {
    body = register_module(
        "body", torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8)));
    head = register_module("head", torch::nn::Linear(8, 10));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const auto h = unit::run_unit(
        *body, [this](const torch::Tensor& in) { return body->forward(in); }, x);
    return head(torch::relu(h));
  }
  torch::nn::Sequential body{nullptr};
  torch::nn::Linear head{nullptr};
};

struct StyleCase {
  std::string style;
  DDP_CASE_FIELDS(style)
};

DDP_TEST_WORKER_WITH(evaluation_scope, StyleCase, c) {
  auto pg = worker_process_group();
  const auto style = shard::parse_style(c.style);
  const std::string what =
      std::string(shard::style_name(style)) + " at world " + std::to_string(pg->world_size());
  torch::manual_seed(3);
  auto net = std::make_shared<EvalNetImpl>();
  parallel::DataParallelOptions options;
  options.shard.units = {"body"};
  parallel::DataParallel<std::shared_ptr<EvalNetImpl>> dp(net, pg, style, options);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
  const auto step = [&](int s) {
    torch::manual_seed(10 * s + pg->rank());  // each rank its own batch
    opt.zero_grad();
    dp.forward(torch::randn({8, 4}) * (1 + pg->rank())).pow(2).mean().backward();
    opt.step();
  };
  for (int s = 0; s < 2; ++s) step(s);
  torch::manual_seed(99);
  const auto x = torch::randn({5, 4});  // the same input on every rank
  torch::Tensor want;
  {
    // The reference: an evaluation forward through the wrapper (rank 0's buffers, units gathered).
    net->eval();
    torch::NoGradGuard no_grad;
    want = dp.forward(x);
    net->train();
  }
  require(want.sizes() == torch::IntArrayRef({5, 10}), what + ": logits " + c10::str(want.sizes()));
  if (style != shard::DataParallelStyle::kReplicate) {
    const std::string refused = error_of([&] { net->forward(x); });
    require(refused ==
                "ddp: unit 'body' ran outside the wrapper's forward while its parameters "
                "are sharded (" +
                    std::string(shard::style_name(style)) +
                    "): run the model through the wrapper (model(x)), or inside "
                    "model.evaluation() (every unit gathered, wrap/evaluation.hpp)",
            what + ": the direct call outside the scope: '" + refused + "'");
  }
  {
    auto evaluation = dp.evaluation();
    require(!net->is_training() && !torch::GradMode::is_enabled(),
            what + ": not in eval mode under no_grad inside the scope");
    const int64_t before = pg->collectives_issued();
    const auto direct = net->forward(x);
    const auto through = dp.forward(x);
    require(pg->collectives_issued() == before, what + ": the scope's forwards communicated");
    require(torch::equal(direct, want), what + ": the module itself inside the scope differs");
    require(torch::equal(through, want), what + ": the wrapper inside the scope differs");
  }
  require(net->is_training() && torch::GradMode::is_enabled(),
          what + ": the scope did not restore training mode and grad mode");
  step(2);  // trains on from its shards
  const auto all = pg->all_gather_each(want, "evaluation outputs");
  for (const auto& other : all) require(torch::equal(other, want), what + ": ranks differ");
}

class EvaluationScope : public ::testing::TestWithParam<std::pair<std::string, int>> {};

TEST_P(EvaluationScope, TheModuleItselfComputesWhole) {
  EXPECT_WORKERS_PASS(
      run_workers(evaluation_scope, GetParam().second, StyleCase{GetParam().first}));
}

INSTANTIATE_TEST_SUITE_P(StylesWorlds, EvaluationScope,
                         ::testing::Values(std::pair<std::string, int>{"replicate", 2},
                                           std::pair<std::string, int>{"fully_shard", 2},
                                           std::pair<std::string, int>{"fully_shard", 3},
                                           std::pair<std::string, int>{"default", 2}),
                         [](const auto& info) {
                           return info.param.first + "_world" + std::to_string(info.param.second);
                         });

}  // namespace
}  // namespace ddp::testing
