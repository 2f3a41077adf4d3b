#include "ddp/buckets/bucket_table.hpp"

#include "ddp/obs/text_table.hpp"

namespace ddp::buckets {

std::string format_bucket_table(const BucketPlan& plan, const std::vector<ParamSpec>& params) {
  std::vector<std::vector<std::string>> rows;
  for (size_t b = 0; b < plan.buckets.size(); ++b) {
    const Bucket& bucket = plan.buckets[b];
    for (size_t i = 0; i < bucket.params.size(); ++i) {
      rows.push_back({i == 0 ? std::to_string(b) : "", i == 0 ? std::to_string(bucket.bytes) : "",
                      params[bucket.params[i]].name});
    }
  }
  // Numbers right-aligned, names left-aligned, as DDPOptimizer's tabulate output.
  return "DDP bucket assignment (" + std::to_string(plan.buckets.size()) + " buckets)\n" +
         obs::format_text_table({"Index", "Size (b)", "Param Names"}, rows, {true, true, false});
}

}  // namespace ddp::buckets
