// BucketRuntime alone, over a BucketStorage: launches in plan order whatever order gradients come
// in, and reduces by all-reduce or reduce-scatter (padded to equal shards) with closed-form
// results, at world sizes 1, 2 and 3.

#include <gtest/gtest.h>

#include <torch/torch.h>

#include "ddp/buckets/bucket_storage.hpp"
#include "ddp/gradients/bucket_runtime.hpp"
#include "support/workers.hpp"

namespace ddp::testing {
namespace {

using buckets::Reduction;
using gradients::BucketRuntime;

// Three parameters of 5, 6 and 4 elements; caps of 1 byte put each in its own bucket, large caps
// all in one. Rank r's gradient of parameter p, element i: r * 100 + p * 10 + i.
struct RuntimeFixture {
  std::vector<torch::Tensor> params = {torch::zeros({5}), torch::zeros({3, 2}), torch::zeros({4})};
  buckets::BucketPlan plan;
  buckets::BucketStorage layout;
  RuntimeFixture(bool one_bucket, int64_t pad, int rank) {
    std::vector<buckets::ParamSpec> specs;
    for (size_t p = 0; p < params.size(); ++p) {
      specs.push_back({"p" + std::to_string(p), params[p].numel(), torch::kFloat, torch::kCPU});
    }
    buckets::PlanOptions options;
    options.first_bucket_cap_bytes = options.bucket_cap_bytes = one_bucket ? buckets::kMiB : 1;
    plan = buckets::plan_buckets(specs, options);
    layout = buckets::BucketStorage(plan, params, {pad});
    for (size_t p = 0; p < params.size(); ++p) {
      at::Tensor slot = layout.slot(p);
      slot.copy_(torch::arange(slot.numel(), torch::kFloat).view(slot.sizes()) +
                 (rank * 100 + static_cast<int>(p) * 10));
    }
  }
  // The average over `world` ranks of bucket b's storage, padding included.
  torch::Tensor expected(size_t b, int world) const {
    torch::Tensor out = torch::zeros_like(layout.storage(b));
    const auto& spec = plan.buckets[b];
    for (size_t i = 0; i < spec.params.size(); ++i) {
      const size_t p = spec.params[i];
      out.narrow(0, spec.offsets[i], params[p].numel())
          .copy_(torch::arange(params[p].numel(), torch::kFloat) + (world - 1) * 50.0 +
                 static_cast<double>(p) * 10);
    }
    return out;
  }
};

DDP_TEST_WORKER(bucket_runtime_reductions) {
  auto pg = worker_process_group();
  const int world = pg->world_size();
  {  // All-reduce, a bucket per parameter (plan order: p2, p1, p0), gradients ready p0 first.
    RuntimeFixture s(/*one_bucket=*/false, 1, pg->rank());
    require(s.plan.buckets.size() == 3, "expected 3 buckets");
    BucketRuntime runtime(s.params, s.plan, s.layout, pg, nullptr, 0);
    runtime.arm_synchronized(0, 0);
    require(runtime.register_grad_ready(0) == 0, "p0's bucket is last in plan order: no launch");
    require(runtime.register_grad_ready(1) == 0, "p1's bucket waits for p2's");
    require(runtime.register_grad_ready(2) == 3, "p2 completes the first bucket: all 3 launch");
    for (size_t b = 0; b < 3; ++b) {
      require(runtime.has_in_flight(), "bucket in flight");
      const auto finished = runtime.finish_next();
      require(finished.bucket == b, "buckets finish in plan order");
      require(torch::allclose(s.layout.storage(b), s.expected(b, world), 1e-6, 0),
              "all-reduced bucket " + std::to_string(b) + " is not the average");
    }
    require(!runtime.has_in_flight(), "nothing left in flight");
  }
  {  // Reduce-scatter of one bucket of 15 elements padded to a multiple of the world size.
    RuntimeFixture s(/*one_bucket=*/true, world, pg->rank());
    const int64_t padded = (15 + world - 1) / world * world;
    require(s.layout.storage(0).numel() == padded, "storage is padded to a multiple of the world");
    require(s.layout.data(0).numel() == 15, "data excludes the padding");
    s.plan.buckets[0].reduction = Reduction::kReduceScatter;
    BucketRuntime runtime(s.params, s.plan, s.layout, pg, nullptr, 0);
    runtime.arm_synchronized(0, 0);
    for (size_t p = 0; p < 3; ++p) runtime.register_grad_ready(p);
    const auto finished = runtime.finish_next();
    const int64_t chunk = padded / world;
    const torch::Tensor want = s.expected(0, world).narrow(0, pg->rank() * chunk, chunk);
    require(finished.shard.numel() == chunk, "the shard has " +
                                                 std::to_string(finished.shard.numel()) +
                                                 " elements, expected " + std::to_string(chunk));
    require(torch::allclose(finished.shard, want, 1e-6, 0),
            "this rank's shard is not its slice of the average");
  }
}

class BucketRuntimeTest : public ::testing::TestWithParam<int> {};
TEST_P(BucketRuntimeTest, LaunchesInPlanOrderAndReducesByAllReduceOrReduceScatter) {
  EXPECT_WORKERS_PASS(run_workers(bucket_runtime_reductions, GetParam()));
}
INSTANTIATE_TEST_SUITE_P(WorldSizes, BucketRuntimeTest, ::testing::Values(1, 2, 3),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

TEST(BucketStorage, SlotsAliasTheStorageAndPaddingStaysZero) {
  RuntimeFixture s(/*one_bucket=*/true, 4, 0);
  EXPECT_EQ(s.layout.storage(0).numel(), 16);
  EXPECT_EQ(s.layout.storage(0)[15].item<float>(), 0.f);
  for (size_t p = 0; p < 3; ++p) {
    const at::Tensor& slot = s.layout.slot(p);
    EXPECT_TRUE(s.layout.holds(p, slot));
    EXPECT_FALSE(s.layout.holds(p, slot.clone()));
    EXPECT_EQ(slot.sizes(), s.params[p].sizes());
  }
}

}  // namespace
}  // namespace ddp::testing
