// DDPOptions::check_replicas_every (issue 61 row 7): a rank that skips one optimizer step leaves
// its replica behind; with the check every 3 synchronized forwards the next check (forward 6)
// throws on every rank, naming the first parameter that differs, on how many ranks, and how many
// tensors differ. Without the check the drift goes on silently (what PyTorch's DDP does too).
// Worlds 2 and 3.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "ddp/parallel/data_parallel.hpp"
#include "support/test_nets.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

struct Case {
  int64_t every = 3;  // DDPOptions::check_replicas_every; 0: no check
  DDP_CASE_FIELDS(every)
};

DDP_TEST_WORKER_WITH(replica_drift, Case, c) {
  auto pg = worker_process_group();
  const int64_t every = c.every;
  torch::manual_seed(3);
  auto net = std::make_shared<BatchNormNetImpl>(4, 6, 3);
  parallel::DataParallelOptions options;
  options.ddp.check_replicas_every = every;
  parallel::DataParallel<std::shared_ptr<BatchNormNetImpl>> dp(
      net, pg, shard::DataParallelStyle::kReplicate, options);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
  std::string error;
  int failed_at = 0;
  for (int step = 1; step <= 8 && error.empty(); ++step) {
    torch::manual_seed(10 * step + pg->rank());
    opt.zero_grad();
    try {
      dp.forward(torch::randn({8, 4})).pow(2).mean().backward();
    } catch (const c10::Error& e) {
      error = e.what_without_backtrace();
      failed_at = step;
      break;
    }
    if (!(step == 4 && pg->rank() == 1)) opt.step();  // rank 1 skips step 4's update
  }
  if (every == 0) {
    require(error.empty(), "no check, yet an error: " + error);
    return;
  }
  // 5 of the 6 parameters: fc1.bias feeds a BatchNorm, which removes its effect, so its gradient
  // is 0 and a skipped step leaves it equal; the buffers are broadcast before the check.
  const std::string want =
      "ddp: DistributedDataParallel: replica check at synchronized forward 6: parameter "
      "'fc1.weight' differs from rank 0's on 1 rank(s) (5 of 9 tensors differ): the replicas "
      "drifted apart; every rank must make the same optimizer steps on the same gradients (a rank "
      "that skipped optimizer.step(), or changed its parameters alone)";
  require(failed_at == 6 && error == want,
          "at step " + std::to_string(failed_at) + ": '" + error + "'");
}

class ReplicaDrift : public ::testing::TestWithParam<std::pair<int, int64_t>> {};

TEST_P(ReplicaDrift, TheNextCheckNamesTheFirstTensorThatDiffers) {
  EXPECT_WORKERS_PASS(run_workers(replica_drift, GetParam().first, Case{GetParam().second}));
}

INSTANTIATE_TEST_SUITE_P(WorldsChecks, ReplicaDrift,
                         ::testing::Values(std::pair<int, int64_t>{2, 3},
                                           std::pair<int, int64_t>{3, 3},
                                           std::pair<int, int64_t>{2, 0}),
                         [](const auto& info) {
                           return "world" + std::to_string(info.param.first) + "_every" +
                                  std::to_string(info.param.second);
                         });

}  // namespace
}  // namespace ddp::testing
