// The public line (docs/api.md): every short name the umbrella header ddp/ddp.hpp gives in
// namespace ddp (its own using-declarations and those of the headers it includes) appears in
// docs/api.md as `ddp::Name`, so the page lists every entry point; and the one entry point's
// refusal of a style set twice, by exact text.

#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "ddp/parallel/data_parallel.hpp"

namespace ddp::testing {
namespace {

std::string read(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// The names of `using a::b::Name;` inside `namespace ddp { ... }` blocks of `header`.
std::set<std::string> short_names(const std::string& header) {
  std::set<std::string> names;
  const std::regex block(R"(\nnamespace ddp \{([^}]*)\})");
  const std::regex using_decl(R"(using [A-Za-z_:]+::([A-Za-z_0-9]+);)");
  for (std::sregex_iterator b(header.begin(), header.end(), block), end; b != end; ++b) {
    const std::string body = (*b)[1];
    for (std::sregex_iterator u(body.begin(), body.end(), using_decl); u != end; ++u) {
      names.insert((*u)[1]);
    }
  }
  return names;
}

TEST(PublicApi, DocsNameEveryShortName) {
  const std::string root = DDP_SOURCE_DIR;
  const std::string umbrella = read(root + "/include/ddp/ddp.hpp");
  std::set<std::string> names = short_names(umbrella);
  const std::regex include("#include \"(ddp/[^\"]+)\"");
  for (std::sregex_iterator i(umbrella.begin(), umbrella.end(), include), end; i != end; ++i) {
    for (const std::string& name : short_names(read(root + "/include/" + std::string((*i)[1])))) {
      names.insert(name);
    }
  }
  // The umbrella's own list and the wrappers' (data_parallel, DistributedDataParallel, ...).
  EXPECT_GE(names.size(), 40u);
  for (const char* known :
       {"data_parallel", "DistributedDataParallel", "clip_grad_norm", "AdamW"}) {
    EXPECT_EQ(names.count(known), 1u) << known << " not found: the parse missed it";
  }
  const std::string api = read(root + "/docs/api.md");
  for (const std::string& name : names) {
    EXPECT_NE(api.find("ddp::" + name), std::string::npos)
        << "docs/api.md does not name ddp::" << name << ", a short name of ddp/ddp.hpp";
  }
}

TEST(PublicApi, AStyleSetTwiceIsRefusedByName) {
  using parallel::style_conflict;
  EXPECT_EQ(style_conflict(DataParallelStyle::kFullyShard, DataParallelStyle::kDefault),
            "ddp::data_parallel: DataParallelOptions::shard.style is default but the style "
            "argument is fully_shard: the argument decides; leave shard.style at its default");
  EXPECT_EQ(style_conflict(DataParallelStyle::kReplicate, DataParallelStyle::kDefault),
            "ddp::data_parallel: DataParallelOptions::shard.style is default but the style "
            "argument is replicate: the argument decides; leave shard.style at its default");
  EXPECT_EQ(style_conflict(DataParallelStyle::kDefault, DataParallelStyle::kDefault), "");
  EXPECT_EQ(style_conflict(DataParallelStyle::kDefault, DataParallelStyle::kFullyShard), "");
}

// Issue 59: a configuration that cannot apply is refused at construction, never ignored.
TEST(PublicApi, AGatherSettingUnderReplicateIsRefusedByName) {
  using parallel::gather_setting_conflict;
  shard::ShardOptions bf16_gathers;
  bf16_gathers.param_dtype = torch::kBFloat16;
  shard::ShardOptions fp32_reduce;
  fp32_reduce.reduce_dtype = torch::kFloat;
  const std::string why =
      " is set but the style is replicate, which gathers and reduce-scatters nothing (every rank "
      "holds the parameters whole): for bf16 compute use autocast, for bf16 all-reduces a bf16 "
      "comm hook, or choose a sharded style";
  EXPECT_EQ(gather_setting_conflict(DataParallelStyle::kReplicate, bf16_gathers),
            "ddp::data_parallel: DataParallelOptions::shard.param_dtype" + why);
  EXPECT_EQ(gather_setting_conflict(DataParallelStyle::kReplicate, fp32_reduce),
            "ddp::data_parallel: DataParallelOptions::shard.reduce_dtype" + why);
  EXPECT_EQ(gather_setting_conflict(DataParallelStyle::kReplicate, shard::ShardOptions{}), "");
  EXPECT_EQ(gather_setting_conflict(DataParallelStyle::kFullyShard, bf16_gathers), "");
  EXPECT_EQ(gather_setting_conflict(DataParallelStyle::kDefault, fp32_reduce), "");
}

}  // namespace
}  // namespace ddp::testing
