#include <gtest/gtest.h>

#include <torch/torch.h>

#include "ddp/models/net.hpp"
#include "ddp/obs/runtime_stats.hpp"
#include "ddp/parallel/distributed_data_parallel.hpp"
#include "support/param_names.hpp"
#include "support/workers.hpp"

namespace ddp::obs {
namespace {

TEST(RuntimeStats, SamplesTheFirstTenThenEveryNth) {
  std::vector<int64_t> sampled;
  for (int64_t i = 1; i <= 250; ++i) {
    if (should_sample(i, 100)) sampled.push_back(i);
  }
  EXPECT_EQ(sampled, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 100, 200}));
  EXPECT_FALSE(should_sample(0, 100));
}

TEST(RuntimeStats, OverlapIsTheMergedCommBeforeComputeEnds) {
  obs::IterationTimeline t;
  t.iteration = 3;
  t.param_ready_ns = {100, 250, -1, 400};  // compute ends at 400
  t.bucket_launch_ns = {120, 260, 410};
  t.bucket_comm_done_ns = {300, 350, 500};  // [120,300] and [260,350] merge to [120,350]
  t.bucket_done_ns = {420, 430, 520};
  const IterationStats s = stats_from_timeline(t, 77);
  EXPECT_EQ(s.iteration, 3);
  EXPECT_EQ(s.forward_compute_ns, 77);
  EXPECT_EQ(s.backward_compute_ns, 400);
  EXPECT_EQ(s.backward_comm_ns, 500 - 120);
  EXPECT_EQ(s.backward_overlap_ns, 350 - 120);  // [410,500] starts after compute ended
}

DDP_TEST_WORKER(logging_data) {
  auto pg = testing::worker_process_group();
  models::Net net(64);
  parallel::DDPOptions options;
  options.stats_every = 4;
  options.gradients.buckets.first_bucket_cap_bytes = options.gradients.buckets.bucket_cap_bytes =
      buckets::mib_bytes(0.02);
  parallel::DistributedDataParallel<models::Net> model(net, pg, options);
  auto x = torch::randn({8, 64});
  for (int i = 0; i < 13; ++i) model(x).pow(2).mean().backward();
  const LoggingData d = model.logging_data();
  // Iterations 1..10 and 12 (every 4th after the first ten).
  testing::require(d.samples.size() == 11, "sampled " + std::to_string(d.samples.size()));
  testing::require(d.samples.back().iteration == 12, "the last sample must be iteration 12");
  testing::require(d.iterations == 13, "13 iterations");
  testing::require(d.world_size == pg->world_size() && d.rank == pg->rank() && d.backend == "gloo",
                   "world, rank or backend wrong");
  testing::require(d.comm_hook == "allreduce", "hook name");
  testing::require(d.bucket_sizes.size() == model.bucket_plan().buckets.size(), "bucket sizes");
  size_t total = 0;
  for (size_t b : d.bucket_sizes) total += b;
  testing::require(total == 4 * (64 * 64 + 64) * sizeof(float), "bucket bytes, closed form");
  testing::require(d.options.at("stats_every") == "4", "options");
  for (const auto& s : d.samples) {
    testing::require(s.forward_compute_ns > 0 && s.backward_compute_ns > 0, "compute times");
    testing::require(s.backward_comm_ns > 0, "comm time");
    testing::require(s.backward_overlap_ns >= 0 && s.backward_overlap_ns <= s.backward_comm_ns,
                     "overlap within comm");
    testing::require(s.param_ready_ns.size() == 8, "a ready time per parameter");
  }
  testing::require(d.avg_backward_compute_ns > 0, "averages");
  testing::require(format_summary(d).find("backward comm") != std::string::npos, "summary text");
}

DDP_WORKER_TEST_PER_WORLD(LoggingDataTest, SampledStatsAndConfiguration, logging_data, 1, 2, 3);

}  // namespace
}  // namespace ddp::obs
