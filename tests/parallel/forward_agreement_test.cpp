// Issue 61 row 5: rank 0 evaluates alone (a no_grad forward through the wrapper) while rank 1
// goes on training. The buffer broadcasts that start both forwards pair up, and rank 1 stops there
// naming both kinds of forward ([Note: the forward's kind], wrap/wrapped_model.cpp) instead of
// pairing rank 0's gathers with its training collectives until Gloo aborts the process. Rank 0
// then fails in its next collective (its peer is gone), named and bounded by the timeout. DDP and
// FULLY_SHARD, world 2.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "ddp/parallel/data_parallel.hpp"
#include "support/test_nets.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

struct Case {
  std::string style = "replicate";
  DDP_CASE_FIELDS(style)
};

DDP_TEST_WORKER_WITH(forward_on_one_rank, Case, c) {
  auto pg = worker_process_group(std::chrono::seconds(10));
  const auto style = shard::parse_style(c.style);
  torch::manual_seed(3);
  auto net = std::make_shared<BatchNormNetImpl>(4, 6, 3);
  parallel::DataParallel<std::shared_ptr<BatchNormNetImpl>> dp(net, pg, style);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
  const auto step = [&] {
    opt.zero_grad();
    dp.forward(torch::randn({8, 4})).pow(2).mean().backward();
    opt.step();
  };
  step();  // every rank
  std::string error;
  try {
    if (pg->rank() == 0) {
      net->eval();
      torch::NoGradGuard no_grad;
      dp.forward(torch::randn({5, 4}));  // alone
    }
    net->train();
    step();
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  }
  if (pg->rank() == 0) {
    require(!error.empty(), "rank 0 went on as if its peer had evaluated too");
    return;
  }
  require(error ==
              "ddp: rank 0 made an evaluation forward (no_grad) where rank 1 made a training "
              "forward: every rank of the group must make every forward through the wrapper and "
              "open every model.evaluation() together (under DDP, evaluate on one rank alone by "
              "calling the module itself, which communicates nothing)",
          "rank 1's error: '" + error + "'");
}

class ForwardAgreement : public ::testing::TestWithParam<std::string> {};

TEST_P(ForwardAgreement, AForwardOnOneRankIsNamedOnTheOthers) {
  EXPECT_WORKERS_PASS(
      run_workers(forward_on_one_rank, 2, Case{GetParam()}, {}, std::chrono::seconds(60)));
}

INSTANTIATE_TEST_SUITE_P(Styles, ForwardAgreement, ::testing::Values("replicate", "fully_shard"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace ddp::testing
