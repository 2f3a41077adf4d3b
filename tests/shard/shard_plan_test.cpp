// The shard plan: placement per style, rows per rank under the even split rule (padding at world
// 3), unit membership (deepest unit wins, "h.1" does not claim "h.10"), the unit table, and the
// errors that name a bad policy.

#include "ddp/shard/shard_plan.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/error_text.hpp"

namespace ddp::shard {
namespace {

using ddp::testing::error_of;

// The seed test's mixed model at world 3: Linear(2000, 2000) then Linear(2000, 3).
std::vector<ParamShape> mixed() {
  return {{"fc1.weight", {2000, 2000}},
          {"fc1.bias", {2000}},
          {"fc2.weight", {3, 2000}},
          {"fc2.bias", {3}}};
}

TEST(ShardPlan, FullyShardPadsDimZeroByTheEvenSplitRule) {
  const ShardPlan plan = plan_shards(mixed(), {}, 3, DataParallelStyle::kFullyShard);
  ASSERT_EQ(plan.params.size(), 4u);
  const ParamShard& w1 = plan.params[0];
  EXPECT_TRUE(w1.sharded());
  // The layout every runtime reads: Shard(0) over {3}, rank 2 the 666 rows left after 2 x 667.
  EXPECT_EQ(w1.layout.mesh, std::vector<int64_t>{3});
  EXPECT_EQ(layout::local_shape(w1.layout, {2}), (std::vector<int64_t>{666, 2000}));
  EXPECT_EQ(w1.chunk(), 667);  // ceil(2000 / 3)
  EXPECT_EQ(w1.row_numel(), 2000);
  EXPECT_EQ(w1.rows_on(0), 667);
  EXPECT_EQ(w1.rows_on(1), 667);
  EXPECT_EQ(w1.rows_on(2), 666);
  EXPECT_EQ(w1.padding_rows(), 1);
  EXPECT_EQ(w1.local_numel(), 667 * 2000);
  const ParamShard& b2 = plan.params[3];
  EXPECT_EQ(b2.chunk(), 1);
  EXPECT_EQ(b2.padding_rows(), 0);
  // Every rank keeps the padded shards: (667 * 2000 + 667 + 1 * 2000 + 1) floats.
  EXPECT_EQ(plan.local_param_bytes(), (667 * 2000 + 667 + 2000 + 1) * 4);
  ASSERT_EQ(plan.units.size(), 1u);  // no policy: the whole model is the root unit
  EXPECT_EQ(plan.units[0].name, "");
  EXPECT_EQ(plan.units[0].local_numel, 667 * 2000 + 667 + 2000 + 1);
}

TEST(ShardPlan, FewerRowsThanRanksLeavesTheLastShardsEmpty) {
  const ShardPlan plan =
      plan_shards({{"w", {2, 5}}, {"scale", {}}}, {}, 3, DataParallelStyle::kFullyShard);
  EXPECT_EQ(plan.params[0].rows_on(0), 1);
  EXPECT_EQ(plan.params[0].rows_on(1), 1);
  EXPECT_EQ(plan.params[0].rows_on(2), 0);
  EXPECT_EQ(plan.params[0].padding_rows(), 1);
  // A 0-dim parameter has no dim 0 to shard.
  EXPECT_FALSE(plan.params[1].sharded());
  EXPECT_EQ(plan.params[1].local_numel(), 1);
}

TEST(ShardPlan, DefaultShardsWhatDividesAndReplicatesTheRest) {
  const ShardPlan plan = plan_shards(mixed(), {}, 3, DataParallelStyle::kDefault);
  EXPECT_FALSE(plan.params[0].sharded());  // 2000 % 3 == 2
  EXPECT_FALSE(plan.params[1].sharded());
  EXPECT_TRUE(plan.params[2].sharded());  // 3 rows: one each
  EXPECT_TRUE(plan.params[3].sharded());
  EXPECT_EQ(plan.params[2].local_numel(), 2000);
  EXPECT_EQ(plan.params[0].local_numel(), 2000 * 2000);
  const ShardPlan at2 = plan_shards(mixed(), {}, 2, DataParallelStyle::kDefault);
  EXPECT_TRUE(at2.params[0].sharded());
  EXPECT_FALSE(at2.params[2].sharded());  // 3 % 2 == 1
  const ShardPlan replicated = plan_shards(mixed(), {}, 3, DataParallelStyle::kReplicate);
  for (const ParamShard& s : replicated.params) EXPECT_FALSE(s.sharded());
  EXPECT_EQ(replicated.local_param_bytes(), (2000 * 2000 + 2000 + 3 * 2000 + 3) * 4);
}

TEST(ShardPlan, UnitsClaimByQualifiedPrefixDeepestFirstRootLast) {
  const std::vector<ParamShape> params = {{"wte.weight", {10, 4}}, {"h.0.attn.w", {4, 4}},
                                          {"h.0.mlp.w", {4, 4}},   {"h.1.attn.w", {4, 4}},
                                          {"h.10.attn.w", {4, 4}}, {"ln_f.weight", {4}}};
  const ShardPlan plan =
      plan_shards(params, {"h.1", "h.0", "h.0.attn"}, 2, DataParallelStyle::kFullyShard);
  ASSERT_EQ(plan.units.size(), 4u);
  // Ordered by first parameter: h.0.attn (param 1), h.0 (param 2), h.1 (param 3), root.
  EXPECT_EQ(plan.units[0].name, "h.0.attn");
  EXPECT_EQ(plan.units[0].params, std::vector<size_t>{1});
  EXPECT_EQ(plan.units[1].name, "h.0");
  EXPECT_EQ(plan.units[1].params, std::vector<size_t>{2});
  EXPECT_EQ(plan.units[2].name, "h.1");
  EXPECT_EQ(plan.units[2].params, std::vector<size_t>{3});  // not h.10.attn.w
  EXPECT_EQ(plan.units[3].name, "");
  EXPECT_EQ(plan.units[3].params, (std::vector<size_t>{0, 4, 5}));
  EXPECT_EQ(plan.params[4].unit, 3u);
  EXPECT_EQ(plan.units[3].local_numel, 5 * 4 + 2 * 4 + 2);
}

TEST(ShardPlan, TheUnitTableShowsPlacementPaddingAndBytes) {
  const ShardPlan plan = plan_shards({{"fc.weight", {3, 2}}, {"fc.bias", {3}}, {"out.w", {4, 2}}},
                                     {"fc"}, 2, DataParallelStyle::kDefault);
  EXPECT_EQ(format_unit_table(plan),
            "Data-parallel units (default, world 2, 2 units)\n"
            "+--------+-------------+--------+-----------+----------------------+\n"
            "| Unit   | Param Names | Shape  | Style     | Shard bytes per rank |\n"
            "+--------+-------------+--------+-----------+----------------------+\n"
            "| fc     | fc.weight   | [3, 2] | replicate |                   24 |\n"
            "|        | fc.bias     | [3]    | replicate |                   12 |\n"
            "| <root> | out.w       | [4, 2] | shard     |                   16 |\n"
            "+--------+-------------+--------+-----------+----------------------+\n");
  const ShardPlan padded =
      plan_shards({{"fc.weight", {3, 2}}}, {}, 2, DataParallelStyle::kFullyShard);
  EXPECT_NE(format_unit_table(padded).find("| shard (+1 pad rows) |"), std::string::npos)
      << format_unit_table(padded);
}

TEST(ShardPlan, BadPoliciesAndStylesAreNamed) {
  EXPECT_EQ(error_of([] { plan_shards(mixed(), {"fc9"}, 2, DataParallelStyle::kFullyShard); }),
            "ddp: unit 'fc9' holds no parameter: no parameter name starts with 'fc9.'");
  EXPECT_EQ(error_of([] {
              plan_shards(mixed(), {"fc1", "fc1"}, 2, DataParallelStyle::kDefault);
            }),
            "ddp: unit 'fc1' is listed twice");
  EXPECT_EQ(error_of([] { plan_shards(mixed(), {}, 0, DataParallelStyle::kDefault); }),
            "ddp: plan_shards: world size 0 must be at least 1");
  EXPECT_EQ(error_of([] { parse_style("zero3"); }),
            "ddp: unknown data-parallel style 'zero3'; the styles are replicate, fully_shard, "
            "default");
  EXPECT_EQ(parse_style("fully_shard"), DataParallelStyle::kFullyShard);
  EXPECT_STREQ(style_name(DataParallelStyle::kDefault), "default");
}

}  // namespace
}  // namespace ddp::shard
