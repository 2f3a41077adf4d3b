#include <gtest/gtest.h>

#include <torch/torch.h>

#include <algorithm>

#include "ddp/models/net.hpp"
#include "ddp/parallel/distributed_data_parallel.hpp"
#include "support/bucket_views.hpp"
#include "support/oracle_twin.hpp"
#include "support/param_names.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

// Net(1024) with 2 MiB caps: four buckets, one per layer. The first bucket's all-reduce must be
// launched while backward still has gradients to compute (timestamps, not durations), buckets
// launch in plan order, and every grad is a view into its bucket.
DDP_TEST_WORKER(overlap) {
  auto pg = worker_process_group();
  models::Net net(1024);
  parallel::DDPOptions options;
  options.gradients.buckets.first_bucket_cap_bytes = options.gradients.buckets.bucket_cap_bytes =
      buckets::mib_bytes(2);
  parallel::DistributedDataParallel<models::Net> model(net, pg, options);
  require(model.bucket_plan().buckets.size() == 4, "expected one bucket per layer");
  auto x = torch::randn({32, 1024});
  for (int step = 0; step < 2; ++step) {
    model(x).pow(2).mean().backward();
    const auto tl = model.last_timeline();
    const int64_t last_ready =
        *std::max_element(tl.param_ready_ns.begin(), tl.param_ready_ns.end());
    require(tl.bucket_launch_ns[0] >= 0, "bucket 0 was not launched");
    require(tl.bucket_launch_ns[0] < last_ready,
            "bucket 0 was launched only after the last gradient was ready: no overlap");
    for (size_t b = 1; b < tl.bucket_launch_ns.size(); ++b) {
      require(tl.bucket_launch_ns[b - 1] <= tl.bucket_launch_ns[b],
              "buckets launched out of order");
    }
    // A bucket launches when its last parameter is ready, never earlier.
    const auto& plan = model.bucket_plan();
    for (size_t b = 0; b < plan.buckets.size(); ++b) {
      for (size_t p : plan.buckets[b].params) {
        require(tl.param_ready_ns[p] <= tl.bucket_launch_ns[b], "bucket launched before its grads");
      }
    }
    for (size_t p = 0; p < model.parameters().size(); ++p) {
      require(grad_in_its_bucket(model, p),
              "grad of " + model.parameter_names()[p] + " is not a view into its bucket");
    }
  }
  require(model.num_synchronized_backwards() == 2, "two synchronized backwards expected");
}

DDP_WORKER_TEST_PER_WORLD(Overlap, FirstBucketLaunchesBeforeTheLastGradient, overlap, 2, 3);

// overlap = false (attribution only): every bucket is launched after the last gradient, in plan
// order, and two steps still end where the single process ends on the global batches.
DDP_TEST_WORKER(no_overlap) {
  auto pg = worker_process_group();
  const int w = pg->world_size();
  OracleTwin<models::Net> twin([] { return models::Net(64); }, w, pg->rank());
  parallel::DDPOptions options;
  options.gradients.overlap = false;
  options.gradients.buckets.first_bucket_cap_bytes = options.gradients.buckets.bucket_cap_bytes =
      64 * 65 * 4;  // one bucket per layer
  parallel::DistributedDataParallel<models::Net> model(twin.net(), pg, options);
  require(model.bucket_plan().buckets.size() == 4, "expected one bucket per layer");
  torch::manual_seed(1);
  const auto x = torch::randn({4 * w, 64});
  for (int step = 0; step < 2; ++step) {
    twin.step(
        [&] {
          model(twin.mine(x)).pow(2).mean().backward();
          const auto tl = model.last_timeline();
          const int64_t last_ready =
              *std::max_element(tl.param_ready_ns.begin(), tl.param_ready_ns.end());
          for (size_t b = 0; b < tl.bucket_launch_ns.size(); ++b) {
            require(tl.bucket_launch_ns[b] >= last_ready,
                    "a bucket launched before backward ended");
            if (b > 0) {
              require(tl.bucket_launch_ns[b - 1] <= tl.bucket_launch_ns[b], "out of order");
            }
          }
        },
        [&] { twin.oracle()->forward(x).pow(2).mean().backward(); });
  }
  twin.require_close(whole_parameters(model), 1e-5, "overlap = false");
}

DDP_WORKER_TEST_PER_WORLD(NoOverlap, LaunchesEveryBucketAfterBackwardWithTheSameGradients,
                          no_overlap, 1, 2, 3);

}  // namespace
}  // namespace ddp::testing
