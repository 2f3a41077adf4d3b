// DDP's buffers at evaluation: each rank's batch moves its own BatchNorm statistics within a step,
// so after training they differ across ranks; an evaluation forward through the wrapper (eval
// mode, no_grad) broadcasts rank 0's first, as PyTorch's DDP does, and every rank computes the
// same outputs. Worlds 2 and 3.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ddp/parallel/data_parallel.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

struct BnNetImpl : torch::nn::Module {
  BnNetImpl() {
    fc = register_module("fc", torch::nn::Linear(4, 3));
    bn = register_module("bn", torch::nn::BatchNorm1d(3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return bn(fc(x)); }
  torch::nn::Linear fc{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};

bool all_equal(const std::vector<torch::Tensor>& each) {
  for (const auto& t : each) {
    if (!torch::equal(t, each[0])) return false;
  }
  return true;
}

DDP_TEST_WORKER(ddp_evaluation_buffers) {
  auto pg = worker_process_group();
  torch::manual_seed(3);
  auto net = std::make_shared<BnNetImpl>();
  parallel::DataParallel<std::shared_ptr<BnNetImpl>> dp(net, pg,
                                                        shard::DataParallelStyle::kReplicate);
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
  require(all_equal(pg->all_gather_each(out, "evaluation outputs")),
          "the ranks' evaluation outputs differ: the evaluation forward did not broadcast rank "
          "0's buffers");
  require(all_equal(pg->all_gather_each(net->bn->running_var, "running variances")),
          "the running variances differ after the evaluation forward");
}

class DdpEvaluationBuffers : public ::testing::TestWithParam<int> {};

TEST_P(DdpEvaluationBuffers, AnEvaluationForwardSeesRankZerosBuffers) {
  const auto result = run_workers("ddp_evaluation_buffers", GetParam());
  EXPECT_TRUE(result.ok()) << result.describe();
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, DdpEvaluationBuffers, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "world" + std::to_string(info.param);
                         });

}  // namespace
}  // namespace ddp::testing
