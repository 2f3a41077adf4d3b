// Uses a pure part of the installed API, so the check needs no process group.
#include <ddp/buckets/bucket_plan.hpp>

#include <cstdio>

int main() {
  std::vector<ddp::buckets::ParamSpec> specs(3);
  for (auto& s : specs) s.numel = 10;
  const auto plan = ddp::buckets::plan_buckets(specs, {});
  std::printf("consumer: %zu bucket(s)\n", plan.buckets.size());
  return plan.buckets.size() == 1 ? 0 : 1;
}
