// Buffers at evaluation, every style: each rank's batch moves its own BatchNorm statistics within
// a step, so after training they differ across ranks; an evaluation forward through the wrapper
// (eval mode, no_grad) broadcasts rank 0's first, as PyTorch's DDP does, and every rank computes
// the same outputs; with broadcast_buffers off each rank keeps its own. Worlds 2 and 3.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "ddp/parallel/data_parallel.hpp"
#include "support/test_nets.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

bool all_equal(const std::vector<torch::Tensor>& each) {
  for (const auto& t : each) {
    if (!torch::equal(t, each[0])) return false;
  }
  return true;
}

struct Case {
  std::string style = "replicate";  // the wrapper's style
  // true leaves broadcast_buffers at its default (true), false turns it off in the struct the
  // style reads.
  bool broadcast = true;
  int world = 2;
  DDP_CASE_FIELDS(style, broadcast)
};

DDP_TEST_WORKER_WITH(evaluation_buffers, Case, c) {
  auto pg = worker_process_group();
  const auto style = shard::parse_style(c.style);
  const bool broadcast = c.broadcast;
  torch::manual_seed(3);
  auto net = std::make_shared<BatchNormNetImpl>(4, 6, 3);
  parallel::DataParallelOptions options;
  options.ddp.broadcast_buffers = broadcast || style != shard::DataParallelStyle::kReplicate;
  options.shard.broadcast_buffers = broadcast || style == shard::DataParallelStyle::kReplicate;
  parallel::DataParallel<std::shared_ptr<BatchNormNetImpl>> dp(net, pg, style, options);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
  for (int step = 0; step < 2; ++step) {
    torch::manual_seed(10 * step + pg->rank());  // each rank its own batch
    opt.zero_grad();
    dp.forward(torch::randn({8, 4}) * (1 + pg->rank())).pow(2).mean().backward();
    opt.step();
  }
  require(!all_equal(pg->all_gather_each(net->bn->running_mean, "running means after training")),
          "the running means agree after training: the test would not see a missing broadcast");
  net->eval();
  torch::Tensor out;
  {
    torch::NoGradGuard no_grad;
    torch::manual_seed(99);  // the same input on every rank
    out = dp.forward(torch::randn({5, 4}));
  }
  const std::string what = std::string(shard::style_name(style)) + " with broadcast_buffers " +
                           (broadcast ? "on" : "off");
  require(all_equal(pg->all_gather_each(out, "evaluation outputs")) == broadcast,
          what + ": the ranks' evaluation outputs " + (broadcast ? "differ" : "agree"));
  require(all_equal(pg->all_gather_each(net->bn->running_var, "running variances")) == broadcast,
          what + ": the running variances " + (broadcast ? "differ" : "agree") +
              " after the evaluation forward");
}

DDP_WORKER_CASE_TEST(EvaluationBuffers, AnEvaluationForwardSeesRankZerosBuffersUnlessTurnedOff,
                     evaluation_buffers, Case);

INSTANTIATE_TEST_SUITE_P(StylesWorlds, EvaluationBuffers,
                         ::testing::Values(Case{"replicate", true, 2}, Case{"replicate", true, 3},
                                           Case{"replicate", false, 2},
                                           Case{"fully_shard", true, 2},
                                           Case{"fully_shard", true, 3},
                                           Case{"fully_shard", false, 2}, Case{"default", true, 3},
                                           Case{"default", false, 2}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.style +
                                  (info.param.broadcast ? "_broadcast" : "_local") + "_world" +
                                  std::to_string(info.param.world);
                         });

// broadcast_buffers turned off where the style does not read it would be ignored: refused.
TEST(EvaluationBuffers, OffInTheStructTheStyleDoesNotReadIsRefused) {
  parallel::DataParallelOptions options;
  options.ddp.broadcast_buffers = false;
  EXPECT_EQ(parallel::buffer_setting_conflict(shard::DataParallelStyle::kFullyShard, options),
            "ddp::data_parallel: DataParallelOptions::ddp.broadcast_buffers is false but the "
            "style is fully_shard, which reads shard.broadcast_buffers: set that one");
  EXPECT_EQ(parallel::buffer_setting_conflict(shard::DataParallelStyle::kReplicate, options), "");
  options = {};
  options.shard.broadcast_buffers = false;
  EXPECT_EQ(parallel::buffer_setting_conflict(shard::DataParallelStyle::kReplicate, options),
            "ddp::data_parallel: DataParallelOptions::shard.broadcast_buffers is false but the "
            "style is replicate, which reads ddp.broadcast_buffers: set that one");
  EXPECT_EQ(parallel::buffer_setting_conflict(shard::DataParallelStyle::kDefault, options), "");
}

}  // namespace
}  // namespace ddp::testing
