#pragma once
// BucketPlan: which parameters' gradients travel together. A pure function of the parameter list,
// caps and order, so it is unit-tested alone and every rank computes the same plan from the same
// (verified identical) model.

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ddp::buckets {

// What the planner needs to know of one parameter.
struct ParamSpec {
  std::string name;  // qualified name, e.g. "fc1.weight"; only for tables and errors
  int64_t numel = 0;
  c10::ScalarType dtype = c10::ScalarType::Float;
  c10::Device device = c10::Device(c10::kCPU);
  bool sparse = false;  // a sparse gradient is reduced alone (it cannot live in a flat buffer)
};

constexpr size_t kMiB = size_t{1} << 20;

struct PlanOptions {
  // Cap of the first bucket of each (dtype, device): default 1 MiB, as PyTorch. The first bucket
  // holds the gradients ready first; keeping it small starts communication early in backward.
  size_t first_bucket_cap_bytes = 1 * kMiB;
  // Cap of every later bucket: default 25 MiB, as PyTorch. Large enough that per-collective
  // latency is amortized, small enough that the last bucket's exposed communication is short.
  size_t bucket_cap_bytes = 25 * kMiB;
  // Parameter indices in the order their gradients are expected to become ready. Empty means
  // reverse registration order (PyTorch's guess before it has observed an iteration). Must be a
  // permutation of 0..n-1 otherwise.
  std::vector<size_t> order;
};

// How a bucket is reduced; chosen per bucket, so that one gradient path serves every style.
enum class Reduction {
  kAllReduce,      // every rank gets the whole average (REPLICATE, DDP; DEFAULT's replicated)
  kReduceScatter,  // rank r gets row r of the average, the buffer seen as (world, numel / world)
                   // (a FULLY_SHARD unit; dense buckets only)
};

struct Bucket {
  std::vector<size_t> params;    // parameter indices, in the order they are laid out in the buffer
  std::vector<int64_t> offsets;  // element offset of each parameter in the flat buffer
  // Each parameter's elements from its offset (what a comm hook sees as GradBucket::lengths):
  // its numel, or under kReduceScatter its columns in one rank's row.
  std::vector<int64_t> lengths;
  int64_t numel = 0;  // total elements in the flat buffer
  size_t bytes = 0;   // numel * element size
  c10::ScalarType dtype = c10::ScalarType::Float;
  c10::Device device = c10::Device(c10::kCPU);
  bool sparse = false;
  Reduction reduction = Reduction::kAllReduce;
  // kReduceScatter: the unit index of the unit this bucket reduces, the number the flight
  // recorder gives its collectives (the same as the unit's gathers), whatever the bucket's
  // position in the plan.
  size_t unit = 0;
};

struct BucketPlan {
  // Buckets in launch order: bucket i is reduced before bucket i+1 on every rank.
  std::vector<Bucket> buckets;
  // For parameter p: bucket_of[p] and position_in_bucket[p] locate it. Every parameter is in
  // exactly one bucket.
  std::vector<size_t> bucket_of;
  std::vector<size_t> position_in_bucket;
};

// Walks `order`; each (dtype, device) has one open bucket; a parameter joins its open bucket, and
// the bucket closes once its bytes reach the cap (so the parameter that crosses the cap stays in
// it, as PyTorch does). The first bucket of each (dtype, device) uses first_bucket_cap_bytes.
// Sparse parameters get a bucket each. Buckets are ordered by the position of their first
// parameter in `order`.
BucketPlan plan_buckets(const std::vector<ParamSpec>& params, const PlanOptions& options);

// (name, value) for the caps (the order is the reducer's business, not an option), names prefixed
// with `prefix`.
void describe(const PlanOptions& options, const std::string& prefix,
              std::vector<std::pair<std::string, std::string>>& out);

// `mib` MiB in bytes (fractions allowed: tests use caps of a few KB); must be positive.
size_t mib_bytes(double mib);

// The order plan_buckets uses when PlanOptions::order is empty: n-1, ..., 0.
std::vector<size_t> reverse_registration_order(size_t n);

// `partial` made a permutation of 0..n-1: its first occurrences of valid indices, then the
// missing ones in reverse index order (as PyTorch's rebuild places unused parameters).
std::vector<size_t> complete_order(const std::vector<size_t>& partial, size_t n);

}  // namespace ddp::buckets
