#include "ddp/buckets/bucket_table.hpp"

#include <algorithm>
#include <sstream>
#include <stdexcept>

namespace ddp::buckets {

std::string format_text_table(const std::vector<std::string>& header,
                              const std::vector<std::vector<std::string>>& rows,
                              const std::vector<bool>& right_aligned) {
  const size_t columns = header.size();
  if (right_aligned.size() != columns) {
    throw std::invalid_argument("format_text_table: one alignment per column");
  }
  std::vector<size_t> width(columns);
  for (size_t c = 0; c < columns; ++c) width[c] = header[c].size();
  for (const auto& row : rows) {
    if (row.size() != columns) throw std::invalid_argument("format_text_table: ragged row");
    for (size_t c = 0; c < columns; ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::ostringstream out;
  const auto rule = [&] {
    for (size_t c = 0; c < columns; ++c) out << '+' << std::string(width[c] + 2, '-');
    out << "+\n";
  };
  const auto line = [&](const std::vector<std::string>& cells) {
    for (size_t c = 0; c < columns; ++c) {
      const std::string pad(width[c] - cells[c].size(), ' ');
      out << "| " << (right_aligned[c] ? pad + cells[c] : cells[c] + pad) << ' ';
    }
    out << "|\n";
  };
  rule();
  line(header);
  rule();
  for (const auto& row : rows) line(row);
  rule();
  return out.str();
}

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
         format_text_table({"Index", "Size (b)", "Param Names"}, rows, {true, true, false});
}

}  // namespace ddp::buckets
