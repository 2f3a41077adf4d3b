// Issue 61 row 8: a run with BatchNorm saved and resumed at the same world continues as the
// uninterrupted run, every rank's running statistics included. A checkpoint keeps rank 0's buffers;
// with broadcast_buffers (the default in every style) rank 0's are every rank's at the next
// forward, so the resumed ranks' buffers equal the uninterrupted ranks' bit for bit. Every style,
// world 2.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>

#include "ddp/io/checkpoint_coordinator.hpp"
#include "ddp/io/checkpoint_state.hpp"
#include "ddp/parallel/data_parallel.hpp"
#include "support/temp_dir.hpp"
#include "support/test_nets.hpp"
#include "support/training_state.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

constexpr int kSaveAt = 3;
constexpr int kSteps = 5;

// Trains steps [first, kSteps) on each rank's own batches; saves after kSaveAt when asked.
// Returns this rank's buffers at the end.
std::map<std::string, torch::Tensor> train(const comm::ProcessGroupPtr& pg,
                                           shard::DataParallelStyle style, bool resume,
                                           const std::string& root, bool save) {
  torch::manual_seed(resume ? 50 + pg->rank() : 3);  // a resumed run starts elsewhere
  auto net = std::make_shared<BatchNormNetImpl>(4, 6, 3);
  parallel::DataParallel<std::shared_ptr<BatchNormNetImpl>> dp(net, pg, style);
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
  io::TrainingState state = training_state(net.get(), &opt, dp.sharding());
  io::CoordinatorOptions options;
  options.root = root;
  int first = 0;
  if (resume) {
    const auto entry = io::resume_latest(*pg, options, state);
    require(entry && state.step == kSaveAt, "did not resume from step " + std::to_string(kSaveAt));
    first = kSaveAt;
  }
  for (int step = first; step < kSteps; ++step) {
    torch::manual_seed(10 * step + pg->rank());  // each rank its own batch
    opt.zero_grad();
    dp.forward(torch::randn({8, 4}) * (1 + pg->rank())).pow(2).mean().backward();
    opt.step();
    if (save && step + 1 == kSaveAt) {
      state.step = kSaveAt;
      io::save_and_barrier(*pg, options, state);
    }
  }
  std::map<std::string, torch::Tensor> out;
  for (const auto& b : net->named_buffers()) out[b.key()] = b.value().clone();
  return out;
}

struct Case {
  std::string style, root;  // root: the checkpoint root
  DDP_CASE_FIELDS(style, root)
};

DDP_TEST_WORKER_WITH(buffers_resume, Case, c) {
  auto pg = worker_process_group();
  const auto style = shard::parse_style(c.style);
  const std::string& root = c.root;
  const auto uninterrupted = train(pg, style, false, root, true);
  const auto resumed = train(pg, style, true, root, false);
  for (const auto& [name, want] : uninterrupted) {
    require(torch::equal(resumed.at(name), want),
            std::string(shard::style_name(style)) + ": rank " + std::to_string(pg->rank()) + "'s " +
                name + " after the resume differs from the uninterrupted run's");
  }
}

class BuffersResume : public ::testing::TestWithParam<std::string> {};

TEST_P(BuffersResume, EveryRanksStatisticsContinueAsTheUninterruptedRuns) {
  const TempDir tmp("buffers_resume");
  EXPECT_WORKERS_PASS(run_workers(buffers_resume, 2, Case{GetParam(), tmp.str()}));
}

INSTANTIATE_TEST_SUITE_P(Styles, BuffersResume,
                         ::testing::Values("replicate", "fully_shard", "default"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace ddp::testing
