// Uses a pure part of the installed API, so the check needs no process group; includes the
// umbrella header, so every public entry point must compile from an install, and names two of
// its short spellings.
#include <ddp/buckets/bucket_plan.hpp>
#include <ddp/ddp.hpp>

#include <cstdio>
#include <type_traits>

int main() {
  static_assert(std::is_same_v<ddp::DataParallelStyle, ddp::shard::DataParallelStyle>);
  static_assert(std::is_same_v<ddp::ShardOptions, ddp::shard::ShardOptions>);
  std::vector<ddp::buckets::ParamSpec> specs(3);
  for (auto& s : specs) s.numel = 10;
  const auto plan = ddp::buckets::plan_buckets(specs, {});
  std::printf("consumer: %zu bucket(s)\n", plan.buckets.size());
  return plan.buckets.size() == 1 ? 0 : 1;
}
