// The one options model: describe() reaches every nested field, and docs/options.md lists each
// field under its dotted name with its default value.

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "ddp/optim/lr_schedule.hpp"
#include "ddp/parallel/ddp_options.hpp"
#include "ddp/shard/shard_options.hpp"

namespace ddp::testing {
namespace {

TEST(Options, DescribeReachesNestedFields) {
  parallel::DDPOptions options;
  options.gradients.static_graph = true;
  options.gradients.buckets.bucket_cap_bytes = 12345;
  options.params_to_ignore = {"a.weight", "b"};
  std::map<std::string, std::string> d;
  for (const auto& [name, value] : parallel::describe(options)) {
    EXPECT_TRUE(d.emplace(name, value).second) << "duplicate option name " << name;
  }
  EXPECT_EQ(d.size(), 13u);
  EXPECT_EQ(d.at("check_replicas_every"), "0");
  EXPECT_EQ(d.at("gradients.static_graph"), "true");
  EXPECT_EQ(d.at("gradients.find_unused_parameters"), "false");
  EXPECT_EQ(d.at("gradients.buckets.bucket_cap_bytes"), "12345");
  EXPECT_EQ(d.at("gradients.buckets.first_bucket_cap_bytes"), "1048576");
  EXPECT_EQ(d.at("params_to_ignore"), "[a.weight,b]");
  EXPECT_EQ(d.at("stats_every"), "100");
}

// Every (name, default) of `options` is a row of docs/options.md: | `name` | <default> ...
void expect_docs_list(const std::vector<std::pair<std::string, std::string>>& options) {
  std::ifstream file(std::string(DDP_SOURCE_DIR) + "/docs/options.md");
  ASSERT_TRUE(file) << "cannot read docs/options.md";
  std::stringstream text;
  text << file.rdbuf();
  const std::string docs = text.str();
  for (const auto& [name, value] : options) {
    const std::string row = "| `" + name + "` | " + value;
    EXPECT_NE(docs.find(row), std::string::npos)
        << "docs/options.md has no row starting '" << row << "' (option " << name << ", default "
        << value << ")";
  }
}

TEST(Options, DocsListEveryOption) { expect_docs_list(parallel::describe(parallel::DDPOptions{})); }

TEST(Options, ShardOptionsDescribeReachesNestedFields) {
  shard::ShardOptions options;
  options.units = {"h.0", "h.1"};
  options.param_dtype = c10::kBFloat16;
  options.replicated.buckets.bucket_cap_bytes = 7;
  std::vector<std::pair<std::string, std::string>> out;
  shard::describe(options, "shard.", out);
  std::map<std::string, std::string> d(out.begin(), out.end());
  EXPECT_EQ(d.size(), out.size()) << "duplicate option names";
  EXPECT_EQ(d.size(), 16u);
  EXPECT_EQ(d.at("shard.style"), "fully_shard");
  EXPECT_EQ(d.at("shard.units"), "[h.0,h.1]");
  EXPECT_EQ(d.at("shard.param_dtype"), "BFloat16");
  EXPECT_EQ(d.at("shard.reduce_dtype"), "none");
  EXPECT_EQ(d.at("shard.broadcast_buffers"), "true");
  EXPECT_EQ(d.at("shard.stats_every"), "100");
  EXPECT_EQ(d.at("shard.verbose"), "false");
  EXPECT_EQ(d.at("shard.replicated.buckets.bucket_cap_bytes"), "7");
}

TEST(Options, DocsListEveryLrScheduleOption) {
  expect_docs_list(optim::describe(optim::LrScheduleOptions{}));
}

TEST(Options, DocsListEveryShardOption) {
  std::vector<std::pair<std::string, std::string>> out;
  shard::describe(shard::ShardOptions{}, "", out);
  expect_docs_list(out);
}

}  // namespace
}  // namespace ddp::testing
