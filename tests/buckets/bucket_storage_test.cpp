// BucketStorage's staged copies ([Note: staged copies]): gradients set aside by stage() reach their
// slots only at fill() of their bucket, all of them, and drop_staged() forgets them; under in-place
// reduction whole buckets are handed out instead and storage is allocated only when filled.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ddp/buckets/bucket_plan.hpp"
#include "ddp/buckets/bucket_storage.hpp"

namespace ddp::buckets {
namespace {

// Three parameters in two buckets: {0, 1} and {2}, in that order.
struct TwoBuckets {
  std::vector<at::Tensor> params{torch::zeros({2, 3}), torch::zeros({4}), torch::zeros({5})};
  BucketPlan plan;
  TwoBuckets() {
    std::vector<ParamSpec> specs;
    for (const auto& p : params) specs.push_back({"p", p.numel()});
    PlanOptions options;
    options.first_bucket_cap_bytes = 40;  // params 0 and 1 (24 + 16 bytes) close the first
    options.bucket_cap_bytes = 1 << 20;
    options.order = {0, 1, 2};
    plan = plan_buckets(specs, options);
  }
};

TEST(BucketStorage, StagedGradientsReachTheirSlotsOnlyAtTheirBucketsFill) {
  TwoBuckets t;
  ASSERT_EQ(t.plan.buckets.size(), 2u);
  BucketStorage layout(t.plan, t.params);
  const at::Tensor g0 = torch::arange(6, torch::kFloat).view({2, 3});
  const at::Tensor g1 = torch::full({4}, 7.0f);
  const at::Tensor g2 = torch::full({5}, -1.5f);
  layout.stage(0, g0);
  layout.stage(1, g1);
  layout.stage(2, g2);
  EXPECT_EQ(layout.storage(0).abs().sum().item<float>(), 0.0f);  // nothing copied yet
  layout.fill(t.plan.bucket_of[0]);
  EXPECT_TRUE(torch::equal(layout.slot(0), g0));
  EXPECT_TRUE(torch::equal(layout.slot(1), g1));
  EXPECT_EQ(layout.slot(2).abs().sum().item<float>(), 0.0f);  // the other bucket waits
  layout.fill(t.plan.bucket_of[2]);
  EXPECT_TRUE(torch::equal(layout.slot(2), g2));
  // Filled once: a second fill copies nothing (the staged lists were emptied).
  layout.slot(2).zero_();
  layout.fill(t.plan.bucket_of[2]);
  EXPECT_EQ(layout.slot(2).abs().sum().item<float>(), 0.0f);
}

TEST(BucketStorage, DroppedStagedGradientsAreNeverCopied) {
  TwoBuckets t;
  BucketStorage layout(t.plan, t.params);
  layout.stage(1, torch::ones({4}));
  layout.drop_staged();
  layout.fill(t.plan.bucket_of[1]);
  EXPECT_EQ(layout.storage(t.plan.bucket_of[1]).abs().sum().item<float>(), 0.0f);
}

// [Note: in-place reduction]: a bucket whose every gradient was staged hands them out, in
// arrival order, and its storage is never allocated; a bucket with one missing is filled instead,
// which allocates it then.
TEST(BucketStorage, InPlaceHandsOutWholeBucketsAndAllocatesOnlyWhatIsFilled) {
  TwoBuckets t;
  BucketStorageOptions options;
  options.reduce_staged_in_place = true;
  BucketStorage layout(t.plan, t.params, options);
  const size_t first = t.plan.bucket_of[0], second = t.plan.bucket_of[2];
  EXPECT_FALSE(layout.storage(first).defined());
  EXPECT_FALSE(layout.slot(0).defined());
  const at::Tensor g0 = torch::arange(6, torch::kFloat).view({2, 3});
  const at::Tensor g1 = torch::full({4}, 7.0f);
  layout.stage(1, g1);
  layout.stage(0, g0);
  const std::vector<at::Tensor> whole = layout.take_whole_staged(first);
  ASSERT_EQ(whole.size(), 2u);
  EXPECT_TRUE(whole[0].is_same(g1));  // the same tensors, in arrival order: nothing copied
  EXPECT_TRUE(whole[1].is_same(g0));
  EXPECT_FALSE(layout.storage(first).defined());
  EXPECT_TRUE(layout.take_whole_staged(first).empty());  // handed out once
  // The second bucket, with nothing staged, is not whole; its fill allocates it (zeros).
  EXPECT_TRUE(layout.take_whole_staged(second).empty());
  layout.fill(second);
  ASSERT_TRUE(layout.storage(second).defined());
  EXPECT_EQ(layout.storage(second).abs().sum().item<float>(), 0.0f);
  EXPECT_FALSE(layout.storage(first).defined());
}

TEST(BucketStorage, InPlaceFallsBackToFillForAPartOrAStridedGradient) {
  TwoBuckets t;
  BucketStorageOptions options;
  options.reduce_staged_in_place = true;
  BucketStorage layout(t.plan, t.params, options);
  const size_t first = t.plan.bucket_of[0];
  // One of two gradients: not whole, so nothing is handed out; fill copies it into its slot.
  const at::Tensor g1 = torch::full({4}, 7.0f);
  layout.stage(1, g1);
  EXPECT_TRUE(layout.take_whole_staged(first).empty());
  layout.fill(first);
  EXPECT_TRUE(torch::equal(layout.slot(1), g1));
  // Whole, but one gradient is strided (a transposed view): filled as before.
  const at::Tensor strided = torch::arange(6, torch::kFloat).view({3, 2}).t();
  ASSERT_FALSE(strided.is_contiguous());
  layout.stage(0, strided);
  layout.stage(1, g1);
  EXPECT_TRUE(layout.take_whole_staged(first).empty());
  layout.fill(first);
  EXPECT_TRUE(torch::equal(layout.slot(0), strided));
  // Without the option nothing is ever handed out.
  BucketStorage copies(t.plan, t.params);
  copies.stage(2, torch::ones({5}));
  EXPECT_TRUE(copies.take_whole_staged(t.plan.bucket_of[2]).empty());
}

}  // namespace
}  // namespace ddp::buckets
