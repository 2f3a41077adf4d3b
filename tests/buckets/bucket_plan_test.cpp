#include <gtest/gtest.h>

#include "ddp/buckets/bucket_plan.hpp"
#include "ddp/buckets/bucket_table.hpp"
#include "ddp/models/net.hpp"

namespace ddp::buckets {
namespace {

std::vector<ParamSpec> specs_of(torch::nn::Module& m) {
  std::vector<ParamSpec> specs;
  for (const auto& item : m.named_parameters()) {
    specs.push_back({item.key(), item.value().numel(), item.value().scalar_type(),
                     item.value().device(), false});
  }
  return specs;
}

std::vector<std::vector<std::string>> bucket_names(const BucketPlan& plan,
                                                   const std::vector<ParamSpec>& specs) {
  std::vector<std::vector<std::string>> out;
  for (const auto& b : plan.buckets) {
    out.emplace_back();
    for (size_t p : b.params) out.back().push_back(specs[p].name);
  }
  return out;
}

std::vector<ParamSpec> floats(std::vector<int64_t> numels) {
  std::vector<ParamSpec> specs;
  for (size_t i = 0; i < numels.size(); ++i) {
    specs.push_back(
        {"p" + std::to_string(i), numels[i], c10::kFloat, c10::Device(c10::kCPU), false});
  }
  return specs;
}

TEST(BucketPlan, SeedNetGetsThreeBucketsWithDefaultCaps) {
  models::Net net(2000);
  const auto specs = specs_of(*net);
  const BucketPlan plan = plan_buckets(specs, PlanOptions{});
  using V = std::vector<std::string>;
  EXPECT_EQ(bucket_names(plan, specs),
            (std::vector<V>{V{"fc4.bias", "fc4.weight"},
                            V{"fc3.bias", "fc3.weight", "fc2.bias", "fc2.weight"},
                            V{"fc1.bias", "fc1.weight"}}));
  // Closed form: a Linear(2000, 2000) holds (2000*2000 + 2000) floats.
  const size_t layer = (2000 * 2000 + 2000) * 4;
  EXPECT_EQ(plan.buckets[0].bytes, layer);
  EXPECT_EQ(plan.buckets[1].bytes, 2 * layer);
  EXPECT_EQ(plan.buckets[2].bytes, layer);
  EXPECT_EQ(plan.buckets[1].offsets, (std::vector<int64_t>{0, 2000, 2000 + 4000000, 4004000}));
}

TEST(BucketPlan, TableListsEveryParameterUnderItsBucket) {
  models::Net net(2000);
  const auto specs = specs_of(*net);
  const std::string table = format_bucket_table(plan_buckets(specs, PlanOptions{}), specs);
  EXPECT_NE(table.find("| Index | Size (b) | Param Names |"), std::string::npos) << table;
  EXPECT_NE(table.find("|     0 | 16008000 | fc4.bias    |"), std::string::npos) << table;
  EXPECT_NE(table.find("|     1 | 32016000 | fc3.bias    |"), std::string::npos) << table;
  EXPECT_NE(table.find("|       |          | fc2.weight  |"), std::string::npos) << table;
  EXPECT_LT(table.find("fc4.weight"), table.find("fc3.bias"));
}

TEST(BucketPlan, TinyCapsGiveOneBucketPerParameter) {
  const auto specs = floats({3, 5, 7, 11});
  PlanOptions opts;
  opts.first_bucket_cap_bytes = 1;
  opts.bucket_cap_bytes = 1;
  const BucketPlan plan = plan_buckets(specs, opts);
  ASSERT_EQ(plan.buckets.size(), 4u);
  for (size_t b = 0; b < 4; ++b) {
    EXPECT_EQ(plan.buckets[b].params, std::vector<size_t>{3 - b});  // reverse registration
    EXPECT_EQ(plan.bucket_of[3 - b], b);
  }
}

TEST(BucketPlan, FirstBucketCapIsHonouredThenTheLaterCap) {
  // Ten parameters of 100 floats (400 B). First cap 1000 B: closes after 3 (1200 B); later cap
  // 2000 B: closes after 5 (2000 B); the last 2 remain together.
  const auto specs = floats(std::vector<int64_t>(10, 100));
  PlanOptions opts;
  opts.first_bucket_cap_bytes = 1000;
  opts.bucket_cap_bytes = 2000;
  const BucketPlan plan = plan_buckets(specs, opts);
  ASSERT_EQ(plan.buckets.size(), 3u);
  EXPECT_EQ(plan.buckets[0].params, (std::vector<size_t>{9, 8, 7}));
  EXPECT_EQ(plan.buckets[1].params, (std::vector<size_t>{6, 5, 4, 3, 2}));
  EXPECT_EQ(plan.buckets[2].params, (std::vector<size_t>{1, 0}));
  EXPECT_EQ(plan.buckets[0].bytes, 1200u);
  EXPECT_EQ(plan.buckets[1].bytes, 2000u);
}

TEST(BucketPlan, TheTensorThatCrossesTheCapStaysInTheBucket) {
  const auto specs = floats({1000, 10});  // order: p1 (40 B), p0 (4000 B) crosses a 100 B cap
  PlanOptions opts;
  opts.first_bucket_cap_bytes = 100;
  const BucketPlan plan = plan_buckets(specs, opts);
  ASSERT_EQ(plan.buckets.size(), 1u);
  EXPECT_EQ(plan.buckets[0].params, (std::vector<size_t>{1, 0}));
}

TEST(BucketPlan, MixedDtypesAreSplit) {
  auto specs = floats({10, 10, 10, 10});
  specs[1].dtype = c10::kDouble;
  specs[3].dtype = c10::kDouble;
  const BucketPlan plan = plan_buckets(specs, PlanOptions{});
  ASSERT_EQ(plan.buckets.size(), 2u);
  // Ordered by the first parameter of each in the (reverse) order: p3 (double) comes first.
  EXPECT_EQ(plan.buckets[0].params, (std::vector<size_t>{3, 1}));
  EXPECT_EQ(plan.buckets[0].dtype, c10::kDouble);
  EXPECT_EQ(plan.buckets[0].bytes, 160u);
  EXPECT_EQ(plan.buckets[1].params, (std::vector<size_t>{2, 0}));
  EXPECT_EQ(plan.buckets[1].dtype, c10::kFloat);
}

TEST(BucketPlan, SparseParameterGetsABucketOfItsOwn) {
  auto specs = floats({10, 10, 10});
  specs[1].sparse = true;
  const BucketPlan plan = plan_buckets(specs, PlanOptions{});
  ASSERT_EQ(plan.buckets.size(), 2u);
  EXPECT_EQ(plan.buckets[0].params, (std::vector<size_t>{2, 0}));
  EXPECT_EQ(plan.buckets[1].params, std::vector<size_t>{1});
  EXPECT_TRUE(plan.buckets[1].sparse);
}

TEST(BucketPlan, GivenOrderIsFollowed) {
  const auto specs = floats({10, 10, 10});
  PlanOptions opts;
  opts.first_bucket_cap_bytes = 1;
  opts.order = {1, 2, 0};
  const BucketPlan plan = plan_buckets(specs, opts);
  ASSERT_EQ(plan.buckets.size(), 2u);
  EXPECT_EQ(plan.buckets[0].params, std::vector<size_t>{1});
  EXPECT_EQ(plan.buckets[1].params, (std::vector<size_t>{2, 0}));
}

TEST(BucketPlan, BadOrderIsRefusedWithTheReason) {
  const auto specs = floats({10, 10, 10});
  PlanOptions opts;
  opts.order = {0, 0, 1};
  try {
    plan_buckets(specs, opts);
    FAIL() << "a repeated index must be refused";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("bucket order is not a permutation: index 0 repeats"),
              std::string::npos)
        << e.what();
  }
}

TEST(BucketPlan, EmptyModelHasNoBuckets) {
  const BucketPlan plan = plan_buckets({}, PlanOptions{});
  EXPECT_TRUE(plan.buckets.empty());
  EXPECT_TRUE(plan.bucket_of.empty());
  EXPECT_NE(format_bucket_table(plan, {}).find("(0 buckets)"), std::string::npos);
}

}  // namespace
}  // namespace ddp::buckets
