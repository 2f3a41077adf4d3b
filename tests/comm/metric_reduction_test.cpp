// reduce_metric (comm/metric_reduction.hpp) over a DistributedSampler's epoch with padding: each
// rank adds the dataset indices of its first real_samples() samples; the group's sum is
// 0 + 1 + ... + (n - 1) and its count n, every sample once, at worlds 1-3. Counting the padded
// tail too would not be.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "ddp/comm/metric_reduction.hpp"
#include "ddp/data/distributed_sampler.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

constexpr int64_t kSize = 10;  // samples: pads to 12 at world 3 (two repeats), none at 1 and 2

DDP_TEST_WORKER(metric_over_padded_epoch) {
  auto pg = worker_process_group();
  data::SamplerOptions options;
  options.size = kSize;
  options.world_size = pg->world_size();
  options.rank = pg->rank();
  options.seed = 5;
  data::DistributedSampler sampler(options);
  const auto indices = sampler.epoch_indices(0);
  double sum = 0, padded_sum = 0;
  for (int64_t k = 0; k < sampler.samples_per_rank(); ++k) {
    const auto index = static_cast<double>(indices[static_cast<size_t>(k)]);
    padded_sum += index;
    if (k < sampler.real_samples()) sum += index;
  }
  const comm::MetricTotal total = comm::reduce_metric(*pg, sum, sampler.real_samples(), "indices");
  require(total.count == kSize, "count " + std::to_string(total.count) + ", expected 10");
  require(total.sum == kSize * (kSize - 1) / 2, "sum " + std::to_string(total.sum));
  require(total.mean() == 4.5, "mean " + std::to_string(total.mean()));
  const comm::MetricTotal padded =
      comm::reduce_metric(*pg, padded_sum, sampler.samples_per_rank(), "padded");
  const bool pads = kSize % pg->world_size() != 0;
  require((padded.count != kSize) == pads, "the padded count is " + std::to_string(padded.count));
}

class MetricReduction : public ::testing::TestWithParam<int> {};

TEST_P(MetricReduction, CountsEverySampleOnceDespitePadding) {
  EXPECT_WORKERS_PASS(run_workers(metric_over_padded_epoch, GetParam()));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, MetricReduction, ::testing::Values(1, 2, 3),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "world" + std::to_string(info.param);
                         });

TEST(MetricReduction, RealSamplesInClosedForm) {
  // 10 samples over 3 ranks: positions 0..11, 10 and 11 repeat; rank r holds r, r + 3, r + 6,
  // r + 9.
  for (const auto& [rank, real] : std::vector<std::pair<int, int64_t>>{{0, 4}, {1, 3}, {2, 3}}) {
    data::SamplerOptions options;
    options.size = kSize;
    options.world_size = 3;
    options.rank = rank;
    EXPECT_EQ(data::DistributedSampler(options).real_samples(), real) << "rank " << rank;
    options.drop_last = true;
    EXPECT_EQ(data::DistributedSampler(options).real_samples(), 3) << "rank " << rank;
  }
  data::SamplerOptions few;  // fewer samples than ranks: rank 2 holds only a repeat
  few.size = 2;
  few.world_size = 3;
  few.rank = 2;
  EXPECT_EQ(data::DistributedSampler(few).real_samples(), 0);
  EXPECT_TRUE(std::isnan(comm::MetricTotal{}.mean()));
}

}  // namespace
}  // namespace ddp::testing
