#include "ddp/buckets/bucket_table.hpp"

#include <algorithm>
#include <sstream>

namespace ddp::buckets {

std::string format_bucket_table(const BucketPlan& plan, const std::vector<ParamSpec>& params) {
  struct Row {
    std::string index, size, name;
  };
  std::vector<Row> rows;
  for (size_t b = 0; b < plan.buckets.size(); ++b) {
    const Bucket& bucket = plan.buckets[b];
    if (bucket.params.empty()) continue;
    for (size_t i = 0; i < bucket.params.size(); ++i) {
      rows.push_back({i == 0 ? std::to_string(b) : "", i == 0 ? std::to_string(bucket.bytes) : "",
                      params[bucket.params[i]].name});
    }
  }
  const Row header{"Index", "Size (b)", "Param Names"};
  size_t w0 = header.index.size(), w1 = header.size.size(), w2 = header.name.size();
  for (const Row& r : rows) {
    w0 = std::max(w0, r.index.size());
    w1 = std::max(w1, r.size.size());
    w2 = std::max(w2, r.name.size());
  }
  std::ostringstream out;
  auto rule = [&] {
    out << '+' << std::string(w0 + 2, '-') << '+' << std::string(w1 + 2, '-') << '+'
        << std::string(w2 + 2, '-') << "+\n";
  };
  // Numbers right-aligned, names left-aligned, as DDPOptimizer's tabulate output.
  auto line = [&](const Row& r) {
    out << "| " << std::string(w0 - r.index.size(), ' ') << r.index << " | "
        << std::string(w1 - r.size.size(), ' ') << r.size << " | " << r.name
        << std::string(w2 - r.name.size(), ' ') << " |\n";
  };
  out << "DDP bucket assignment (" << plan.buckets.size() << " buckets)\n";
  rule();
  line(header);
  rule();
  for (const Row& r : rows) line(r);
  rule();
  return out.str();
}

}  // namespace ddp::buckets
