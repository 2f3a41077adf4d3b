#pragma once
// The bucket table as the dynamo DDPOptimizer prints it: Index, Size (b), Param Names.

#include <string>
#include <vector>

#include "ddp/buckets/bucket_plan.hpp"

namespace ddp::buckets {

// One row per parameter; a bucket's index and size are on its first row.
std::string format_bucket_table(const BucketPlan& plan, const std::vector<ParamSpec>& params);

// The boxed text table the bucket table prints, in DDPOptimizer's tabulate layout; the unit table
// (shard/) prints through it too:
//   +-------+----------+-------------+
//   | Index | Size (b) | Param Names |
//   +-------+----------+-------------+
//   |     0 |     4096 | fc4.weight  |
//   +-------+----------+-------------+
// `header` and every row have one cell per column; a column whose `right_aligned` entry is true
// (numbers) is padded on the left, the others on the right. Ends with a newline.
std::string format_text_table(const std::vector<std::string>& header,
                              const std::vector<std::vector<std::string>>& rows,
                              const std::vector<bool>& right_aligned);

}  // namespace ddp::buckets
