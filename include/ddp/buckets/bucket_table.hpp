#pragma once
// The bucket table as the dynamo DDPOptimizer prints it: Index, Size (b), Param Names.

#include <string>
#include <vector>

#include "ddp/buckets/bucket_plan.hpp"

namespace ddp::buckets {

// One row per parameter; a bucket's index and size are on its first row.
std::string format_bucket_table(const BucketPlan& plan, const std::vector<ParamSpec>& params);

}  // namespace ddp::buckets
